"""The Python API takes models, profiles, stacks, plans and setups as objects too: pydantic's model_copy(update=...)
skips validation, so each is validated again as if read from its file, and estimate_plan asks of a typed plan what
estimate asks of its options (a review found an empty peak table hanging the API, zero bandwidths costing NaN, a
negative one a negative step, and estimate_plan costing FP8 on an A100 and 12 GPUs of 8-GPU nodes)."""

from __future__ import annotations

import pytest

from advisor import api, estimate
from advisor.errors import AdvisorError
from advisor.hardware import load_hardware
from advisor.layout import Plan
from advisor.model import load_model
from advisor.stack import load_stack
from advisor.training import TrainingSetup

H100 = load_hardware("dgx-h100")


@pytest.mark.parametrize("kw, says", [
    (dict(hw=H100.model_copy(update={"gpu": H100.gpu.model_copy(update={"peak_tflops": {}})})),
     "hardware profile dgx-h100: gpu.peak_tflops: peak_tflops needs at least fp32"),
    (dict(hw=H100.model_copy(update={"gpu": H100.gpu.model_copy(update={"memory_bandwidth_GBps": -1})})),
     "gpu.memory_bandwidth_GBps: Input should be greater than or equal to 1"),
    (dict(hw=H100.model_copy(update={"gpus_per_node": 0})), "gpus_per_node: Input should be greater than or equal to 1"),
    (dict(model=load_model("gpt2").model_copy(update={"n_heads": 0})), "model gpt2: n_heads"),
    (dict(model=load_model("gpt2").model_copy(update={"n_layers": "12"})), "n_layers: must be a number, not the string"),
    (dict(stack=load_stack("megatron-core").model_copy(update={"engine": load_stack("megatron-core").engine.model_copy(
        update={"optimizers": []})})), "stack megatron-core: engine.optimizers"),
])
def test_objects_built_in_python_are_validated_as_files_are(kw, says):
    kw = {"model": "gpt2", "hw": "dgx-h100", **kw}
    with pytest.raises(AdvisorError, match=says.replace("(", r"\(").replace(")", r"\)")) as exc:
        estimate(gpus=8, **kw)
    assert "\n" not in str(exc.value)


def test_valid_objects_cost_what_their_names_cost():
    """A loaded object handed back (or copied unchanged) gives the numbers its name gives."""
    named = estimate("llama3-8b", "dgx-h100", gpus=8, stack="megatron-core")
    objs = estimate(load_model("llama3-8b").model_copy(), H100.model_copy(), gpus=8,
                    stack=load_stack("megatron-core").model_copy())
    assert objs.step_time_s == named.step_time_s and objs.memory.peak_bytes == named.memory.peak_bytes


@pytest.mark.parametrize("args, kw, says", [
    (("dgx-a100", Plan(dp=8), TrainingSetup(precision="fp8-mixed")), {}, "gives no fp8 peak"),
    (("dgx-h100", Plan(dp=8), TrainingSetup(seq_len=4096)), {}, "exceeds gpt2's 1024 learned positions"),
    (("dgx-h100", Plan(dp=8), TrainingSetup(recompute="full", recompute_layers=50)), {}, "gpt2 has 12 layers"),
    (("dgx-h100", Plan(dp=12), TrainingSetup()), {}, "not a whole number of 8-GPU nodes"),
    (("dgx-h100", Plan(dp=8), TrainingSetup()), {"world_size": True}, "world_size must be a whole number"),
    (("dgx-h100", {"dp": 8}, TrainingSetup()), {}, "estimate_plan takes an advisor.layout.Plan"),
    (("dgx-h100", Plan(dp=8), TrainingSetup().model_copy(update={"micro_batch": 0})), {}, "setup: micro_batch"),
])
def test_estimate_plan_asks_what_estimate_asks(args, kw, says):
    with pytest.raises(AdvisorError, match=says):
        api.estimate_plan("gpt2", *args, **kw)


def test_estimate_plan_takes_a_setup_field_in_its_serialised_form():
    """precision as the string a JSON round trip gives: validated into the enum, the same step as the setup's own."""
    copied = TrainingSetup().model_copy(update={"precision": "bf16-mixed"})
    assert (api.estimate_plan("gpt2", "dgx-h100", Plan(dp=8), copied).step_time_s
            == api.estimate_plan("gpt2", "dgx-h100", Plan(dp=8), TrainingSetup()).step_time_s)


