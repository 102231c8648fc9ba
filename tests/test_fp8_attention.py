"""FP8 attention (--fp8-attention; Megatron's fp8_dot_product_attention): the attention core at the FP8 rate, its
quantisation kernels, where Transformer Engine runs it, and the Bridge rows whose recipes set it."""

from __future__ import annotations

import pytest

from advisor import estimate
from advisor.compute import attention_core_time, mem_time
from advisor.precision import FP8_ATTENTION_EFFICIENCY, fp8_attention_bytes
from advisor.errors import AdvisorError
from advisor.hardware import load_hardware
from advisor.model import load_model
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload


def _workload(fp8_attention: bool, precision: str = "mxfp8", hw: str = "dgx-b200") -> Workload:
    setup = TrainingSetup(seq_len=8192, precision=precision, fp8_attention=fp8_attention, stack="megatron-core")
    return Workload.of(load_model("llama3-8b"), load_hardware(hw), load_stack("megatron-core"), setup)


def test_the_core_runs_at_the_fp8_peak_plus_its_casts():
    # B200: 2250 TFLOP/s BF16, 4500 FP8 dense (NVIDIA B200 datasheet, the profile peak_tflops): half the kernel time
    # at the same share of peak, over FlashAttention-3's FP8-to-BF16 share of peak on H100 (1.2 PFLOP/s of 1,979 over
    # 740 TFLOP/s of 989.4: its abstract): 0.617 of the BF16 kernel's time, a 1.62x speed-up
    bf16, fp8 = _workload(False), _workload(True)
    assert bf16.hw.gpu.peak_tflops["fp8"] / bf16.hw.gpu.peak_tflops["bf16"] == 2.0
    fixed = bf16.hw.efficiency.matmul_fixed_us.get("bf16", 0.0) * 1e-6
    (f0, b0), (f1, b1) = attention_core_time(bf16, 8192.0, 1), attention_core_time(fp8, 8192.0, 1)
    cf, cb = (mem_time(fp8.hw, b) for b in fp8_attention_bytes(fp8, 8192.0, 1))
    assert FP8_ATTENTION_EFFICIENCY == pytest.approx(0.8108, abs=1e-4)
    assert f1 - cf - fixed == pytest.approx(0.5 / FP8_ATTENTION_EFFICIENCY * (f0 - fixed), rel=1e-12)
    assert (f0 - fixed) / (f1 - cf - fixed) == pytest.approx(1.62, abs=0.005)
    assert b1 - cb == pytest.approx(2.5 * (f1 - cf), rel=1e-12)  # flash backward: 2.5x the forward (FA2 s.3)


def test_the_casts_are_q_k_v_forward_and_do_backward_at_the_mxfp8_bytes():
    # Llama 3 8B: 32 query heads, 8 KV heads of 128 (config.json): Q 4096 + K 1024 + V 1024 = 6144 elements a token;
    # dO 4096. MXFP8 quantises each into both orientations in one pass: 2 read + 2 x (1 + 1/32) written = 4.0625 B
    w = _workload(True)
    fwd, bwd = fp8_attention_bytes(w, 1000.0, 1)
    assert fwd == pytest.approx(4.0625 * 6144 * 1000, rel=1e-12)
    assert bwd == pytest.approx(4.0625 * 4096 * 1000, rel=1e-12)


def test_fp8_attention_speeds_up_a_long_sequence_step():
    kw = dict(model="llama3-8b", hw="dgx-b200", gpus=8, precision="mxfp8", stack="megatron-core", seq=8192)
    assert estimate(**kw, fp8_attention=True).step_time_s < 0.97 * estimate(**kw).step_time_s


