"""`advisor calibrate` for real: local gloo workers on CPU, sweep, fit, profile, load it back."""

import os
import subprocess
import tempfile
import sys
from pathlib import Path

import numpy as np
import pytest

from advisor.calibrate import collective_points, read_results
from advisor.comm import link_time
from advisor.hardware import load_hardware

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent


def _run(args, timeout=120):
    return subprocess.run([sys.executable, "-m", "advisor.cli_calibrate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("nproc,iters", [(2, 15), (4, 8)])
def test_gloo_sweep_fit_and_profile(tmp_path, nproc, iters):
    for attempt in (1, 2):  # timings of processes sharing two vCPUs: a sweep a time slice spoilt is measured again
        out = tmp_path / f"try{attempt}" / f"cpu{nproc}.yaml"
        out.parent.mkdir()
        if _sweep_agrees(out, nproc, iters) or attempt == 2:
            break
    assert _sweep_agrees(out, nproc, iters, check=True)
    # a rerun with the same --out resumes: nothing left to measure, refits, same row count
    before = len(out.with_suffix(".jsonl").read_text().splitlines())
    res2 = _run(["--backend", "gloo", "--nproc", str(nproc), "--sizes", "1K:1M", "--out", str(out)])
    assert res2.returncode == 0 and "resuming" in res2.stderr
    assert len(out.with_suffix(".jsonl").read_text().splitlines()) == before


def _sweep_agrees(out: Path, nproc: int, iters: int, check: bool = False) -> bool:
    """Sweep into ``out`` (unless it is there: ``check`` asserts on the sweep already made), check what it wrote, and
    whether the fitted link agrees with the all-reduce medians it was fitted to (the comment below)."""
    if not out.exists():
        res = _run(["--backend", "gloo", "--nproc", str(nproc), "--sizes", "1K:1M", "--iters", str(iters),
                    "--warmup", "2", "--out", str(out)])
        assert res.returncode == 0, res.stderr[-2000:]
        assert "describe this CPU machine" in res.stderr and "inter-node link: not measured (one node" in res.stdout
        assert "intra-node overlap: a GEMM loop ends" in res.stdout and "nccl_channels kept from the base" in res.stdout
        if not check:
            return _agrees(out, nproc)
    return _agrees(out, nproc, strict=check)


def _agrees(out: Path, nproc: int, strict: bool = False) -> bool:
    """What the sweep wrote into ``out`` is whole (asserted), and whether its fitted link agrees with the all-reduce
    medians it was fitted to (``strict``: asserted, with the points shown)."""
    hw = load_hardware(out)
    assert hw.name == f"cpu{nproc}" and hw.calibration["backend"] == "gloo" and hw.calibration["nproc"] == nproc
    rows = read_results(out.with_suffix(".jsonl"))
    groups = [2] if nproc == 2 else [2, 4]
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        n, S, t, failed = collective_points(rows, "intra", coll)
        assert not failed and sorted(set(n)) == groups and len(S) == 11 * len(groups)
    assert {r["kind"] for r in rows} >= {"collective", "overlap", "matmul", "copy", "optimizer"}
    # the GEMM loop beside the node's all-gather at the largest size swept (none reaches 64 MiB): on CPU the share it
    # lost is reported and no SM count is fitted
    assert [(r["n_ranks"], r["size_bytes"]) for r in rows if r["kind"] == "overlap"] == [(nproc, 1 << 20)]
    assert hw.intra_node.nccl_channels == load_hardware("dgx-a100").intra_node.nccl_channels
    # nccl-tests columns: busbw = algbw * bus factor, with the model's table
    row = next(r for r in rows if r["kind"] == "collective" and r["collective"] == "all_reduce")
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * (row["n_ranks"] - 1) / row["n_ranks"])
    # The fitted link reproduces the all-reduce measurements it was fitted to. Stated error: CPU timings of
    # gloo processes sharing two vCPUs are preemption-bound: in a Firecracker VM the medians of a 2-rank sweep
    # were seen bimodal, some sizes at ~0.3 ms and others at ~4 ms (a scheduler time slice), so no smooth
    # curve can sit within 3x of every median. A point agrees when the fitted time lies inside its measured
    # spread [fastest, slowest call] or within 3x of its median; 80% of the points must agree (a sweep missing that
    # is measured once more: CI saw 7 of 11 agree on one sweep, the next two agreeing). With more ranks
    # than cores (4 on CI's 2 vCPUs) every ring step of the 4-rank group also waits for a time slice the 2-rank
    # group does not, and one alpha-beta link cannot follow both: CI saw 5 of 22 points outside (4-rank points
    # at 2.5-4.8x the fit). There the fit must stay within 3x of the medians on (geometric) average and within
    # 10x of every one. Either way a broken fit (wrong units, a degenerate start-up, bandwidth off by 10x)
    # fails, twice. The fit's accuracy is pinned on real NCCL data in tests/test_calibrate.py (the shipped A100 sweep).
    n, S, t, _ = collective_points(rows, "intra", "all_reduce")
    model = link_time("all_reduce", n, S, hw.intra_node)
    spread = {(r["n_ranks"], r["size_bytes"]): (r["time_min_s"], r["time_max_s"]) for r in rows
              if r["kind"] == "collective" and r["link"] == "intra" and r["collective"] == "all_reduce"}
    lo, hi = np.array([spread[(int(a), int(b))] for a, b in zip(n, S)]).T
    error = np.abs(np.log(model / t))
    if nproc <= (os.cpu_count() or 1):
        ok = bool(np.mean(((model >= lo) & (model <= hi)) | (error < np.log(3.0))) >= 0.8)
    else:
        ok = bool(np.exp(error.mean()) < 3.0 and np.exp(error.max()) < 10.0)
    assert ok or not strict, list(zip(n, S, t, model))
    return ok


# A worker that dies, or one that never reports progress (rank 0 reports once and finishes; rank 1
# sleeps past the timeout): either ends the run with an error naming the rank, the others stopped.
DEAD = "import os,sys,time; r=os.environ['RANK']; sys.exit(3) if r=='1' else time.sleep(60)"
HUNG = ("import os,sys,time,pathlib; r=os.environ['RANK']; "
        "pathlib.Path(sys.argv[2], 'rank'+r).write_text('1 2 0') if r=='0' else time.sleep(60)")


@pytest.mark.slow
@pytest.mark.parametrize("worker, timeout_s, message", [(DEAD, 20, "rank 1 died"), (HUNG, 2, "rank 1 made no progress")],
                         ids=["dead", "hung"])
def test_failed_rank_is_named(tmp_path, monkeypatch, worker, timeout_s, message):
    from advisor.calibrate import BenchConfig, launch

    monkeypatch.setattr(launch, "_WORKER", worker)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a failed run keeps its folder of logs: keep it in tmp_path
    with pytest.raises(Exception, match=message):
        launch.launch_local(BenchConfig(sizes=[1024], out=str(tmp_path / "r.jsonl"), timeout_s=timeout_s), 2,
                            progress=lambda *a: None)


def test_measurement_plan_adds_the_whole_world_across_nodes():
    """On several nodes the sweep covers one GPU per node (the network alone) and every GPU (the path data
    parallelism runs); world rows carry the GPUs per node the fit needs."""
    from advisor.calibrate.microbench import BenchConfig, collective_row, measurement_plan

    cfg = BenchConfig(sizes=[1 << 20], collectives=["all_reduce"], p2p=False)
    groups = {(link, tuple(ranks)) for link, ranks, _, _ in measurement_plan(cfg, 16, 8)}
    assert ("inter", (0, 8)) in groups and ("world", tuple(range(16))) in groups
    assert not any(link == "world" for link, _ in {(link, r) for link, r in groups if len(r) <= 8})
    assert {link for link, _, _, _ in measurement_plan(cfg, 8, 8)} == {"intra"}
    assert collective_row("world", "all_reduce", 16, 1 << 20, [1e-3], 8)["per_node"] == 8


# Rank 1 finds one measurement done that rank 0 does not (under torchrun on several nodes each rank reads its own copy
# of the results file): without rank 0's decision shared, rank 0 would wait for ever on the all-reduce rank 1 skips.
SPLIT = ("import json,os,sys; from advisor.calibrate.microbench import BenchConfig, run_worker; "
         "c=json.loads(sys.argv[1]); c['skip']=[] if os.environ['RANK']=='0' else [['intra','all_reduce',2,1024]]; "
         "run_worker(BenchConfig(**c), sys.argv[2])")


@pytest.mark.slow
def test_every_rank_walks_rank_0s_plan(tmp_path, monkeypatch):
    from advisor.calibrate import BenchConfig, launch

    monkeypatch.setattr(launch, "_WORKER", SPLIT)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = tmp_path / "r.jsonl"
    launch.launch_local(BenchConfig(sizes=[1024], collectives=("all_reduce",), p2p=False, compute=False, overlap=False,
                                    out=str(out), timeout_s=20), 2, progress=lambda *a: None)
    rows = read_results(out)
    assert [(r["collective"], r["size_bytes"]) for r in rows] == [("all_reduce", 1024)]


# The intra-node pair's measurements take 2.5 s each, 7.5 s in all, beyond the 5 s process-group timeout (--timeout)
# that ranks 2 and 3, outside the pair, wait under: without lockstep they waited at the first 4-rank all-reduce for the
# pair's whole sweep, gloo closed the pair, and every 4-rank row came back failed (seen with `advisor calibrate --nproc 4`
# at its default 1K:1G sizes on a busy 2-core machine: "rank 3 died ... Application timeout caused pair closure").
SLOW_PAIR = ("import json,sys,time; from advisor.calibrate import microbench as m; real=m.time_collective; "
             "m.time_collective=lambda coll,size,g,ranks,cfg,dev: (time.sleep(2.5), [1e-3])[1] if len(ranks)==2 "
             "else real(coll,size,g,ranks,cfg,dev); m.run_worker(m.BenchConfig(**json.loads(sys.argv[1])), sys.argv[2])")


@pytest.mark.slow  # ~25 s: 4 gloo workers, 15 s of them asleep
def test_ranks_outside_a_group_wait_one_measurement_not_its_sweep(tmp_path, monkeypatch):
    """The pair's sweep (6 sizes x 2.5 s = 15 s) outlasts the 12 s timeout, which one measurement (2.5 s) does not,
    with room for a loaded CI machine's start-up: without the lockstep, ranks 2 and 3 wait the whole sweep at the next
    4-rank collective and gloo closes the pair."""
    from advisor.calibrate import BenchConfig, launch

    monkeypatch.setattr(launch, "_WORKER", SLOW_PAIR)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = tmp_path / "r.jsonl"
    sizes = [1024 * 2 ** k for k in range(6)]
    launch.launch_local(BenchConfig(sizes=sizes, collectives=("all_reduce",), p2p=False, compute=False,
                                    overlap=False, out=str(out), timeout_s=12), 4, progress=lambda *a: None)
    rows = read_results(out)
    assert [(r["n_ranks"], r["size_bytes"], r["status"]) for r in rows] == [(n, s, "ok") for n in (2, 4) for s in sizes]
