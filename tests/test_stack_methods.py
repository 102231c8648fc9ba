"""Which fine-tuning methods a stack runs (engine.methods), each read from the library: a plan in a stack that cannot
run its method is refused in one line naming the stacks that can, and --stack auto / any cost adapters only where
they run (a QLoRA plan once went to megatron-core, which has no quantised base, because the model was too large for
one GPU in hf-trainer)."""

from __future__ import annotations

import re

import pytest

from advisor import estimate, plan
from advisor.errors import AdvisorError
from advisor.stack import list_stacks, load_stack

# from each library's source (the profiles cite the files): PEFT + bitsandbytes under the Trainer or the DeepSpeed
# engine, litgpt's finetune_lora --quantize; LoRA without a quantised base in Megatron-Bridge's peft/, torchtitan
# 0.3.0's components/lora.py; none in Megatron-DeepSpeed, nanotron 0.4, llm-foundry 0.1.0 (the 2023 sweep's era) or
# torchtitan 0.1.0-0.2.2; llm-foundry 0.22's peft_config runs on its Hugging Face models, which its profile (probed on
# MPT) cannot cost: full only there; torch 1.11 (March 2022) came before PEFT's first release (January 2023)
METHODS = {"hf-trainer": ["full", "lora", "qlora"], "deepspeed": ["full", "lora", "qlora"],
           "litgpt": ["full", "lora", "qlora"], "megatron-core": ["full", "lora"],
           "megatron-bridge-perf": ["full", "lora"], "torchtitan": ["full", "lora"], "llm-foundry": ["full"],
           "llm-foundry-2023": ["full"], "megatron-deepspeed": ["full"], "nanotron": ["full"], "torchtitan-0.2": ["full"], "torchtitan-0.1": ["full"],
           "litgpt-2023": ["full", "lora", "qlora"], "torch-1.11": ["full"]}


def test_every_shipped_stack_says_which_methods_it_runs():
    assert {n: load_stack(n).engine.methods for n in list_stacks()} == METHODS


@pytest.mark.parametrize("stack, zero, method, fix", [
    ("megatron-core", 3, "qlora", "use --stack deepspeed or hf-trainer or litgpt or litgpt-2023"),
    ("nanotron", 1, "lora", "use --stack deepspeed or hf-trainer or litgpt or litgpt-2023 or megatron-bridge-perf or "
                            "megatron-core or torchtitan"),
])
def test_a_method_the_stack_does_not_run_is_refused_in_one_line(stack, zero, method, fix):
    with pytest.raises(AdvisorError) as err:
        estimate(model="llama3-8b", hw="dgx-h100", gpus=8, zero=zero, method=method, stack=stack)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"stack {stack} does not run {method} fine-tuning") and msg.endswith(fix)


def test_int8_lora_needs_a_quantising_stack_too():
    with pytest.raises(AdvisorError, match="does not run qlora fine-tuning"):
        estimate(model="llama3-8b", hw="dgx-h100", gpus=8, zero=3, method="lora", quant="int8", stack="torchtitan")


def test_auto_costs_adapters_where_they_run():
    """Llama 2 70B does not fit one H100 in hf-trainer, so auto's data-parallel stack is megatron-core: LoRA on its
    fused qkv stays there (Megatron-Bridge's PEFT), LoRA on q and v apart (PEFT's default, which Bridge's linear_qkv
    adapter cannot be) and QLoRA go to hf-trainer (PEFT + bitsandbytes, FSDP). --stack any ranks only the stacks that
    run the method."""
    kw = dict(model="llama2-70b", hw="dgx-h100", gpus=8, zero=3, recompute="full")
    lora = estimate(method="lora", lora_targets="qkv", **kw)
    peft_lora, qlora = estimate(method="lora", **kw), estimate(method="qlora", **kw)
    assert (lora.stack, peft_lora.stack, qlora.stack) == ("megatron-core", "hf-trainer", "hf-trainer")
    found = plan(model="llama2-70b", hw="dgx-h100", gpus=8, method="qlora", stack="any", top=200)
    # litgpt runs QLoRA too, but describes no bf16-mixed (autocast) activations: --stack any leaves it out here
    assert {s.name for s in found.stacks} == {"hf-trainer", "deepspeed"}
    assert {p.estimate.stack for p in found.plans} <= {"hf-trainer", "deepspeed"}


