"""Gradient clipping as each stack runs it by default (engine.clip_grad_norm, clip_grad_scope, clip_grad_bytes):
the norm's and the scale's memory passes over the gradients clipped, at the element-wise rate (advisor.optimizer)."""

import pytest

from advisor import estimate
from advisor.hardware import load_hardware

LLAMA3_8B = 8_030_261_248  # parameters (meta-llama/Meta-Llama-3-8B: 4096 hidden, 32 layers, 128256 vocab, untied)
MPT_7B = 6_649_286_656  # parameters (mosaicml/mpt-7b: 4096 d_model, 32 layers, vocab 50432, tied embedding)
H100 = load_hardware("dgx-h100")
ELEMENTWISE_S_PER_BYTE = 1.0 / (3350e9 * 0.757)  # H100 SXM 3.35 TB/s datasheet x the profile's element-wise share


def _clip_s(tmp_path, model, stack, **kw):
    """Seconds the stack's clipping adds to the optimizer step: the profile against itself with clipping off."""
    off = tmp_path / f"{stack}-noclip.yaml"
    off.write_text(f"base: {stack}\nname: noclip\ndescription: t\nengine: {{clip_grad_norm: false}}\n")
    on = estimate(model, H100, stack=stack, **kw).breakdown["optimizer"]
    return on - estimate(model, H100, stack=str(off), **kw).breakdown["optimizer"]


@pytest.mark.parametrize("stack,model,params,zero,seq,bytes_,ms", [
    # HF Trainer: max_grad_norm 1.0 (training_args.py:866), FSDP1's clip_grad_norm_ on the fp32 shard: norm r 4, scale
    # r+w 8 (fully_sharded_data_parallel.py:1167, 1203-1204); Llama 3 8B on 8 H100s under ZeRO-3: 4.75 ms a step
    ("hf-trainer", "llama3-8b", LLAMA3_8B, 3, 8192, 12.0, 4.75),
    # torchtitan: max_norm 1.0 (config/configs.py:55), foreach norm and scale of the fp32 DTensor shards
    # (distributed/utils.py:652, 675): the same 12 bytes on the same shard
    ("torchtitan", "llama3-8b", LLAMA3_8B, 3, 8192, 12.0, 4.75),
    # DeepSpeed: each bf16 partition gradient cast to fp64 and normed (r 2, w 8, r 8: stage_1_and_2.py:2683-2685,
    # zero/utils.py:59-63), the fp32 partition scaled (r 4, w 4: :3214): 26 bytes, 10.29 ms under ZeRO-3 and ZeRO-1
    ("deepspeed", "llama3-8b", LLAMA3_8B, 3, 8192, 26.0, 10.29),
    ("deepspeed", "llama3-8b", LLAMA3_8B, 1, 8192, 26.0, 10.29),
    # the Trainer's ZeRO-1 is DeepSpeed's engine through accelerate's plugin (the profile's zero_buffers.stages): its
    # clip, 26 bytes, not FSDP1's 12 (accelerator.clip_grad_norm_ only reads the engine's norm: accelerator.py:3023-3027)
    ("hf-trainer", "llama3-8b", LLAMA3_8B, 1, 8192, 26.0, 10.29),
    # llm-foundry: the MPT YAMLs' gradient_clipping norm 1.0 through FSDP1's clip_grad_norm_ (fp32 shards): 3.93 ms
    ("llm-foundry", "mpt-7b", MPT_7B, 3, 2048, 12.0, 3.93),
])
def test_clipping_reads_and_scales_the_stepped_shard(tmp_path, stack, model, params, zero, seq, bytes_, ms):
    kw = dict(gpus=8, zero=zero, seq=seq, global_batch=64, precision="bf16-mixed")
    clip = _clip_s(tmp_path, model, stack, **kw)
    assert clip == pytest.approx(params / 8 * bytes_ * ELEMENTWISE_S_PER_BYTE, rel=0.01)
    assert clip * 1e3 == pytest.approx(ms, rel=0.01)


def test_nanotron_clips_every_fp32_gradient_buffer_not_its_zero1_slice(tmp_path):
    """nanotron's clip_grad_norm takes the grad accumulator's fp32 buffer of every parameter, ZeRO-1 or not
    (optim/clip_grads.py:44-49, 86-92): 12 bytes x the whole model on each of 8 data-parallel ranks, 38.0 ms, eight
    times the ZeRO-1 slice's."""
    for zero in (0, 1):
        clip = _clip_s(tmp_path, "llama3-8b", "nanotron", gpus=8, zero=zero, seq=8192, global_batch=64,
                       precision="bf16-mixed")
        assert clip == pytest.approx(LLAMA3_8B * 12.0 * ELEMENTWISE_S_PER_BYTE, rel=0.01)
        assert clip * 1e3 == pytest.approx(38.0, rel=0.01)


