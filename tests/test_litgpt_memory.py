"""litgpt's LoRA memory, as a probe of its own modules found it (stack_profiles/litgpt.yaml, advisor/adapters.py,
advisor/workload.py chunked_loss): the three tensors the hand count missed, each a fixed number of bytes, and the
single-GPU rows of litgpt's resource tables (validation/data/finetune_runs.yaml: lit-gpt 8641822, one A100-40GB,
max_memory_allocated / 1e9) that they bring within 6%."""

from __future__ import annotations

from collections import Counter

import pytest

from advisor.finetune import FineTune, Library
from advisor.hardware import load_hardware
from advisor.model import load_model
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload
from advisor.adapters import saved_delta_per_token
from validation.finetune import counter_scale, estimate_kwargs, load_finetune_runs
from validation.report import _estimate


def _workload(targets: str, library: str = "litgpt", dropout: float = 0.05) -> Workload:
    ft = FineTune(method="lora", targets=targets, library=library, lora_dropout=dropout)
    setup = TrainingSetup(seq_len=1304, micro_batch=1, precision="bf16", finetune=ft)
    return Workload.of(load_model("llama2-7b"), load_hardware("mosaicml-a100-40gb"), load_stack("litgpt"), setup)


def test_index_copy_keeps_the_enabled_qkv_slices_b_output():
    """LoRAQKVLinear.zero_pad scatters the B output of the adapted slices with index_copy, which keeps its source
    (torch derivatives.yaml index_copy: source); with q, k and v all adapted zero_pad returns early."""
    h, a = 4096, 2.0  # Llama 2 7B: q and v slices 4096 wide each; bf16
    qv, qkv, peft = _workload("q,v"), _workload("q,k,v"), _workload("q,v", library="peft")
    # litgpt: one bf16 dropout (output + bool mask) for the fused qkv, two bf16 A outputs, the index_copy source (the q
    # and v slices); PEFT: a dropout per adapter on its fp32 cast of the input (advisor.adapters.peft_fp32_adapters)
    # and fp32 A outputs; the frozen linears' inputs and the norms alike in both
    litgpt_adds = h * (a + 1.0) + 2 * 8 * a + 2 * h * a
    peft_adds = 2 * h * (4.0 + 1.0) + 2 * 8 * 4.0
    assert saved_delta_per_token(qv) - saved_delta_per_token(peft) == pytest.approx(litgpt_adds - peft_adds, abs=1e-9)
    # q, k, v: no index_copy; one more rank-8 A output than q, v (k's adapter)
    assert saved_delta_per_token(qkv) - saved_delta_per_token(qv) == pytest.approx(8 * a - 2 * h * a, abs=1e-9)


def test_fabric_casts_litgpt_logits_to_fp32():
    """Fabric's convert_output returns the logits in fp32 under bf16-true; each chunk keeps its fp32 log-softmax:
    8 bytes a logit (the probe: 8.04 at backward's start); the log-softmax is freed by the loss's backward, which runs
    before the layers', so recomputing layers see only the fp32 list: 4 bytes a logit."""
    t = _workload("q,v").tables
    assert (t.logits_held, t.logits_peak) == (4.0, 8.0)


@pytest.mark.parametrize("run", [r for r in load_finetune_runs()
                                 if "litgpt_rt_lora" in r["id"] and "_1xa100" in r["id"]
                                 and r["measured"].get("peak_memory_gb") is not None], ids=lambda r: r["id"])
def test_single_gpu_litgpt_rows_within_six_percent(run):
    kw, _ = estimate_kwargs(run)
    est = _estimate(kw, Counter())
    predicted = est.memory.peak_bytes / counter_scale(run)
    assert predicted == pytest.approx(float(run["measured"]["peak_memory_gb"]), rel=0.06)


def test_every_litgpt_fit_verdict_is_right():
    """Llama 2 7B LoRA at micro-batch 4 and Falcon-40B QLoRA on one A100-40GB ran out of memory; every other row ran."""
    for run in load_finetune_runs():
        if "litgpt_rt_lora" not in run["id"] or run["measured"].get("oom") is None:
            continue
        kw, _ = estimate_kwargs(run)
        if kw is None:
            continue
        assert _estimate(kw, Counter()).fits is (not run["measured"]["oom"]), run["id"]
