"""FLOPs, MFU and HFU defined once (advisor.step): HFU >= MFU always and never above 100% (issue 18)."""

import pytest

from advisor import estimate
from advisor.model import load_model


def test_model_flops_per_token_counted_from_the_layer_table():
    # GPT-2 124M at seq 1024: 12 layers of 12 h^2 linear weights (qkv 3h^2, out h^2, fc 4h^2, proj 4h^2) at 6 FLOPs
    # per weight and token, the tied LM head (V x h) likewise, and the causal attention core, 4 q_dim FLOPs per
    # key over (s + 1) / 2 keys, three times (forward + backward). No embedding lookup, no bias.
    h, L, V, s = 768, 12, 50257, 1024
    per_token = 6 * 12 * h * h * L + 6 * V * h + 3 * L * 4 * h * (s + 1) / 2
    assert per_token == 509_607_936 + 231_584_256 + 56_678_400
    e = estimate(model="gpt2", hw="dgx-a100", micro_batch=2, seq=s)
    assert e.tflops_per_gpu * 1e12 * e.step_time_s == pytest.approx(per_token * 2 * s, rel=1e-12)
    assert e.hfu == pytest.approx(e.mfu, rel=1e-12)  # sdpa, no recomputation: nothing more is executed


def test_layer_table_counts_a_causal_core_for_the_keys_each_query_sees():
    layer = load_model("llama3-8b").layer
    assert layer.core_flops_per_token(8192) == 4 * 4096 * 8193 / 2
    assert layer.core_flops_per_token(8192, causal=False) == 4 * 4096 * 8192


@pytest.mark.parametrize("kw", [
    dict(model="llama3-8b", hw="dgx-a100", seq=262144),  # the reproducer: HFU 105% (326 TFLOP/s of 312)
    dict(model="llama3-8b", hw="dgx-h100", gpus=8, tp=8, seq=524288),  # and 1,010 TFLOP/s of 989 at TP 8
    dict(model="gpt2", hw="dgx-a100", seq=1024, attention="eager", recompute="full"),
])
def test_hfu_never_exceeds_the_peak_and_never_falls_below_mfu(kw):
    e = estimate(**kw)
    assert e.hfu <= 1.0 and e.hw_tflops_per_gpu <= 312.0 * (989 / 312 if "h100" in kw["hw"] else 1.0)
    assert e.hfu >= e.mfu


def test_eager_attention_and_recomputation_count_as_hardware_flops():
    base = dict(model="gpt2", hw="dgx-a100", seq=1024)
    sdpa, eager = estimate(**base), estimate(**base, attention="eager")
    full = estimate(**base, recompute="full")
    tokens = sdpa.tokens_per_step
    # eager computes the masked half of the scores too: 3 passes x 12 layers x 4 h x (s - (s + 1) / 2) per token
    extra = 3 * 12 * 4 * 768 * (1024 - 1025 / 2) * tokens
    flops = {k: e.hw_tflops_per_gpu * 1e12 * e.step_time_s for k, e in (("sdpa", sdpa), ("eager", eager), ("full", full))}
    assert flops["eager"] - flops["sdpa"] == pytest.approx(extra, rel=1e-9)
    # full recomputation runs each layer's forward once more: a third of the layers' model FLOPs
    layers = 3 * 12 * (12 * 768 * 768 * 2 + 4 * 768 * 1025 / 2) * tokens
    assert flops["full"] - flops["sdpa"] == pytest.approx(layers / 3, rel=1e-9)
    assert sdpa.mfu == pytest.approx(eager.mfu * eager.step_time_s / sdpa.step_time_s, rel=1e-12)
