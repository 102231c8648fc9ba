"""advisor.suggest: what fits when no plan does must be what a search on that many GPUs finds, in the stacks it would
run, with the recomputation those stacks have (a sweep of bad inputs found three ways it was not)."""

from __future__ import annotations

import re

import pytest

from advisor import plan


def _suggestion(**kw) -> str:
    from advisor.suggest import suggest_fix

    found = plan(**kw)
    assert not found.plans  # nothing fits: what would is the suggestion
    return suggest_fix(found, plan)  # as the CLI calls it


def test_the_count_suggested_from_one_gpu_is_one_a_search_fits_on():
    """From one GPU --stack auto costs in hf-trainer (DeepSpeed's ZeRO-Offload there); on more GPUs its TP/PP/CP plans
    are megatron-core's: the suggestion said "--gpus 12" (hf-trainer's data-parallel plans alone) where 8 fit."""
    msg = _suggestion(model="llama3-8b", hw="rtx-4090", gpus=1)
    n = int(re.search(r"it fits on --gpus ([\d,]+)", msg).group(1).replace(",", ""))
    assert plan("llama3-8b", "rtx-4090", gpus=n, top=1).plans  # a search there ranks a plan that fits
    assert n == 8


def test_a_stack_without_full_recomputation_is_suggested_its_own_leanest_policy():
    """nanotron checkpoints nothing (engine.checkpointing [none]): the lean corner forced full recomputation, which the
    stack refuses, so every count was "no GPU count fits" although 8 GPUs rank plans."""
    msg = _suggestion(model="llama3-8b", hw="dgx-h100", gpus=2, stack="nanotron")
    assert "no recomputation" in msg and "no GPU count" not in msg
    n = int(re.search(r"it fits on --gpus ([\d,]+)", msg).group(1).replace(",", ""))
    assert plan("llama3-8b", "dgx-h100", gpus=n, stack="nanotron", top=1).plans


def test_adapters_are_not_suggested_under_tensor_parallelism_where_the_stack_refuses_it():
    """hf-trainer runs LoRA/QLoRA data-parallel only: the lean corner costed TP=2 QLoRA plans anyway (negative weights,
    -173.6 GiB 'needed')."""
    msg = _suggestion(model="llama2-70b", hw="rtx-4090", gpus=2, method="qlora")
    assert "TP=" not in msg and "needs -" not in msg


def test_method_auto_suggests_the_method_that_fits_on_the_fewest_gpus():
    """--method auto where no method fits answered with its last rung (QLoRA offloaded, data-parallel only): Llama 3
    405B on RTX 4090s "fits on --gpus 4,732", where a full fine-tune with TP and CP fits on 704 (a sweep of bad
    inputs found it). The suggestion is now the fewest GPUs of any method, and says which."""
    found = plan("llama3-405b", "rtx-4090", gpus=1, method="auto")
    assert not found.plans and "the fewest GPUs: full on --gpus 704" in found.method_choice["lines"][0]
    from advisor.suggest import suggest_fix

    assert "it fits on --gpus 704 (" in suggest_fix(found)


def test_method_auto_on_a_mixture_of_experts_says_its_adapter_rungs_were_not_costed():
    """Qwen3-30B-A3B on one A10G: adapters on a mixture of experts are not costed (advisor.workload), so only the full
    rung is searched; the answer said "nothing fits, not even QLoRA with CPU offload", a QLoRA that was never tried.
    Each rung is now named as it went: full fits on 32 GPUs (EP 32, the fewest), the LoRA rungs not costed, and why."""
    found = plan("qwen3-30b-a3b", "a10g", gpus=1, method="auto")
    line = found.method_choice["lines"][0]
    assert not found.plans and "not even QLoRA" not in line
    assert line == ("method auto: full does not fit; lora, qlora, qlora+offload not costed: adapters on qwen3-30b-a3b, "
                    "a mixture of experts, are not costed (on any target, attention too: --lora-targets q,v); the "
                    "fewest GPUs: full on --gpus 32")
    fits = plan("qwen3-30b-a3b", "dgx-h100", gpus=8, method="auto", top=1).method_choice["lines"][1]
    assert fits.startswith("methods (best step of each): full ") and fits.endswith(
        ", lora not costed, qlora not costed, qlora+offload not costed (adapters on qwen3-30b-a3b, a mixture of "
        "experts, are not costed (on any target, attention too: --lora-targets q,v))")


