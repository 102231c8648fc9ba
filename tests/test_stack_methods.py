"""Which fine-tuning methods a stack runs (engine.methods), each read from the library: a plan in a stack that cannot
run its method is refused in one line naming the stacks that can, and --stack auto / any cost adapters only where
they run (a QLoRA plan once went to megatron-core, which has no quantised base, because the model was too large for
one GPU in hf-trainer)."""

from __future__ import annotations

import pytest

from advisor import estimate, plan
from advisor.errors import AdvisorError
from advisor.stack import list_stacks, load_stack

# from each library's source (the profiles cite the files): PEFT + bitsandbytes under the Trainer or the DeepSpeed
# engine, litgpt's finetune_lora --quantize; LoRA without a quantised base in Megatron-Bridge's peft/, torchtitan
# 0.3.0's components/lora.py and llm-foundry 0.22's peft_config; none in Megatron-DeepSpeed, nanotron 0.4 or
# llm-foundry 0.1.0 (the 2023 sweep's era)
METHODS = {"hf-trainer": ["full", "lora", "qlora"], "deepspeed": ["full", "lora", "qlora"],
           "litgpt": ["full", "lora", "qlora"], "megatron-core": ["full", "lora"],
           "megatron-bridge-perf": ["full", "lora"], "torchtitan": ["full", "lora"], "llm-foundry": ["full", "lora"],
           "llm-foundry-2023": ["full"], "megatron-deepspeed": ["full"], "nanotron": ["full"]}


def test_every_shipped_stack_says_which_methods_it_runs():
    assert {n: load_stack(n).engine.methods for n in list_stacks()} == METHODS


@pytest.mark.parametrize("stack, zero, method, fix", [
    ("megatron-core", 3, "qlora", "use --stack deepspeed or hf-trainer or litgpt"),
    ("nanotron", 1, "lora", "use --stack deepspeed or hf-trainer or litgpt or llm-foundry or megatron-bridge-perf or "
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
    """Llama 2 70B does not fit one H100 in hf-trainer, so auto's data-parallel stack is megatron-core: LoRA stays
    there (Megatron-Bridge's PEFT), QLoRA goes to hf-trainer (PEFT + bitsandbytes, FSDP). --stack any ranks only the
    stacks that run the method."""
    lora = estimate(model="llama2-70b", hw="dgx-h100", gpus=8, zero=3, method="lora", recompute="full")
    qlora = estimate(model="llama2-70b", hw="dgx-h100", gpus=8, zero=3, method="qlora", recompute="full")
    assert (lora.stack, qlora.stack) == ("megatron-core", "hf-trainer")
    found = plan(model="llama2-70b", hw="dgx-h100", gpus=8, method="qlora", stack="any", top=200)
    # litgpt runs QLoRA too, but describes no bf16-mixed (autocast) activations: --stack any leaves it out here
    assert {s.name for s in found.stacks} == {"hf-trainer", "deepspeed"}
    assert {p.estimate.stack for p in found.plans} <= {"hf-trainer", "deepspeed"}


def test_the_plan_header_says_the_method():
    res = plan(model="llama3-8b", hw="rtx-4090", gpus=1, method="qlora", seq=2048, top=1)
    assert "qlora r=8 on q,v, frozen base in NF4;" in res.header()
    assert "frozen base" not in plan(model="gpt2", hw="dgx-a100", gpus=1, top=1).header()