@pytest.mark.parametrize("kw, says", [
    (dict(precision="bf16-mixed"), "not bf16-mixed"),
    (dict(precision="fp8-blockwise"), "not fp8-blockwise"),  # TE 2.20 utils.py:792: no FP8 attention under it
    (dict(precision="fp8-tensorwise", hw="dgx-h100"), "needs Blackwell"),  # utils.py:759: current scaling on sm < 100
    (dict(precision="mxfp8", stack="torchtitan"), "runs no FP8 attention"),
    (dict(precision="mxfp8", attention="eager"), "--attention sdpa"),  # unfused: "Disabling ... for FP8 attention"
])
def test_where_fp8_attention_cannot_run_one_line(kw, says):
    args = {**dict(model="llama3-8b", hw="dgx-b200", gpus=8, stack="megatron-core", fp8_attention=True), **kw}
    with pytest.raises(AdvisorError) as err:
        estimate(**args)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("model, says", [
    (dict(model="gpt-oss-120b", ep=8), "attention sinks and sliding-window layers"),
    (dict(model="mistral-7b"), "sliding-window layers"),
])
def test_sinks_and_windows_take_fp8_attention_on_blackwell_only(model, says):
    """Transformer Engine 2.20.2 trains FP8 attention in FusedAttention alone (FlashAttention off for FP8 training,
    unfused off for FP8: attention/dot_product_attention/utils.py:722-745) and turns that off for learnable softmax
    (:1225-1234) and sliding windows (:1443-1453) on sm < 100: no backend on an H100, which delayed scaling otherwise
    runs (test_delayed_scaling_runs_it_on_hopper); a B200 runs it."""
    kw = dict(gpus=8, precision="fp8-delayed", stack="megatron-core", seq=4096, fp8_attention=True, **model)
    with pytest.raises(AdvisorError) as err:
        estimate(hw="dgx-h100", **kw)
    assert says in str(err.value) and "sm_100" in str(err.value) and "\n" not in str(err.value)
    on, off = (estimate(hw="dgx-b200", **{**kw, "fp8_attention": f}) for f in (True, False))
    assert on.step_time_s < off.step_time_s


def test_delayed_scaling_runs_it_on_hopper():
    kw = dict(model="llama3-8b", hw="dgx-h100", gpus=8, precision="fp8-delayed", stack="megatron-core", seq=8192)
    assert estimate(**kw, fp8_attention=True).step_time_s < estimate(**kw).step_time_s


def test_the_bridge_moe_rows_whose_recipe_sets_it():
    from validation.bridge_moe import SYSTEMS, estimate_kwargs, load_rows
    on = {(r["model"], r["system"], r["precision"]) for r in load_rows(SYSTEMS) if estimate_kwargs(r)[0]["fp8_attention"]}
    # megatron-bridge 0.6.2 perf_recipes: deepseek/gb300/deepseek_v3.py:154 True, gb200:157 the default False;
    # gpt_oss/common.py:74 and qwen/common.py:57 True for their GB200 / GB300 MXFP8 recipes
    assert on == {("DeepSeekV3", "DGX-GB300", "MXFP8"), ("GPT OSS 120B", "DGX-GB300", "MXFP8"),
                  ("GPT OSS 120B", "DGX-GB200", "MXFP8"), ("Qwen3_30B_a3B", "DGX-GB300", "MXFP8"),
                  ("Qwen3_30B_a3B", "DGX-GB200", "MXFP8"), ("Qwen3_235B_a22B", "DGX-GB300", "MXFP8"),
                  ("Qwen3_235B_a22B", "DGX-GB200", "MXFP8")}


def test_stack_any_leaves_out_the_stacks_without_it():
    from advisor import plan
    res = plan(model="llama3-8b", hw="dgx-b200", gpus=8, precision="mxfp8", stack="any", fp8_attention=True, top=1)
    assert "runs no FP8 attention" in res.left_out["torchtitan"]
    assert {r.estimate.setup.stack for r in res.plans} <= {"megatron-core", "megatron-bridge-perf"}


def test_the_exports_say_what_the_file_cannot_set():
    # Megatron-LM 0.19 arguments.py:2224,2250: fp8_dot_product_attention among the fields with "no CLI argument";
    # Bridge: the named recipe's False overwrites the model's (training/mixed_precision.py:138-156)
    from advisor.api import build_inputs
    from advisor.export import export
    from advisor.layout import resolve_grad_accum
    spec, hw, stack, p, setup, world = build_inputs("llama3-8b", "dgx-b200", gpus=8, precision="mxfp8",
                                                    stack="megatron-core", fp8_attention=True)
    args = (spec, hw, p, setup, resolve_grad_accum(setup, p)[0], world)
    assert any("--fp8-dot-product-attention" in n for n in export("megatron", *args, stack=stack).notes)
    assert any("fp8_dot_product_attention = True" in n for n in export("megatron-bridge", *args, stack=stack).notes)


