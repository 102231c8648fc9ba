"""The click options of the commands that describe plans, written once.

``common_plan_options``: what every plan command needs (model, hardware, cluster size, setup, --json);
``single_plan_options``: the degrees and settings of one plan (``estimate``, ``export``). ``plan`` takes
the common set only: it searches the rest. Option names become ``advisor.api.build_inputs`` keywords.

Only click is imported here, so ``advisor --help`` stays fast (the library is imported inside commands).
"""

from __future__ import annotations

import click


def _apply(f, opts):
    for o in reversed(opts):
        f = o(f)
    return f


def common_plan_options(f):
    """Options shared by ``estimate``, ``export`` and ``plan``."""
    return _apply(f, [
        click.option("--model", "model", required=True, help="catalogue name (advisor models) or path to a HF config.json"),
        click.option("--hw", "hw", required=True, help="profile name (advisor profiles) or path to a profile YAML"),
        click.option("--nodes", type=int, default=None, help="nodes of the profile (alternative to --gpus)"),
        click.option("--seq", type=int, default=None,
                     help="sequence length in tokens [default: the model's context length, at most 8192]"),
        click.option("--precision", type=click.Choice(["fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp8-mixed"]), default=None,
                     help="default: bf16-mixed where the GPU has bf16, else fp16-mixed"),
        click.option("--attention", type=click.Choice(["sdpa", "eager"]), default="sdpa", show_default=True),
        click.option("--optimizer", type=click.Choice(["adamw", "adamw-fused", "sgd"]), default="adamw", show_default=True),
        click.option("--stack", default="auto", show_default=True,
                     help="training stack profile (advisor stacks) or a path to one; auto: hf-trainer when the model "
                          "fits on one GPU, else megatron-deepspeed"),
        click.option("--json", "as_json", is_flag=True, help="machine-readable output"),
    ])


def single_plan_options(f):
    """The degrees and settings of one plan (``estimate``, ``export``); defaults as ``build_inputs``'s."""
    return _apply(f, [
        click.option("--gpus", type=int, default=None, help="total GPUs [default: dp x tp x pp]"),
        click.option("--dp", type=int, default=None, help="data-parallel degree [default: gpus / (tp*pp)]"),
        click.option("--tp", type=int, default=1, show_default=True, help="tensor-parallel degree"),
        click.option("--pp", type=int, default=1, show_default=True, help="pipeline-parallel degree"),
        click.option("--zero", type=click.IntRange(0, 3), default=None, help="ZeRO stage [default: 0, or --fsdp's]"),
        click.option("--fsdp", type=click.Choice(["full-shard", "shard-grad-op", "hybrid-shard", "no-shard"]), default=None,
                     help="FSDP mode (alias for the ZeRO stage)"),
        click.option("--sp/--no-sp", default=False, help="Megatron sequence parallelism"),
        click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"]),
                     default="1f1b", show_default=True, help="pipeline schedule (zero-bubble ones where the stack runs them)"),
        click.option("--virtual-stages", type=int, default=None, help="interleaved schedule: model chunks per GPU"),
        click.option("--pp-split", type=click.Choice(["even", "edges"]), default="even", show_default=True,
                     help="layers over pipeline ranks: even, or edges (the embedding and the loss count as a layer each)"),
        click.option("--cp", type=int, default=1, show_default=True, help="context-parallel degree (sequence split cp ways)"),
        click.option("--cp-comm", type=click.Choice(["ring", "all-gather", "ulysses"]), default=None,
                     help="context-parallel flavour [default: the stack's first]"),
        click.option("--micro-batch", type=int, default=1, show_default=True),
        click.option("--global-batch", type=int, default=None),
        click.option("--grad-accum", type=int, default=None),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none", show_default=True),
        click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=None,
                     help="overlap gradient reduction with backward [default: on]"),
        click.option("--data-parallel", type=click.Choice(["ddp", "dp"]), default="ddp", show_default=True,
                     help="DDP or single-process nn.DataParallel"),
        click.option("--allow-tp-across-nodes", is_flag=True, help="let TP span nodes (normally rejected)"),
    ])