def test_litgpt_finetuning_does_not_clip(tmp_path):
    """litgpt 0.5.13's TrainArgs.max_norm defaults to None (args.py:38) and finetune/full.py refuses it (:445): its
    profile turns off the clipping it would inherit from hf-trainer."""
    assert _clip_s(tmp_path, "llama3-8b", "litgpt", gpus=8, zero=3, seq=2048, global_batch=64, precision="bf16",
                   recompute="full") == 0.0


def test_deepspeed_clips_its_fp32_partition_in_pure_bf16_too(tmp_path):
    """DeepSpeed keeps the fp32 partition and norms in fp64 whatever the precision (stage_1_and_2.py:2683-2685, :3214):
    26 bytes a stepped parameter under bf16 as under bf16-mixed, where torch's foreach clip of pure bf16 gradients
    (hf-trainer) moves half of 12: 2.37 ms against DeepSpeed's 10.29 ms for Llama 3 8B on 8 H100s under ZeRO-3."""
    kw = dict(gpus=8, zero=3, seq=8192, global_batch=64, precision="bf16")
    assert _clip_s(tmp_path, "llama3-8b", "deepspeed", **kw) == pytest.approx(
        LLAMA3_8B / 8 * 26.0 * ELEMENTWISE_S_PER_BYTE, rel=0.01)
    assert _clip_s(tmp_path, "llama3-8b", "hf-trainer", **kw) == pytest.approx(
        LLAMA3_8B / 8 * 6.0 * ELEMENTWISE_S_PER_BYTE, rel=0.01)


def test_megatron_deepspeed_norms_and_scales_fp32_gradients_every_step(tmp_path):
    """Megatron-DeepSpeed under deepspeed 0.9.5, vTrain's ZeRO-0 fp16: FP16_Optimizer.step norms the flat fp32 gradient
    group and multiplies it by the combined unscale-and-clip factor every step (fp16/fused_optimizer.py:272, 335;
    runtime/utils.py:417): 12 bytes a parameter, of which the multiply's r+w is fp16's unscale, there with clipping off
    too (deepspeed 0.19.8 fp16/fused_optimizer.py:374-385, combined_scale): clipping adds the norm's 4 bytes, 2.36 ms a step for the vTrain row GPT (16 layers,
    h 2048, vocab 50257, 910,759,936 parameters) on 4 A100s at DP 4. Its ZeRO-3 norms each fp16 partition gradient in
    fp64 and scales the fp32 partition (zero/stage3.py:1518, 1898; clip_grad_bytes_zero): 26 bytes of the 1/8
    partition on 8 GPUs less the 8 of the unscale, 1.33 ms."""
    from validation.datasets import load_vtrain
    row = next(r for r in load_vtrain() if (r.tp, r.pp, r.dp, r.n_layers, r.d_model) == (1, 1, 4, 16, 2048))
    off = tmp_path / "mds-noclip.yaml"
    off.write_text("base: megatron-deepspeed\nname: noclip\ndescription: t\nengine: {clip_grad_norm: false}\n")
    a100_s_per_byte = 1.0 / (2039e9 * 0.757)  # A100 SXM 2,039 GB/s datasheet x dgx-a100's element-wise share
    for update, params, bytes_, ms in (({}, 910_759_936, 12.0 - 8.0, 2.36),
                                       (dict(gpus=8, dp=8, zero=3), 910_759_936 / 8, 26.0 - 8.0, 1.33)):
        kw = {**row.estimate_kwargs(), **update}
        on, no = (estimate(**{**kw, "stack": s}) for s in ("megatron-deepspeed", str(off)))
        assert on.params == 910_759_936
        clip = on.breakdown["optimizer"] - no.breakdown["optimizer"]
        assert clip == pytest.approx(params * bytes_ * a100_s_per_byte, rel=0.01)
        assert clip * 1e3 == pytest.approx(ms, rel=0.01)


