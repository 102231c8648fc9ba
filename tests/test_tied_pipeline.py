"""Tied embeddings under a pipeline, as the stacks run them.

- megatron-core 0.16.1 distributed/finalize_model_grads.py ``_allreduce_embedding_grads``: with
  share_embeddings_and_output_weights and pp > 1, the first stage's word embedding and the last stage's output layer
  hold the same table, and after the data-parallel reduction each step all-reduces its ``main_grad`` over the
  embedding group (the two end stages);
- torchtitan 0.3.0 models/common/decoder.py:139 raises "Weight tying is not supported with Pipeline Parallel.";
- torchtitan 0.2.2 distributed/pipeline_parallel.py pipeline_module_split builds each stage from ``copy.deepcopy`` of
  the whole model and sets the modules it does not keep to None: the last stage's output.weight is a copy of its
  own, never synced;
- a V schedule's rank 0 runs the first and the last chunk: it holds the embedding and the head (Qi et al. 2023,
  arXiv 2401.10241, s.6; torch ScheduleZBVZeroBubble's stage placement), both tables where they are untied.

Gemma 3 1B ties its 262,144 x 1,152 table (its config.json, tie_word_embeddings true); Llama 3 8B does not (128,256 x
4,096 each, config.json tie_word_embeddings false)."""

from __future__ import annotations

import pytest

from advisor import comm, estimate
from advisor.comm import Collective
from advisor.errors import AdvisorError
from advisor.hardware import load_hardware
from advisor.stack import load_stack
from advisor.units import GiB

PLAN = dict(model="gemma-3-1b", hw="dgx-h100", dp=4, pp=2, zero=1, global_batch=64, seq=2048)  # FSDP under PP


def _untied(stack: str):
    s = load_stack(stack)
    return s.model_copy(update={"engine": s.engine.model_copy(update={"tied_pipeline": "untied"})})


@pytest.mark.parametrize("gpus, per_node", [(8, 2.0), (16, 1.0)])
def test_megatron_all_reduces_the_tied_gradient_between_the_end_stages(gpus, per_node):
    """The sync adds one all-reduce of the table's fp32 main_grad (262,144 x 1,152 x 4 bytes: 1.12 GiB) over the two end
    stages, on NVLink in one node and across the network on 2 nodes, to the pipeline's communication; nothing else."""
    kw = {**PLAN, "dp": gpus // 2}
    tied, untied = (estimate(**kw, stack=s) for s in ("megatron-core", _untied("megatron-core")))
    size = 262_144 * 1_152 * 4.0
    assert size / GiB == pytest.approx(1.125, abs=1e-3)
    sync = float(comm.collective_time(Collective.all_reduce, 2, size, load_hardware("dgx-h100"), per_node))
    assert tied.breakdown["comm/pp_p2p"] - untied.breakdown["comm/pp_p2p"] == pytest.approx(sync, rel=1e-9)
    assert tied.step_time_s - untied.step_time_s == pytest.approx(sync, rel=1e-6)
    assert sync > (0.02 if per_node == 1.0 else 0.002)  # ~25 ms across 400 Gb/s NICs, ~3 ms on NVLink
    assert "tied embeddings' gradient all-reduce of 1.12 GiB over 2 GPUs" in tied.collectives["pp_p2p"]


def test_no_sync_without_a_tie_a_pipeline_or_a_trained_table():
    """Llama 3 8B (untied), one stage, or LoRA's frozen table: no sync, and the collectives do not mention one."""
    for kw in (dict(PLAN, model="llama3-8b"), dict(PLAN, dp=8, pp=1)):
        est = estimate(**kw, stack="megatron-core")
        assert "tied" not in est.collectives.get("pp_p2p", "")
    lora = dict(method="lora", lora_targets="qkv")
    assert estimate(**PLAN, stack="megatron-core", **lora).breakdown["comm/pp_p2p"] == pytest.approx(
        estimate(**PLAN, stack=_untied("megatron-core"), **lora).breakdown["comm/pp_p2p"], rel=1e-12)


def test_torchtitan_refuses_and_torchtitan_0_2_keeps_two_copies():
    with pytest.raises(AdvisorError, match="torchtitan does not run pipeline parallelism on tied embeddings: --pp 1"):
        estimate(**PLAN, stack="torchtitan")
    old = estimate(**PLAN, stack="torchtitan-0.2")
    assert old.breakdown["comm/pp_p2p"] == pytest.approx(
        estimate(**PLAN, stack=_untied("torchtitan-0.2")).breakdown["comm/pp_p2p"], rel=1e-12)
    assert "tied" not in old.collectives["pp_p2p"]
    # without a pipeline, torchtitan trains the tied model
    assert estimate(**{**PLAN, "dp": 8, "pp": 1, "zero": 3}, stack="torchtitan").fits


def test_v_schedule_rank_0_holds_both_untied_tables():
    """ZB-V's rank 0 holds Llama 3 8B's embedding, head and final norm, 2 x 128,256 x 4,096 + 4,096 bf16 weights;
    1F1B's first rank the embedding: the weights differ by a table and the norm (the layers are L / pp on both)."""
    kw = dict(model="llama3-8b", hw="dgx-h100", dp=4, pp=2, zero=1, global_batch=64, seq=2048, stack="torchtitan")
    v, one = estimate(**kw, schedule="zb-v"), estimate(**kw, schedule="1f1b")
    table = (128_256 * 4_096 + 4_096) * 2.0
    assert v.memory.parts["weights"] - one.memory.parts["weights"] == pytest.approx(table, rel=1e-9)
    assert v.memory.peak_bytes > one.memory.peak_bytes


def test_torchtitan_0_2_v_schedule_rank_0_holds_both_copies_of_a_tied_table():
    """torchtitan 0.2.2 builds each stage from a deep copy: a V schedule's rank 0 runs stage 0 (tok_embeddings) and the
    last stage (output), two copies of SmolLM3's tied 128,256 x 2,048 table; 1F1B's first rank one. The weights
    differ by a table and the final norm (2,048), in the bf16 weights the plan holds (a review found one table)."""
    kw = dict(model="smollm3-3b", hw="dgx-h100", dp=2, pp=2, zero=1, global_batch=64, seq=2048, stack="torchtitan-0.2")
    v, one = estimate(**kw, schedule="zb-v"), estimate(**kw, schedule="1f1b")
    assert v.memory.parts["weights"] - one.memory.parts["weights"] == pytest.approx((128_256 * 2_048 + 2_048) * 2.0)
