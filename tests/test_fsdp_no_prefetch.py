"""FSDP without backward prefetch: stack torch-1.11, PyTorch's first FSDP release as PyTorch's blog ran it (seed 000's
other side: DDP faster than FULL_SHARD on 4 nodes of 8x A100-40GB over 400 Gb/s EFA).

torch 1.11.0's torch/distributed/fsdp/fully_sharded_data_parallel.py: ``backward_prefetch=None`` by default, so a unit's
gather is issued by its own pre-backward hook, after the post-backward hook of the unit before it has issued that
unit's reduce-scatter (``_reduce_scatter_base`` on the post_backward stream once it has waited for the compute); both
go over ``self.process_group``, whose collectives ProcessGroupNCCL runs on one NCCL stream per device. The unit's
backward waits for its gather, the gather for the reduce-scatter, the reduce-scatter for the backward before it:
every backward gather and reduce-scatter runs in line with the compute. The forward's gathers run ahead of the
compute on the all_gather stream as the host issues them (``_rebuild_full_params``), as prefetch's do."""

from __future__ import annotations

import shlex

import pytest

from advisor import comm, estimate
from advisor.comm import Collective
from advisor.errors import AdvisorError
from advisor.export import export
from advisor.hardware import load_hardware
from advisor.model import load_model
from advisor.parallel.pipeline import params_outside_layers
from advisor.stack import list_stacks, load_stack

# minGPT-style eager attention: torch 1.11 has no scaled_dot_product_attention (2.0)
P4D = dict(hw="aws-p4d", gpus=32, precision="fp32", attention="eager", optimizer="adamw")


def _largest_ddp_batch(model: str, seq: int, stack: str) -> int:
    """The largest micro-batch DDP fits on A100-40GB (the blog's models all fit one GPU)."""
    return next(mb for mb in (32, 24, 16, 12, 8, 6, 4, 2, 1)
                if estimate(model=model, micro_batch=mb, global_batch=32 * mb, seq=seq, zero=0, stack=stack, **P4D).fits)


def test_backward_gathers_and_reduce_scatters_are_exposed():
    """FULL_SHARD's exposed FSDP time is at least one backward's gathers and reduce-scatters of every unit (each layer,
    then the root), at the size comm.collective_time prices them, and at most that plus the forward's gathers."""
    m, hw = load_model("gpt2-large"), load_hardware("aws-p4d")
    est = estimate(model="gpt2-large", micro_batch=4, global_batch=128, seq=1024, fsdp="full-shard", stack="torch-1.11",
                   **P4D)
    outside = params_outside_layers(m, 1)
    unit = (m.n_params - outside) / m.n_layers * 4.0  # fp32 gathers and reduce-scatters, a layer a unit
    one = {c: m.n_layers * float(comm.collective_time(c, 32, unit, hw, 8))
           + float(comm.collective_time(c, 32, outside * 4.0, hw, 8)) for c in (Collective.all_gather, Collective.reduce_scatter)}
    backward = one[Collective.all_gather] + one[Collective.reduce_scatter]
    exposed = est.breakdown["comm/zero_params"]
    assert backward <= exposed <= backward + one[Collective.all_gather] + 1e-9
    assert backward > 0.2  # ~0.28 s of collectives a step on EFA: the comparison is not vacuous


def test_prefetch_is_what_hides_them():
    """The same stack with backward prefetch (as accelerate and torchtitan run FSDP) hides most of it; DDP is the same
    in both, and no plan gets faster for losing the prefetch."""
    stack = load_stack("torch-1.11")
    prefetch = stack.model_copy(update={"engine": stack.engine.model_copy(update={"zero3_overlap": "prefetch"})})
    kw = dict(model="gpt2-large", micro_batch=4, global_batch=128, seq=1024, **P4D)
    none, pre = (estimate(**kw, fsdp="full-shard", stack=s) for s in (stack, prefetch))
    assert pre.breakdown["comm/zero_params"] < 0.5 * none.breakdown["comm/zero_params"]
    assert pre.step_time_s < none.step_time_s
    ddp = [estimate(**kw, zero=0, stack=s).step_time_s for s in (stack, prefetch)]
    assert ddp[0] == ddp[1]