def test_the_help_names_no_megatron_lm_flag_that_megatron_lm_lacks():
    """--fp8-attention's help named "Megatron's --fp8-dot-product-attention", a flag megatron-core 0.19.2's
    megatron/training/arguments.py does not define (fp8_dot_product_attention is among the TransformerConfig fields it
    leaves out, arguments.py:2250), while the Megatron export's own note says so: the help names the config field."""
    import os

    from click.testing import CliRunner

    from advisor.cli import cli

    for command in ("estimate", "plan", "export"):
        text = " ".join(CliRunner().invoke(cli, [command, "--help"]).output.split())
        assert "--fp8-dot-product-attention" not in text and "fp8_dot_product_attention" in text, command
    args = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".megatron-lm", "megatron",
                        "training", "arguments.py")
    if os.path.isfile(args):  # the README's test install unpacks megatron-core 0.19.2 there
        assert "'--fp8-dot-product-attention'" not in open(args).read()


def test_the_text_output_says_fp8_attention_was_costed():
    """--fp8-attention runs the attention core at the FP8 rate (a faster step), yet neither estimate's plan line nor
    plan's header said so, as they say MTP depths: a step costed with it read as one without it."""
    from advisor.render import render_estimate
    from advisor.search import plan

    kw = dict(gpus=8, ep=8, zero=1, micro_batch=1, global_batch=8, seq=4096, precision="mxfp8", stack="megatron-core")
    on, off = (estimate("qwen3-30b-a3b", "dgx-b200", fp8_attention=f, **kw) for f in (True, False))
    assert on.step_time_s < off.step_time_s  # it changed the step
    assert render_estimate(on).splitlines()[1].endswith(", adamw-fused, FP8 attention")
    assert "FP8 attention" not in render_estimate(off).splitlines()[1]
    head = plan("qwen3-30b-a3b", "dgx-b200", gpus=8, global_batch=8, seq=4096, top=1, precision="mxfp8",
                stack="megatron-core", fp8_attention=True).header()
    assert ", mxfp8, FP8 attention;" in head


@pytest.mark.parametrize("precision, per_token", [
    # Llama 3 8B: Q 4096 + K 1024 + V 1024 = 6144 elements a token, O 4096 (config.json). Transformer Engine 2.20.2
    # FusedAttnFunc saves q_fp8, k_fp8, v_fp8 for the backward in place of the BF16 q, k, v (backends.py:1762-1767):
    # MXFP8 in both orientations (utils.py:3044 rowwise, :3070-3071 columnwise too), each 1 byte + an E8M0 scale per
    # 32: 2 x 1.03125 - 2 = +0.0625 B an element, +384 B a token; current scaling one orientation of 1 byte: -1 B an
    # element (O stays the BF16 tensor linear_proj keeps, :1763-1765); delayed scaling its O in FP8 too (:1766-1767),
    # the BF16 O let go: -6144 - 4096 B
    ("mxfp8", 384.0), ("fp8-tensorwise", -6144.0), ("fp8-delayed", -10240.0)])
def test_fp8_attention_keeps_its_quantised_q_k_v_not_bf16_ones(precision, per_token):
    from advisor.precision import fp8_attention_saved
    hw = "dgx-h100" if precision == "fp8-delayed" else "dgx-b200"
    w = _workload(True, precision, hw)
    assert fp8_attention_saved(w, 1) == pytest.approx(per_token, rel=1e-12)
    assert fp8_attention_saved(w, 2) == pytest.approx(per_token / 2, rel=1e-12)  # the heads split over TP
    assert fp8_attention_saved(_workload(False, precision, hw), 1) == 0.0
    # one GPU's activations, no recomputation, no pipeline: 32 layers x 8192 tokens of it
    kw = dict(model="llama3-8b", hw=hw, gpus=8, tp=1, pp=1, zero=1, micro_batch=1, global_batch=8, seq=8192,
              stack="megatron-core", recompute="none", precision=precision)
    on, off = (estimate(**kw, fp8_attention=f).memory.parts["activations"] for f in (True, False))
    assert on - off == pytest.approx(32 * 8192 * per_token, rel=1e-9)


