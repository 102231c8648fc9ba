"""bitsandbytes' NF4 dequantisation as the version a stack runs does it (issue 22). bitsandbytes 0.41.1 (lit-gpt's
resource tables, stack litgpt-2023) quantises from a .half() copy (nn/modules.py Params4bit.cuda), so
dequantize_4bit writes fp16 and MatMul4Bit casts it to the bf16 compute dtype (autograd/_functions.py
``.to(A.dtype)``, backward ``.to(grad_output.dtype)``): 4 bytes a weight more in each forward and backward, and the fp16
copy beside the cast one. bitsandbytes >= 0.42 keeps the weight's dtype (litgpt 0.5.13 requires >= 0.45.2)."""

from __future__ import annotations

import pytest

from advisor.adapters import dequant_buffer, layer_extra_times
from advisor.compute import mem_time
from advisor.finetune import FineTune
from advisor.hardware import load_hardware
from advisor.model import load_model
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload


def _workload(stack: str, precision: str = "bf16", library: str = "litgpt", dequant: str = "") -> Workload:
    ft = FineTune(method="qlora", targets="q,v", library=library, quant="nf4")
    setup = TrainingSetup(seq_len=1024, micro_batch=1, precision=precision, finetune=ft)
    s = load_stack(stack)
    if dequant:
        s = s.model_copy(update={"engine": s.engine.model_copy(update={"nf4_dequant_dtype": dequant})})
    return Workload.of(load_model("llama2-7b"), load_hardware("mosaicml-a100-40gb"), s, setup)


def test_bitsandbytes_041_casts_the_fp16_dequantised_weight_to_bf16_each_pass():
    old, new = _workload("litgpt-2023"), _workload("litgpt")
    packed = sum(lin.weights for lin in old.layer.linears)  # every linear of a Llama 2 7B layer quantised
    (f_old, b_old), (f_new, b_new) = layer_extra_times(old, 1024.0), layer_extra_times(new, 1024.0)
    cast = mem_time(old.hw, packed * 4.0)  # read fp16, write bf16
    assert f_old - f_new == pytest.approx(cast, rel=1e-9) and b_old - b_new == pytest.approx(cast, rel=1e-9)
    # the biggest quantised weight (litgpt quantises the head too: 32,000 x 4,096) in fp16 beside its bf16 cast
    assert dequant_buffer(new) == 32000 * 4096 * 2.0 and dequant_buffer(old) == 2 * dequant_buffer(new)


def test_an_fp16_compute_dtype_needs_no_cast():
    old = _workload("hf-trainer", "fp16-mixed", "peft", dequant="fp16")
    new = _workload("hf-trainer", "fp16-mixed", "peft")
    assert layer_extra_times(old, 1024.0) == layer_extra_times(new, 1024.0)
