"""RoPE where a stack's element-wise tables leave it out (advisor.unfused_bytes.rotary_bytes) and YaRN's attention factor
read from config.json as transformers derives it."""

import json

import pytest

from advisor import estimate
from advisor.hardware import load_hardware
from advisor.model import ModelError, RopeScaling, load_model
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.unfused_bytes import rotary_bytes
from advisor.workload import Workload

GPT_OSS_YARN = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                "rope_type": "yarn", "truncate": False}  # openai/gpt-oss-120b config.json rope_scaling


def _config(tmp_path, **rope) -> str:
    cfg = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
           "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 131072, **rope}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_yarn_attention_factor_is_transformers_own():
    """transformers 5.23 _compute_yarn_parameters: GPT-OSS's 0.1 ln 32 + 1; DeepSeek-style mscale / mscale_all_dim a
    ratio of the two (V3's own 1.0 / 1.0: 1)."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    want = ROPE_INIT_FUNCTIONS["yarn"](transformers.GptOssConfig(rope_scaling=dict(GPT_OSS_YARN)), "cpu")[1]
    assert load_model("gpt-oss-120b").rope_attention_factor == pytest.approx(want, rel=1e-12) == pytest.approx(1.3466, abs=1e-4)
    ds = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 1.0,
          "original_max_position_embeddings": 4096, "type": "yarn"}
    want = ROPE_INIT_FUNCTIONS["yarn"](transformers.DeepseekV3Config(rope_scaling=ds), "cpu")[1]
    assert want == pytest.approx(0.92104, abs=1e-5)
    assert load_model("deepseek-v3").rope_attention_factor == 1.0 and load_model("llama3-8b").rope_attention_factor == 1.0


def test_yarn_keys_are_read_and_checked(tmp_path):
    assert load_model(_config(tmp_path, rope_scaling=GPT_OSS_YARN)).rope_attention_factor == pytest.approx(1.3466, abs=1e-4)
    # transformers 5's rope_parameters first; attention_factor as given; no factor: max positions / original (32)
    spec = load_model(_config(tmp_path, rope_parameters={"rope_type": "yarn", "attention_factor": 1.1, "factor": 8.0}))
    assert spec.rope_attention_factor == 1.1
    spec = load_model(_config(tmp_path, rope_scaling={"rope_type": "yarn", "original_max_position_embeddings": 4096}))
    assert spec.rope_attention_factor == pytest.approx(1.3466, abs=1e-4)
    assert load_model(_config(tmp_path, rope_scaling={"rope_type": "linear", "factor": 4.0})).rope_attention_factor == 1.0
    with pytest.raises(ModelError, match=r"'rope_scaling.factor' must be a finite number, not the string '32'"):
        load_model(_config(tmp_path, rope_scaling={**GPT_OSS_YARN, "factor": "32"}))
    with pytest.raises(ModelError, match=r"config.json: rope_scaling.factor: Input should be greater than 0 \(got -2.0\)"):
        load_model(_config(tmp_path, rope_scaling={**GPT_OSS_YARN, "factor": -2.0}))


def _bytes(model, stack, tp=1):
    w = Workload.of(load_model(model), load_hardware("gb200-nvl72"), load_stack(stack), TrainingSetup(seq_len=4096))
    return tuple(float(x) for x in rotary_bytes(w, tp))


def test_megatron_core_rotary_bytes_per_token():
    """megatron-core (stack_profiles/megatron-core.yaml kernels.rotary): Transformer Engine's fused RoPE reads and
    writes each rotated q and k element once each way; GPT-OSS's YaRN cos and sin (mscale 1.347) take the unfused
    path, 12 elements forward and 13 backward (rope_utils.py _apply_rotary_pos_emb_bshd). bf16: 2 bytes."""
    # Llama 3 8B: q 32 x 128, k 8 x 128 per token; TP 8 splits both (8 KV heads)
    assert _bytes("llama3-8b", "megatron-core") == pytest.approx((2 * 2 * 5120, 2 * 2 * 5120))
    assert _bytes("llama3-8b", "megatron-core", tp=8) == pytest.approx((2 * 2 * 640, 2 * 2 * 640))
    # GPT-OSS-120B: q 64 x 64, k 8 x 64
    assert _bytes("gpt-oss-120b", "megatron-bridge-perf") == pytest.approx((12 * 2 * 4608, 13 * 2 * 4608))
    # partial RoPE (GLM-4-9B rotates half of each 128-wide head): the fused kernel still writes the heads whole
    # (its output is t's shape, the pass-through copied), the unfused path's cat and slice run over them whole
    glm = load_model("glm-4-9b")
    assert glm.rotary_fraction == 0.5
    heads = glm.n_heads * glm.layer.d_head + glm.kv_heads * glm.layer.d_head
    assert _bytes("glm-4-9b", "megatron-core") == pytest.approx((2 * 2 * heads, 2 * 2 * heads))
    yarn = glm.model_copy(update={"rope_scaling": RopeScaling(kind="yarn", factor=4.0)})
    w = Workload.of(yarn, load_hardware("gb200-nvl72"), load_stack("megatron-core"), TrainingSetup(seq_len=4096))
    assert tuple(float(x) for x in rotary_bytes(w, 1)) == pytest.approx(((0.5 * 10 + 2) * 2 * heads, (0.5 * 10 + 3) * 2 * heads))
    # a YaRN whose attention factor is 1 (both mscales 1) runs unfused too: its position embedding type, yarn, turns
    # fusion off (Megatron-LM arguments.py, Bridge's validate_rope_fusion_compatibility)
    one = glm.model_copy(update={"rope_scaling": RopeScaling(kind="yarn", factor=4.0, mscale=1.0, mscale_all_dim=1.0)})
    assert one.rope_attention_factor == 1.0
    w = Workload.of(one, load_hardware("gb200-nvl72"), load_stack("megatron-core"), TrainingSetup(seq_len=4096))
    assert float(rotary_bytes(w, 1)[0]) == pytest.approx((0.5 * 10 + 2) * 2 * heads)
    # stacks whose tables were probed on their own RoPE code, models without RoPE, MLA's fused rope parts: nothing
    assert _bytes("llama3-8b", "hf-trainer") == _bytes("gpt-oss-120b", "torchtitan") == (0.0, 0.0)
    assert _bytes("gpt2-xl", "megatron-core") == _bytes("deepseek-v3", "megatron-core") == (0.0, 0.0)


def test_unfused_yarn_rope_lengthens_a_gpt_oss_step_by_its_bytes():
    """The GB200 BF16 row of Megatron-Bridge's tables (64 GPUs, EP 64, micro-batch 4, 5 micro-batches of 16,384
    tokens): the unfused RoPE's 10 + 11 elements beyond the fused kernel's, per rotated element, at the GB200's
    element-wise rate."""
    kw = dict(gpus=64, dp=64, zero=1, ep=64, etp=1, micro_batch=4, global_batch=1280, seq=4096, stack="megatron-core",
              precision="bf16-mixed", moe_dispatcher="alltoall", moe_overlap="none")
    yarn = estimate("gpt-oss-120b", "gb200-nvl72", **kw)
    plain = estimate(load_model("gpt-oss-120b").model_copy(update={"rope_scaling": None}), "gb200-nvl72", **kw)
    hw = load_hardware("gb200-nvl72")
    extra = 5 * 36 * 16384 * 4608 * 2 * (10 + 11) / (hw.gpu.memory_bandwidth_bytes_per_s * hw.efficiency.elementwise)
    assert yarn.step_time_s - plain.step_time_s == pytest.approx(extra, rel=0.02)
    # the products keep only cos and sin, made anew for q and for k (rope_utils.py:133-136): 4 x 64 bf16 elements a
    # position of each micro-batch of 4 x 4096 tokens, in each of the 36 layers (advisor.unfused_bytes.rotary_saved)
    assert yarn.memory.peak_bytes - plain.memory.peak_bytes == pytest.approx(36 * 4096 * 4 * 64 * 2, rel=1e-12)
