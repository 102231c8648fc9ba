"""torchtitan runs torch.distributed.pipelining's schedules over training.local_batch_size //
pipeline_parallel_microbatch_size micro-batches (0.3.0 distributed/pipeline_parallel.py:303-311; 0.2.2 :186-194), and
only warns when they are fewer than the stages (0.3.0 :312-318). torch 2.13's Schedule1F1B raises then
(pipelining/schedules.py:1020-1024); ScheduleGPipe takes any count. The torchtitan profiles state it
(engine.stage_micro_batches): estimate refuses such a 1F1B plan, plan leaves it out under that reason, and megatron-core,
whose 1F1B warms up min(stages - rank - 1, micro-batches) (megatron/core/pipeline_parallel/schedules.py:2243-2244),
keeps it."""

from __future__ import annotations

import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe

from advisor import estimate, launch_config, plan
from advisor.errors import AdvisorError

# Llama 3 8B on one DGX H100: FSDP2 over 2 ranks under a 4-stage pipeline (torchtitan's ZeRO-1), one micro-batch of 1
ONE = dict(model="llama3-8b", hw="dgx-h100", dp=2, pp=4, zero=1, micro_batch=1, grad_accum=1, seq=8192)
REASON = ("torchtitan's 1f1b and dualpipev schedules need at least as many micro-batches a step as pipeline stages "
          "(torch.distributed.pipelining raises at launch)")


def _torch_schedule(cls, stages: int, n: int):
    """torch's own schedule built over a stand-in stage of ``stages`` stages (its constructor reads num_stages)."""
    return cls(SimpleNamespace(num_stages=stages, stage_index=0), n_microbatches=n)


def _exported_micro_batches(**kw) -> int:
    """The micro-batches torchtitan's build_pipeline_schedule makes of the exported arguments."""
    args = shlex.split(launch_config(**kw, stack="torchtitan", format="torchtitan").text.replace("\\\n", " "))
    value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
    return int(value["--training.local-batch-size"]) // int(value["--parallelism.pipeline-parallel-microbatch-size"])


@pytest.mark.parametrize("stack", ["torchtitan", "torchtitan-0.2", "torchtitan-0.1"])
def test_estimate_refuses_fewer_micro_batches_than_stages_naming_the_fix(stack):
    with pytest.raises(ValueError, match=r"Number of microbatches \(1\) must be greater than or equal to the number of "
                                         r"stages \(4\)"):
        _torch_schedule(Schedule1F1B, 4, 1)  # what the launched run would raise
    with pytest.raises(AdvisorError) as err:
        estimate(**ONE, stack=stack)
    assert str(err.value) == (
        f"invalid plan: {stack}'s 1f1b schedule runs 1 micro-batch a step on 4 pipeline stages (pp=4), where "
        "torch.distributed.pipelining needs at least 4: set --grad-accum 4 or more (--global-batch 8), or lower --pp")


def test_the_fix_it_names_runs_and_gpipe_or_megatron_core_take_one_micro_batch():
    four = {**ONE, "grad_accum": 4}
    assert _exported_micro_batches(**four) == 4  # local batch 4 of micro-batches of 1
    assert _torch_schedule(Schedule1F1B, 4, 4)._n_microbatches == 4  # torch builds it
    assert estimate(**four, stack="torchtitan").fits
    _torch_schedule(ScheduleGPipe, 4, 1)  # no check in GPipe
    assert estimate(**ONE, schedule="gpipe", stack="torchtitan").fits
    assert estimate(**ONE, stack="megatron-core").fits


def test_plan_leaves_them_out_under_the_reason():
    """Global batch 2 on 8 GPUs: every 1F1B plan at pp 2 or more runs at most 2 // dp micro-batches, so pp 4 and 8 at
    dp 1 or 2 and pp 2 at dp 2 are left out; none ranked runs 1F1B with fewer micro-batches than pp."""
    res = plan("llama3-8b", "dgx-h100", stack="torchtitan", global_batch=2, seq=8192, top=50)
    assert res.rejected[REASON] > 0
    assert res.plans
    for r in res.plans:
        if r.plan.pp > 1 and r.plan.schedule.value == "1f1b":
            assert r.estimate.grad_accum >= r.plan.pp
    kept = plan("llama3-8b", "dgx-h100", stack="megatron-core", global_batch=2, seq=8192, top=50)
    assert not any("micro-batches a step as pipeline stages" in k for k in kept.rejected)


def test_the_cli_refuses_in_one_line():
    cmd = [sys.executable, "-m", "advisor.cli", "estimate", "--stack", "torchtitan", "--model", "llama3-8b", "--hw",
           "dgx-h100", "--dp", "2", "--pp", "4", "--zero", "1", "--micro-batch", "1", "--grad-accum", "1", "--seq", "8192"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--grad-accum 4 or more" in out.stderr
