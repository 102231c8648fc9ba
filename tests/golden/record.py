"""Record the golden outputs that tests/test_golden.py holds the cost model to.

    python tests/golden/record.py            # rewrite tests/golden/*.json.gz from the current code

The goldens pin every figure `advisor plan --json` prints for the searches below and every prediction
`advisor validate` makes (each compared row's value and time breakdown), so that a change meant to move
no number (a refactor) can be shown to move none. Re-record only when a change moves numbers on purpose,
and say in its commit which ones and why.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# Varied searches: one node and many, every plan kind (DDP, ZeRO 1-3, HSDP, nn.DataParallel, TP, PP, 3D),
# both kernel styles, fast and slow links, the objectives, a search where nothing fits.
SEARCHES = {
    "gpt2xl-dgx-a100": ["--model", "gpt2-xl", "--hw", "dgx-a100"],
    "gpt2-titan-pcie": ["--model", "gpt2", "--hw", "titan-rtx-pcie", "--gpus", "2", "--seq", "512"],
    "gpt2large-titan-nvlink": ["--model", "gpt2-large", "--hw", "titan-rtx-nvlink", "--gpus", "2"],
    "llama2-7b-dgx-a100-seq4096": ["--model", "llama2-7b", "--hw", "dgx-a100", "--gpus", "8", "--seq", "4096"],
    "llama3-8b-dgx-h100-2nodes": ["--model", "llama3-8b", "--hw", "dgx-h100", "--nodes", "2", "--seq", "8192"],
    "gpt3-dgx-a100-1536": ["--model", "gpt3-175b", "--hw", "dgx-a100", "--gpus", "1536", "--global-batch", "1536",
                           "--seq", "2048"],
    "llama2-13b-p4d-4nodes": ["--model", "llama2-13b", "--hw", "aws-p4d", "--nodes", "4", "--seq", "4096"],
    "llama3-70b-b200-4nodes": ["--model", "llama3-70b", "--hw", "aws-p6-b200", "--nodes", "4"],
    "bloom-h100-384": ["--model", "bloom-176b", "--hw", "dgx-h100", "--gpus", "384", "--seq", "2048",
                       "--global-batch", "1536"],
    "gpt2medium-h100-fp32-eager-memory": ["--model", "gpt2-medium", "--hw", "dgx-h100", "--precision", "fp32",
                                          "--attention", "eager", "--objective", "memory"],
    "llama2-70b-a3mega-fp8": ["--model", "llama2-70b", "--hw", "gcp-a3-mega", "--nodes", "8", "--precision",
                              "fp8-mixed", "--seq", "4096"],
    "gpt2xl-dgx-a100-megatron": ["--model", "gpt2-xl", "--hw", "dgx-a100", "--stack", "megatron-deepspeed"],
    "llama3-8b-h200-hf-sgd": ["--model", "llama3-8b", "--hw", "dgx-h200", "--stack", "hf-trainer", "--optimizer", "sgd",
                              "--seq", "2048"],
    "gpt2-dgx-a100-1gpu": ["--model", "gpt2", "--hw", "dgx-a100", "--gpus", "1"],
    "gpt2large-p4d-2nodes-cost": ["--model", "gpt2-large", "--hw", "aws-p4d", "--nodes", "2", "--objective", "cost"],
    "llama3-405b-dgx-a100-8-nofit": ["--model", "llama3-405b", "--hw", "dgx-a100", "--gpus", "8"],
}
TOP = "20"


def run_cli(args: list[str]) -> dict:
    from click.testing import CliRunner

    from advisor.cli import cli

    res = CliRunner().invoke(cli, ["plan", *args, "--top", TOP, "--json"], catch_exceptions=False)
    return json.loads(res.stdout.strip().split("\n\n")[0] if res.stdout.strip() else "{}")


def plan_goldens() -> dict:
    return {name: run_cli(args) for name, args in SEARCHES.items()}


def validate_golden(report=None) -> dict:
    """Every prediction of a validation run (``report``: an existing ``validation.validate.run()``, else a new one)."""
    from validation.validate import run

    report = report if report is not None else run(None)
    out = {}
    for d in report.datasets:
        dump = d.model_dump(mode="json")
        dump["points"] = [[p.label, p.predicted, p.breakdown] for p in d.points]
        dump["secondary"] = {k: [[p.label, p.predicted] for p in v] for k, v in d.secondary.items()}
        out[d.name] = dump
    return out


def main() -> None:
    sys.path.insert(0, str(ROOT))
    for name, doc in (("plan", plan_goldens()), ("validate", validate_golden())):
        path = HERE / f"{name}.json.gz"
        # mtime=0: the same figures give the same bytes, so a re-record that moves nothing changes no file
        path.write_bytes(gzip.compress((json.dumps(doc, sort_keys=True) + "\n").encode(), mtime=0))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