def test_under_fp8_attention_mla_up_proj_frees_no_bf16_q_k_v():
    # mla_up_proj's checkpoint discards the BF16 query, key and value (megatron-core 0.19.2 multi_latent_attention.py:
    # 454-457) that BF16 attention saves; FP8 attention saves its own MXFP8 copies instead, which stay: FP8 attention
    # then adds all of them. DeepSeek-V2-Lite: 16 heads, Q 16 x 192 + K 16 x 192 + V 16 x 128 = 8192 elements a token
    # (config.json), 2 x (1 + 1/32) B each = 16,896 B a token (no recompute: 8192 x 0.0625 = 512); 27 layers of 4096
    # tokens. With core_attn the checkpoint keeps the BF16 q, k, v and the core saves nothing: no change
    kw = dict(model="deepseek-v2-lite", hw="dgx-b200", gpus=8, tp=1, pp=1, ep=8, zero=1, micro_batch=1, global_batch=8,
              seq=4096, stack="megatron-core", precision="mxfp8")
    for policy, per_token in ((dict(recompute="none"), 512.0), (dict(recompute="selective", recompute_modules="mla_up_proj"),
                              16896.0), (dict(recompute="selective", recompute_modules="core_attn,mla_up_proj"), 0.0)):
        on, off = (estimate(**kw, **policy, fp8_attention=f).memory.parts["activations"] for f in (True, False))
        assert on - off == pytest.approx(27 * 4096 * per_token, rel=1e-9), policy


@pytest.mark.parametrize("fp8_attention, sel_minus_none", [
    # Llama 3 8B, one GPU, 32 layers x 8192 tokens, Q 4096 + K 1024 + V 1024 = 6144 elements a token, O 4096. Under
    # delayed scaling megatron-core does not set_save_original_input on linear_proj (0.19.2 attention.py:428-443), so
    # Transformer Engine 2.20.2's Linear saves its FP8 copy of O and not the BF16 one (linear.py:395-422, 693-717). With
    # core_attn rerun no op saves the BF16 O (the checkpoint keeps its inputs q, k, v): O is 1 B, not 2 B + its copy,
    # 2 B a element less than no recomputation (which keeps the BF16 O for the core's backward beside the copy); and the
    # checkpoint's value, a view of linear_qkv's output, keeps that output whole beside the new q and k: 2 q + 2 kv more
    # (advisor.memory checkpointed_qkv_kept: 2 x 4096 + 2 x 1024); the core run under no_grad keeps no fp32 softmax
    # statistics (tensor_parallel/random.py:606): 4 B x 32 heads less
    (False, -2.0 * 4096 + 10240.0 - 128.0),
    # FP8 attention: no recomputation keeps the core's FP8 Q, K, V and O and linear_proj's FP8 O (1 + 1 B); core_attn
    # keeps the checkpoint's BF16 q, k, v (+1 B an element) and linear_proj's FP8 O alone (-1 B): selective keeps
    # more than none here, as Transformer Engine does; with linear_qkv's whole output kept by the value's view, as above
    (True, 6144.0 - 4096.0 + 10240.0 - 128.0)])
def test_core_attn_recompute_under_delayed_scaling_keeps_linear_proj_fp8_copy_alone(fp8_attention, sel_minus_none):
    kw = dict(model="llama3-8b", hw="dgx-h100", tp=1, dp=1, micro_batch=1, grad_accum=1, seq=8192,
              precision="fp8-delayed", stack="megatron-core", fp8_attention=fp8_attention)
    none, sel = (estimate(**kw, recompute=r).memory.parts["activations"] for r in ("none", "selective"))
    assert sel - none == pytest.approx(32 * 8192 * sel_minus_none, rel=1e-9)
    # current scaling keeps the BF16 O itself (set_save_original_input): core_attn changes nothing of O, and adds the
    # fused QKV output its checkpoint's value view keeps (2 q + 2 kv)
    kw.update(precision="fp8-tensorwise", fp8_attention=False)
    none, sel = (estimate(**kw, recompute=r).memory.parts["activations"] for r in ("none", "selective"))
    assert sel - none == pytest.approx(32 * 8192 * (10240.0 - 128.0), rel=1e-9)