def test_a_full_fine_tune_that_fits_nowhere_here_is_told_the_adapters_that_do():
    """Llama 2 7B on two RTX 4090s: a full fine-tune needs ~16 bytes a parameter (54 GB a GPU under ZeRO-3 dp=2), so
    nothing fits, but LoRA on a bf16 base (13.5 GB) does; the suggestion named more GPUs and an H100 only, not the
    seeds' single-GPU branch ("ZeRO + CPU offload, or fine-tune adapters"). Not offered for a mixture of experts, whose
    adapters are not costed, nor where adapters are already asked for."""
    msg = _suggestion(model="llama2-7b", hw="rtx-4090", gpus=2)
    assert "--method lora (adapters on a frozen base) fits on 2 GPUs" in msg
    assert plan("llama2-7b", "rtx-4090", gpus=2, method="lora", top=1).plans
    assert "--method" not in _suggestion(model="mixtral-8x7b", hw="rtx-4090", gpus=2)
    assert "--method" not in _suggestion(model="llama2-70b", hw="rtx-4090", gpus=2, method="qlora")


def test_lora_on_single_projections_names_the_targets_that_let_fused_stacks_in():
    """megatron-core's LoRA adapts linear_qkv whole (engine.adapter_modules fused), so PEFT's default q, v leaves its
    plans out of --stack auto; the footer says which targets and stack rank them, and says nothing once they are given."""
    from advisor.search import plan

    qv = plan("llama3-8b", "dgx-a100", gpus=8, method="lora", top=2)
    assert any("--lora-targets qkv" in n and "megatron-core" in n for n in qv.notes())
    assert any("with --stack megatron-core" in n for n in qv.notes())
    qkv = plan("llama3-8b", "dgx-a100", gpus=8, method="lora", lora_targets="qkv", top=2, stack="megatron-core")
    assert qkv.plans and not any("--lora-targets qkv" in n for n in qkv.notes())


def test_torch_1_11_names_why_its_fsdp_is_not_the_leanest_plan():
    """torch 1.11's FSDP keeps no gradients across micro-batches (fully_sharded_data_parallel.py
    _prep_grads_for_backward; engine.accumulation none): at the default global batch of GPT-2 XL on two RTX 4090s, 512
    (2**19 tokens / 1,024), each GPU's one micro-batch would hold 256 samples, so the lean corner (micro batch 1) costs
    DDP only. The message called DDP "the leanest plan" with no word of FSDP, which one sample a GPU fits."""
    msg = _suggestion(model="gpt2-xl", hw="rtx-4090", stack="torch-1.11")
    assert "even the leanest plan costed on 2 GPUs (DDP dp=2, full recomputation, micro batch 1) needs 35.4 GiB" in msg
    assert ("torch-1.11's FSDP is not among them: it keeps no gradients across micro-batches, so it runs one micro-batch "
            "a step, of 256 samples a GPU at global batch 512 on 2 GPUs; --global-batch 2 (one sample a GPU a step) fits "
            "on 2 GPUs (ZeRO-3 dp=2, full recomputation, micro batch 1)") in msg
    assert plan("gpt2-xl", "rtx-4090", stack="torch-1.11", global_batch=2, top=1).plans[0].estimate.plan.zero == 3
    # a stack that accumulates sharded gradients says nothing of it
    assert "FSDP is not among them" not in _suggestion(model="llama3-8b", hw="rtx-4090", gpus=2, stack="hf-trainer")
