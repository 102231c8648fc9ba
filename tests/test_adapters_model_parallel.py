"""LoRA under tensor and pipeline parallelism (issue 22), as Megatron-Bridge runs it: megatron-bridge 0.6.2's
ParallelLinearAdapter (peft/utils.py) splits each adapter's A and B over the TP ranks like the linear it adapts, on
that linear's pipeline stage; under SP a column-parallel target's adapter gathers the norm output's sequence itself
(an all-gather forward, a reduce-scatter backward). Its LoRA performance recipes run Llama 3 70B on 8 GPUs with TP 1-2
and PP 2-4 (llama3_70b_peft_8gpu_*: r 16, alpha 32, linear_qkv), and the Megatron-Bridge table measured them
(validation/data/megatron_bridge_performance.csv, task lora)."""

from __future__ import annotations

import pytest

from advisor import estimate, plan
from advisor.errors import AdvisorError

# llama3_70b_peft_8gpu_h100_fp8cs_config
H100_LORA = dict(gpus=8, tp=2, pp=4, sp=True, dp=1, schedule="interleaved", virtual_stages=20, micro_batch=1,
                 global_batch=32, seq=4096, precision="fp8-tensorwise", recompute="none", stack="megatron-bridge-perf")
ADAPTER = dict(method="lora", lora_rank=16, lora_alpha=32.0, lora_targets="qkv")
QKV_OUT = 8192 + 2 * 1024  # Llama 3 70B's fused qkv: 64 query heads and 8 kv heads of 128


def test_the_recipe_is_costed_and_fits():
    est = estimate("llama3-70b", "dgx-h100", **H100_LORA, **ADAPTER)
    assert est.fits
    # PEFT's count: r x (d_model + qkv width) per layer, 80 layers; model-wide, whatever the plan
    assert est.trainable_params == 80 * 16 * (8192 + QKV_OUT) == 23_592_960
    # the table: 2,643 tokens/s per GPU (26.06 NeMo container); within 10%
    assert est.tokens_per_s / est.world_size == pytest.approx(2643, rel=0.10)


def test_the_adapters_states_are_this_ranks_share():
    lora = estimate("llama3-70b", "dgx-h100", **H100_LORA, **ADAPTER).memory.parts
    full = estimate("llama3-70b", "dgx-h100", **H100_LORA).memory.parts
    # the frozen base held as the full fine-tune holds it; the adapters' share: a stage's 20 layers over 2 TP ranks
    trainable = 20 * 16 * (8192 + QKV_OUT) / 2
    assert lora["weights"] - full["weights"] == pytest.approx(trainable * 2.0, rel=0.02)  # bf16 adapter weights
    assert lora["optimizer_states"] == pytest.approx(trainable * 12.0, rel=1e-6)  # fp32 main params + Adam, dp = 1
    assert lora["gradients"] < 0.01 * full["gradients"]


def test_the_adapters_add_their_sequence_parallel_collectives():
    lora = estimate("llama3-70b", "dgx-h100", **H100_LORA, **ADAPTER).breakdown["comm/tp"]
    full = estimate("llama3-70b", "dgx-h100", **H100_LORA).breakdown["comm/tp"]
    # one adapted module (qkv) adds one all-gather + reduce-scatter to the layer's four (no recomputation): 5 / 4 of the
    # layers' TP time, the embedding's and the head's unchanged
    assert 1.15 < lora / full < 1.25


def test_the_search_offers_lora_with_tp_and_pp_in_megatron_only():
    res = plan("llama3-70b", "dgx-h100", gpus=8, seq=4096, global_batch=32, stack="megatron-core", top=100_000, **ADAPTER)
    assert any(r.plan.tp > 1 for r in res.plans) and any(r.plan.pp > 1 for r in res.plans)
    with pytest.raises(AdvisorError, match="data parallelism only in this stack"):
        estimate("llama3-70b", "dgx-h100", gpus=8, tp=8, micro_batch=1, seq=4096, stack="hf-trainer", **ADAPTER)


def test_a_megatron_lora_plan_under_tp_exports_bridges_peft_section():
    # the formats' own check runs without a stack after the stack's: it must not refuse adapters under TP (the stack
    # runs them); the Bridge overrides carry the adapters as Bridge's LoRA (peft/lora.py), instantiated from _target_
    import yaml

    from advisor.api import launch_config
    from advisor.export import ExportError

    kw = dict(gpus=8, tp=2, pp=4, sp=True, micro_batch=1, global_batch=32, seq=4096, stack="megatron-core", **ADAPTER)
    out = launch_config("llama3-70b", "dgx-h100", format="megatron-bridge", **kw)
    peft = yaml.safe_load(out.text)["peft"]
    assert peft == {"_target_": "megatron.bridge.peft.lora.LoRA", "target_modules": ["linear_qkv"], "dim": 16,
                    "alpha": 32, "dropout": 0.0}
    assert any("pretrained_checkpoint" in n for n in out.notes)
    # q and v apart: megatron-core has no separate q, k, v linears to adapt
    with pytest.raises(ExportError, match="use --lora-targets qkv"):
        launch_config("llama3-70b", "dgx-h100", format="megatron-bridge", **{**kw, "lora_targets": "q_proj,v_proj"})
    with pytest.raises(ExportError, match="gate and up projections fused"):
        launch_config("llama3-70b", "dgx-h100", format="megatron-bridge", **{**kw, "lora_targets": "qkv,up_proj"})


def test_megatrons_fused_fc1_takes_one_adapter_for_gate_and_up():
    """megatron-core holds the gate and up projections in one linear_fc1 (ColumnParallelLinear of 2 x ffn), which
    Bridge's LoRA adapts as one module: r x (h + 2 ffn) a layer, not two adapters' r x (2 h + 2 ffn). Llama 3 70B,
    r 8, every linear: 80 x 8 x ((8192 + 10240) + (8192 + 8192) + (8192 + 57344) + (28672 + 8192))."""
    est = estimate("llama3-70b", "dgx-h100", gpus=8, tp=2, pp=4, sp=True, micro_batch=1, global_batch=32, seq=4096,
                   method="lora", lora_targets="qkv,o_proj,gate_proj,up_proj,down_proj", stack="megatron-core")
    assert est.trainable_params == 80 * 8 * ((8192 + 10240) + (8192 + 8192) + (8192 + 57344) + (28672 + 8192)) == 87_818_240