def test_the_plan_header_says_the_method():
    res = plan(model="llama3-8b", hw="rtx-4090", gpus=1, method="qlora", seq=2048, top=1)
    assert "qlora r=8 on q,v, frozen base in NF4;" in res.header()
    assert "frozen base" not in plan(model="gpt2", hw="dgx-a100", gpus=1, top=1).header()


@pytest.mark.parametrize("precision, method, probed", [
    ("bf16", "full", 11_800), ("bf16", "lora", 10_456), ("fp32", "full", 21_528), ("fp32", "lora", 15_704)])
def test_hf_llama_layer_saves_what_peft_lora_keeps(precision, method, probed):
    """Bytes one layer keeps per token (2-layer minus 1-layer transformers 5.23 LlamaForCausalLM: 256 wide, 704 FFN,
    4 heads, seq 64, SDPA; PEFT 0.21 LoRA r=8 on q_proj, v_proj, no dropout; saved tensors by grad_fn, deduplicated
    by storage, 2026-11-29). Under LoRA the frozen norms keep no normalised hidden for their weights' gradients
    (norm_weight_inputs), and in bf16 PEFT's fp32 adapters keep an fp32 cast of their input each; in fp32 the
    adapters share the frozen linears' input. The fp32 LoRA probe's 15,704.25 includes 0.25 of rotary constants."""
    from advisor.adapters import saved_delta_per_token
    from advisor.finetune import FineTune
    from advisor.hardware import load_hardware
    from advisor.model import llama_like
    from advisor.training import TrainingSetup
    from advisor.workload import Workload

    ft = FineTune(method="lora", targets="q,v", lora_dropout=0.0) if method == "lora" else FineTune()
    setup = TrainingSetup(seq_len=64, micro_batch=1, precision=precision, finetune=ft)
    w = Workload.of(llama_like("tiny", 2, 256, 4, 4, 704, 128, 64), load_hardware("dgx-a100"), load_stack("hf-trainer"),
                    setup)
    assert float(w.tables.saved_layer.per_gpu(1, False, 0.0)) + saved_delta_per_token(w) == pytest.approx(probed, abs=1)


def test_a_decoder_megatron_core_cannot_build_is_costed_where_it_runs():
    """megatron-core 0.19's TransformerLayer runs the MLP on the attention's output (transformer_layer.py forward):
    Falcon-7B's parallel attention + MLP blocks are not its model, nor Megatron-DeepSpeed's. Asked for, a one-line
    error; under --stack auto its plans go to hf-trainer, which runs no pipeline (DeepSpeed's AutoTP its only TP)."""
    with pytest.raises(AdvisorError, match=r"stack megatron-core's model code does not build falcon-7b, which has "
                                        r"parallel attention \+ MLP blocks: use --stack deepspeed or hf-trainer or "
                                        r"llm-foundry$"):
        estimate(model="falcon-7b", hw="dgx-h100", gpus=8, zero=1, stack="megatron-core")
    res = plan("falcon-7b", "aws-p4d", nodes=2, top=5)
    assert res.plans and {p.estimate.setup.stack for p in res.plans} == {"hf-trainer"}
    assert all(p.plan.pp == 1 and not p.plan.sp for p in plan("falcon-7b", "aws-p4d", nodes=2, top=100_000).plans)