def test_exports_write_no_clipping_where_none_was_costed(tmp_path):
    """A profile costed without clipping (engine.clip_grad_norm false) exports gradient_clipping 0.0 and
    --clip-grad 0.0, which DeepSpeed and Megatron-LM take as no clip (deepspeed 0.19.8 zero/stage_1_and_2.py:3194-3199;
    megatron-core 0.19.2 optimizer/optimizer.py:830), and turns off ZeRO-1/2's norm (zero/config.py:143, 390-392);
    the shipped profiles, which clip, keep 1.0 (Megatron-LM's --clip-grad default, arguments.py:2505)."""
    import json

    from advisor.export import export
    from advisor.layout import Plan
    from advisor.model import load_model
    from advisor.training import TrainingSetup

    model, setup = load_model("llama3-8b"), TrainingSetup(seq_len=2048, micro_batch=1, global_batch=8, precision="bf16-mixed")
    for base, kind, plan in (("deepspeed", "deepspeed", Plan(dp=8, zero=1)), ("megatron-core", "megatron", Plan(dp=8))):
        off = tmp_path / f"{base}-noclip.yaml"
        off.write_text(f"base: {base}\nname: noclip\ndescription: t\nengine: {{clip_grad_norm: false}}\n")
        for stack, clip in ((base, 1.0), (str(off), 0.0)):
            out = export(kind, model, H100, plan, setup, 1, 8, stack)
            if kind == "deepspeed":
                cfg = json.loads(out.text)
                assert cfg["gradient_clipping"] == clip
                assert cfg["zero_optimization"].get("compute_grad_norm", True) is (clip > 0)
            else:
                assert f"--clip-grad {clip}" in out.text


def test_deepspeed_fp16_unscales_in_its_clip_multiply(tmp_path):
    """DeepSpeed's fp16 unscale is the clip's one mul_ by 1 / (clip x loss_scale) (deepspeed 0.19.8
    zero/stage_1_and_2.py:3199-3216), already in clip_grad_bytes' r 4 w 4: the GradScaler's unscale r+w (8 of
    GRAD_SCALER_BYTES' 12) is not counted again, 25.3 ms a step less for Llama 3 8B at ZeRO-1 on 8 H100s."""
    twice = tmp_path / "ds-twice.yaml"
    twice.write_text("base: deepspeed\nname: twice\ndescription: t\nengine: {clip_unscales: false}\n")
    kw = dict(gpus=8, zero=1, seq=8192, global_batch=64, precision="fp16-mixed")
    saved = (estimate("llama3-8b", H100, stack=str(twice), **kw).breakdown["optimizer"]
             - estimate("llama3-8b", H100, stack="deepspeed", **kw).breakdown["optimizer"])
    assert saved == pytest.approx(LLAMA3_8B * 8.0 * ELEMENTWISE_S_PER_BYTE, rel=0.01)
    assert saved * 1e3 == pytest.approx(25.3, rel=0.01)


def test_megatron_core_unscales_in_a_pass_of_its_own():
    """megatron-core's fp16 unscale is _unscale_main_grads_and_check_for_nan (optimizer/optimizer.py:713-724), before
    and apart from the clip: its profile does not inherit megatron-deepspeed's folded unscale."""
    from advisor.stack import load_stack
    assert [load_stack(n).engine.clip_unscales for n in ("megatron-core", "megatron-bridge-perf", "megatron-deepspeed",
                                                          "deepspeed")] == [False, False, True, True]


def test_the_trainers_zero1_clips_and_unscales_as_deepspeeds_engine():
    """The Trainer's ZeRO-1 is DeepSpeed's engine (accelerate's plugin; the profile's zero_buffers.stages): its clip
    is 26 bytes a stepped parameter and, under fp16, its unscale that clip's multiply (clip_grad_bytes_zero,
    clip_unscales_zero), so its optimizer step costs the deepspeed stack's, 36.99 ms for Llama 3 8B on 8 H100s in fp16
    (24.32 in bf16); its ZeRO-2 is FSDP1's (torch's 12-byte clip and GradScaler's own unscale pass): dearer in fp16."""
    kw = dict(gpus=8, zero=1, micro_batch=1, global_batch=64, seq=4096)
    for precision, ms in (("fp16-mixed", 36.99), ("bf16-mixed", 24.32)):
        trainer = estimate("llama3-8b", H100, stack="hf-trainer", precision=precision, **kw).breakdown["optimizer"]
        assert trainer == pytest.approx(estimate("llama3-8b", H100, stack="deepspeed", precision=precision,
                                                 **kw).breakdown["optimizer"], rel=1e-9)
        assert trainer * 1e3 == pytest.approx(ms, rel=0.001)
    fsdp1 = estimate("llama3-8b", H100, stack="hf-trainer", precision="fp16-mixed", **{**kw, "zero": 2})
    assert fsdp1.breakdown["optimizer"] * 1e3 == pytest.approx(56.78, rel=0.001)