def test_numpy_scalars_and_changes_in_place_are_costed_as_given():
    """A numpy integer in a copied plan validates (pydantic takes it; a JSON dump did not), and an object changed in
    place after one estimate is costed as changed, not as first seen (a review found both, in an id cache)."""
    import numpy as np

    plan = Plan(dp=8).model_copy(update={"dp": np.int64(8)})
    assert api.estimate_plan("gpt2", "dgx-h100", plan, TrainingSetup()).step_time_s == pytest.approx(
        api.estimate_plan("gpt2", "dgx-h100", Plan(dp=8), TrainingSetup()).step_time_s)
    hw = load_hardware("dgx-h100").model_copy(deep=True)
    before = estimate("llama3-8b", hw, gpus=8).step_time_s
    hw.gpu.peak_tflops["bf16"] /= 2  # a frozen model's dicts stay mutable
    assert estimate("llama3-8b", hw, gpus=8).step_time_s > 1.5 * before


def test_a_row_of_a_search_in_a_stack_from_a_file_is_estimated_again_in_that_stack(tmp_path):
    """A search run on a Stack read from a file names it in each row's setup; estimate_plan looked that name up among
    the built-ins and refused it. ``stack=`` hands the Stack back, and the row's numbers come again."""
    from advisor.search import plan
    from advisor.stack import StackError

    f = tmp_path / "mine.yaml"
    f.write_text("base: megatron-core\nname: mine\ndescription: a bigger bucket\nengine: {bucket_MiB: 100}\n")
    mine = load_stack(str(f))
    row = plan("llama3-8b", "dgx-h100", gpus=8, stack=mine, top=1).plans[0].estimate
    with pytest.raises(StackError, match="unknown stack profile 'mine'"):
        api.estimate_plan("llama3-8b", "dgx-h100", row.plan, row.setup)
    again = api.estimate_plan("llama3-8b", "dgx-h100", row.plan, row.setup, stack=mine)
    assert (again.stack, again.step_time_s, again.memory.peak_bytes) == ("mine", row.step_time_s, row.memory.peak_bytes)
    # the returned setup names the stack it was costed in, and only auto's choice carries auto's rule
    named = api.estimate_plan("llama3-8b", "dgx-h100", row.plan, row.setup.model_copy(update={"stack": "auto"}),
                              stack="megatron-core")
    assert (named.stack, named.setup.stack, named.stack_rule) == ("megatron-core", "megatron-core", None)
    other = api.estimate_plan("llama3-8b", "dgx-h100", row.plan, row.setup, stack=load_stack("megatron-core"))
    assert other.setup.stack == "megatron-core"
    auto = api.estimate_plan("llama3-8b", "dgx-h100", row.plan, row.setup, stack="auto")
    assert auto.stack_rule is not None and auto.setup.stack == auto.stack


@pytest.mark.parametrize("build, says", [
    (lambda: Plan(dp=0), "Plan: dp: Input should be greater than or equal to 1 (got 0)"),
    (lambda: Plan(dp=1, tp="x"), "Plan: tp: must be a number, not the string 'x'"),
    (lambda: TrainingSetup(seq_len=-1), "TrainingSetup: seq_len: Input should be greater than or equal to 1 (got -1)"),
    (lambda: TrainingSetup(micro_batch=2, colour="red"), "TrainingSetup: colour: unknown key"),
])
def test_inputs_built_in_python_refuse_bad_values_in_one_line(build, says):
    """README: the Python API's bad input is a one-line AdvisorError, as the CLI's; pydantic's report is several."""
    with pytest.raises(AdvisorError) as exc:
        build()
    assert str(exc.value).startswith(says) and "\n" not in str(exc.value)


def test_the_api_takes_what_the_command_line_takes():
    """PEFT's target_modules is a list: the API takes one as the command line's comma list (Llama 3 8B, r 8 on q, v and
    o: 32 layers x 8 x (4096 + 4096 + 4096 + 1024 + 4096 + 4096) = 5,505,024, PEFT's count); and --precision auto's
    ranking is advisor.rank_precisions, which plan's refusal of precision='auto' names."""
    import advisor
    from advisor.errors import AdvisorError

    e = advisor.estimate("llama3-8b", "dgx-a100", method="lora", lora_targets=["q_proj", "v_proj", "o_proj"])
    assert e.trainable_params == 5_505_024
    with pytest.raises(AdvisorError, match="advisor.rank_precisions"):
        advisor.plan("llama3-8b", "dgx-h100", gpus=8, precision="auto")
    best, runs = advisor.rank_precisions("llama3-8b", "dgx-h100", gpus=8, top=1)
    assert best.plans and {"bf16-mixed", "fp8-tensorwise"} <= {name for name, _, _ in runs}