def test_blooms_tensor_and_pipeline_plans_are_megatron_deepspeeds():
    """BLOOM-176B trained in BigScience's Megatron-DeepSpeed at TP 4 x PP 12 with ALiBi, which megatron-core's code has
    not: --stack auto costs its TP/PP plans there (auto.AUTO_MODEL_PARALLEL_ELSE), not in hf-trainer, whose Trainer
    runs no pipeline (accelerate 1.15's ParallelismConfig has no stage axis) and whose export could not write one."""
    from advisor.export import export
    from advisor.hardware import load_hardware
    from advisor.model.catalogue import load_model

    res = plan("bloom-176b", "dgx-a100", gpus=384, global_batch=384, seq=2048, top=10)
    assert {p.estimate.setup.stack for p in res.plans if p.plan.tp > 1 or p.plan.pp > 1} == {"megatron-deepspeed"}
    assert any(p.plan.pp > 1 for p in res.plans)
    # each exports: Megatron-LM's flags have no ALiBi, so auto ranks what its DeepSpeed JSON writes (PipelineModule's
    # 1F1B over an even split; no interleaving, CP, EP or SP), where the top rows were uneven interleaved pipelines
    for p in res.plans:
        e = p.estimate
        assert p.plan.schedule.value == "1f1b" and p.plan.pp_split.value == "even" and p.plan.cp == 1
        assert not p.plan.sp  # AutoTP, which the JSON writes, shards no sequence
        out = export(None, load_model("bloom-176b"), load_hardware("dgx-a100"), e.plan, e.setup, e.grad_accum,
                     e.world_size, e.stack)
        assert out.kind == "deepspeed" if e.stack == "megatron-deepspeed" else out.kind in ("accelerate", "deepspeed")
    est = estimate(model="bloom-176b", hw="dgx-a100", gpus=384, tp=4, pp=12, micro_batch=1, global_batch=384, seq=2048)
    assert est.setup.stack == "megatron-deepspeed"
    with pytest.raises(AdvisorError, match=r"^invalid plan: hf-trainer does not run pipeline parallelism \(it runs DDP, "
                                           r"nn.DataParallel, ZeRO-1, .*tensor parallelism: use those, or --stack megatron-deepspeed\)$"):
        estimate(model="bloom-176b", hw="dgx-a100", gpus=384, tp=4, pp=12, micro_batch=1, seq=2048, stack="hf-trainer")


def test_llama4_is_costed_where_its_experts_run_routed():
    """transformers 5.23 modeling_llama4.py runs every expert on every token (Llama4TextMoe repeats the tokens per
    expert, Llama4TextExperts one torch.bmm): hf-trainer and deepspeed (its base) refuse Llama 4 in one line, naming
    stacks that build it; Megatron's flags have no chunked attention (export refuses it), so --stack auto costs its
    plans in torchtitan 0.2 (api.AUTO_NEITHER; 0.3.0 dropped Llama 4), whose Llama 4 routes (models/llama4), in
    estimate and plan alike."""
    for name in ("hf-trainer", "deepspeed"):
        with pytest.raises(AdvisorError, match=rf"stack {name}'s model code does not build llama4-scout, which has Llama "
                                               r"4's routed experts as routed \(transformers 5.23 Llama4TextExperts runs "
                                               r"every expert on every token, one dense bmm\): use --stack "):
            estimate(model="llama4-scout", hw="dgx-h100", gpus=16, zero=3, recompute="full", stack=name)
    # megatron-core's, Megatron-DeepSpeed's, litgpt's and torchtitan 0.3.0's masks are causal or sliding, never chunked
    for name in ("megatron-core", "megatron-deepspeed", "megatron-bridge-perf", "torchtitan", "litgpt"):
        with pytest.raises(AdvisorError, match=rf"stack {name}'s model code does not build llama4-scout, which has "
                                               r"chunked attention: use --stack torchtitan-0.1 or torchtitan-0.2$"):
            estimate(model="llama4-scout", hw="dgx-h100", gpus=16, zero=3, recompute="full", stack=name)
    res = plan("llama4-scout", "gb200-nvl72", gpus=64, seq=8192, global_batch=256, top=5)
    assert res.plans and {p.estimate.setup.stack for p in res.plans} == {"torchtitan-0.2"}
    best = res.plans[0].estimate
    again = estimate(model="llama4-scout", hw="gb200-nvl72", seq=8192, global_batch=256, **_layout(best))
    assert again.setup.stack == "torchtitan-0.2" and again.step_time_s == pytest.approx(best.step_time_s, rel=1e-9)


def _layout(est) -> dict:
    p, s = est.plan, est.setup
    return dict(gpus=p.world_size, dp=p.dp, tp=p.tp, pp=p.pp, ep=p.ep, cp=p.cp, zero=p.zero, sp=p.sp,
                micro_batch=s.micro_batch, recompute=s.recompute.value, cp_comm=p.cp_comm.value if p.cp_comm else None,
                schedule=p.schedule.value, virtual_stages=p.virtual_stages)


def test_alibi_models_are_not_megatron_cores():
    """megatron-core 0.19's GPTModel position_embedding_type: learned_absolute, rope, mrope, yarn, none; no ALiBi (MPT,
    BLOOM): asked for, a one-line error; under --stack auto their plans are costed in hf-trainer."""
    with pytest.raises(AdvisorError, match=r"stack megatron-core's model code does not build mpt-7b, which has ALiBi positions"):
        estimate(model="mpt-7b", hw="dgx-a100", gpus=16, zero=1, stack="megatron-core")
    res = plan("mpt-7b", "dgx-a100", gpus=16, top=3)
    assert res.plans and {p.estimate.setup.stack for p in res.plans} == {"hf-trainer"}