@pytest.mark.parametrize("seq", [512, 1024])
def test_seed_000_pytorch_blog_side(seq):
    """PyTorch's blog (seed 000): on 4 nodes of 8x A100-40GB over 400 Gb/s EFA DDP was faster than FSDP for every model
    that fit one GPU. In torch 1.11's FSDP the model agrees for GPT-2 small to XL in fp32 (1.11 has no mixed-precision
    policy), each at the largest micro-batch DDP fits (XL fits none at 1024 tokens); with backward prefetch (hf-trainer's
    FSDP) FULL_SHARD ties or wins."""
    for model in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")[: 4 if seq == 512 else 3]:  # XL at 1024: DDP OOM
        mb = _largest_ddp_batch(model, seq, "torch-1.11")
        kw = dict(model=model, micro_batch=mb, global_batch=32 * mb, seq=seq, **P4D)
        ddp, fsdp = (estimate(**kw, stack="torch-1.11", **p) for p in (dict(zero=0), dict(fsdp="full-shard")))
        assert ddp.fits and ddp.step_time_s < fsdp.step_time_s, model
        modern = estimate(**kw, stack="hf-trainer", fsdp="full-shard")
        assert modern.step_time_s < 1.01 * estimate(**kw, stack="hf-trainer", zero=0).step_time_s, model


def test_what_torch_1_11_lacks_is_refused():
    kw = dict(model="gpt2-large", micro_batch=4, global_batch=128, seq=1024, stack="torch-1.11", **P4D)
    with pytest.raises(AdvisorError, match="does not run ZeRO-2"):  # sharding_strategy came in 1.12
        estimate(**kw, fsdp="shard-grad-op")
    with pytest.raises(AdvisorError, match="does not train in fp16-mixed"):  # no ShardedGradScaler before 1.12
        estimate(**{**kw, "precision": "fp16-mixed"}, zero=0)
    with pytest.raises(AdvisorError, match="compile"):
        estimate(**kw, zero=0, compile="model,loss")


def test_autocast_gathers_fp32_weights():
    """No MixedPrecision in 1.11: under bf16 autocast FULL_SHARD shards, gathers and steps the fp32 weights, with no
    master copy (4 bytes a parameter held, 8 of AdamW's states)."""
    m = load_model("gpt2-large")
    est = estimate(model="gpt2-large", micro_batch=4, global_batch=128, seq=1024, fsdp="full-shard", stack="torch-1.11",
                   **{**P4D, "precision": "bf16-mixed"})
    assert est.memory.parts["weights"] == pytest.approx(m.n_params * 4.0 / 32)
    assert est.memory.parts["optimizer_states"] == pytest.approx(m.n_params * 8.0 / 32)


def test_torchrun_line_is_one_torch_1_11_parses():
    """The export writes torchrun's underscore flags: the only ones torch 1.11.0's torch/distributed/run.py defines
    (--nnodes, --nproc_per_node, --rdzv_backend, --rdzv_endpoint, --rdzv_id, --standalone, ...), and parsed by
    today's torchrun too."""
    run = pytest.importorskip("torch.distributed.run")
    v111 = {"--nnodes", "--nproc_per_node", "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id", "--rdzv_conf",
            "--standalone", "--max_restarts", "--monitor_interval", "--start_method", "--role", "--module",
            "--no_python", "--run_path", "--log_dir", "--redirects", "--tee", "--node_rank", "--master_addr",
            "--master_port"}
    from advisor.layout import Plan
    from advisor.training import TrainingSetup

    setup = TrainingSetup(seq_len=1024, micro_batch=4, global_batch=128, precision="fp32", stack="torch-1.11")
    text = export("torchrun", load_model("gpt2-large"), load_hardware("aws-p4d"), Plan(dp=32, zero=3), setup, 1, 32,
                  "torch-1.11").text
    line = next(x for x in text.splitlines() if x.startswith("torchrun"))
    tokens = shlex.split(line.replace("$MASTER_ADDR", "node0").replace("$JOB_ID", "job"))[1:]
    assert {t for t in tokens if t.startswith("--")} <= v111
    ns = run.get_args_parser().parse_args(tokens)
    assert (int(ns.nnodes), int(ns.nproc_per_node), ns.rdzv_backend) == (4, 8, "c10d")


def test_dated_profiles_name_a_shipped_successor():
    """A dated profile names the stack that runs its code today, and an export without a stack takes that one."""
    from advisor.export import launching

    dated = {n: load_stack(n).superseded_by for n in list_stacks() if load_stack(n).superseded_by}
    assert dated == {"torch-1.11": "hf-trainer", "litgpt-2023": "litgpt", "llm-foundry-2023": "llm-foundry"}
    assert launching("torchrun") == "hf-trainer"