def test_megatron_cores_lora_takes_fused_modules_only():
    """Megatron-Bridge 0.6.2 peft/lora.py: target_modules linear_qkv, linear_proj, linear_fc1, linear_fc2, each adapted
    whole: q and v apart (PEFT's default), gate without up, or the head cannot be costed as it runs."""
    for targets in ("q,v", "gate,down", "qkv,head"):
        with pytest.raises(AdvisorError, match=r"stack megatron-core's LoRA adapts whole fused modules") as err:
            estimate(model="llama3-8b", hw="dgx-h100", gpus=8, tp=2, method="lora", lora_targets=targets,
                     stack="megatron-core")
        assert "\n" not in str(err.value)
    assert estimate(model="llama3-8b", hw="dgx-h100", gpus=8, tp=2, method="lora", lora_targets="qkv,o,gate,up,down",
                    stack="megatron-core").step_time_s > 0


@pytest.mark.parametrize("stack, optimizer", [("hf-trainer", "adamw-fused"), ("deepspeed", "adamw-fused"),
                                              ("torchtitan", "adamw-fused"), ("torchtitan-0.2", "adamw-fused"),
                                              ("megatron-core", "adamw-fused"), ("litgpt", "adamw"),
                                              ("llm-foundry", "adamw"), ("nanotron", "adamw")])
def test_the_optimizer_defaults_to_the_stacks_own(stack, optimizer):
    """transformers 5.23's TrainingArguments.optim is adamw_torch_fused with torch >= 2.8 (DeepSpeed's JSON AdamW builds
    its FusedAdam), torchtitan's optimizer.implementation "fused" (0.2.2 and 0.3.0), Megatron's --optimizer adam apex /
    Transformer Engine's FusedAdam; litgpt, llm-foundry and nanotron build torch's AdamW (foreach on CUDA). Asked for,
    --optimizer wins; the export writes what was costed."""
    kw = dict(gpus=8, dp=8, zero=3 if stack != "nanotron" else 1, seq=2048,
              recompute="full" if stack != "nanotron" else "none", precision="bf16" if stack == "litgpt" else "bf16-mixed")
    model = "llama3-8b" if stack not in ("llm-foundry",) else "mpt-7b"
    default = estimate(model=model, hw="dgx-h100", stack=stack, **kw)
    assert default.setup.optimizer.value == optimizer
    other = "adamw" if optimizer == "adamw-fused" else "adamw-fused"
    asked = estimate(model=model, hw="dgx-h100", stack=stack, optimizer=other, **kw)
    assert asked.setup.optimizer.value == other
    assert (asked.breakdown["optimizer"] > default.breakdown["optimizer"]) == (other == "adamw")  # foreach is slower
    if stack == "torchtitan-0.2":
        from advisor.export import export
        from advisor.hardware import load_hardware
        from advisor.model import load_model

        out = export("torchtitan-toml", load_model(model), load_hardware("dgx-h100"), default.plan, default.setup,
                     default.grad_accum, default.world_size, stack)
        assert 'implementation = "fused"' in out.text


@pytest.mark.parametrize("targets, fused", [("all-linear", "qkv,o,gate,up,down, or"), ("q,v", "qkv (and o, gate,up, down"),
                                            ("gate,down", "gate,up,down (and o as"), ("qkv,head", "qkv (and o,")])
def test_megatron_cores_lora_refusal_names_the_fused_targets_of_those_given(targets, fused):
    """'--lora-targets all-linear' was told 'use --lora-targets qkv (and o, gate,up, down as wanted)': the same modules
    as the stack fuses them are named, and they run."""
    kw = dict(model="llama3-8b", hw="dgx-h100", gpus=8, tp=2, method="lora", stack="megatron-core")
    with pytest.raises(AdvisorError, match=f"use --lora-targets {re.escape(fused)}") as err:
        estimate(lora_targets=targets, **kw)
    given = str(err.value).split("use --lora-targets ")[1].split(" ")[0].rstrip(",")
    assert estimate(lora_targets=given, **kw).step_time_s > 0
