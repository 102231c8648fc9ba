"""One-line errors that name the value and the fix (a sweep of bad inputs found these said less, or the wrong thing)."""

from __future__ import annotations

import re

import pytest

from advisor import estimate, plan
from advisor.errors import AdvisorError


def test_an_empty_out_is_named_as_empty_not_as_the_working_directory():
    from advisor.io import write_atomic

    with pytest.raises(AdvisorError, match="^cannot write to an empty file name: give --out a file name"):
        write_atomic("", "x")


def test_an_offload_the_stack_lacks_names_the_stacks_that_run_it():
    with pytest.raises(AdvisorError, match=r"megatron-core does not offload params-cpu: --stack .*hf-trainer.* offload it"):
        estimate("llama3-70b", "dgx-h100", gpus=8, tp=2, dp=4, zero=3, offload="params-cpu", stack="megatron-core")


def test_no_plan_fits_says_offload_was_not_costed_on_a_profile_without_a_host_side():
    from advisor import plan
    from advisor.suggest import suggest_fix

    found = plan("llama3-70b", "meta-grand-teton-h100", gpus=1)
    assert not found.plans and "no ZeRO-Offload or FSDP offload was costed: profile meta-grand-teton-h100 has no host: section" in suggest_fix(found)


def test_a_recipe_source_in_a_note_keeps_its_parentheses_whole():
    from advisor.export.deepspeed import _first_clause

    assert _first_clause("TE NVFP4BlockScaling (E2M1; 2D 16x16); Megatron --fp4-recipe") == "TE NVFP4BlockScaling (E2M1; 2D 16x16)"


def test_cp_on_a_stack_without_context_parallelism_says_so():
    """--cp 2 --stack hf-trainer blamed the layout ("8 GPUs hold no layout with cp=2 ... cp must divide ...")."""
    from advisor import plan

    with pytest.raises(AdvisorError, match="^--cp 2: hf-trainer runs no context parallelism; use --cp 1 or another --stack"):
        plan("llama3-8b", "dgx-h100", cp=2, stack="hf-trainer")


def test_a_config_json_value_out_of_bounds_is_named_by_its_config_key(tmp_path):
    """pydantic named ModelSpec's own fields ("vocab: Input should be ..."), which the user never wrote."""
    import json

    cfg = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               intermediate_size=14336, vocab_size=10**12, max_position_embeddings=8192)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(AdvisorError, match=r"config.json: vocab_size \(vocab\): Input should be less than or equal to"):
        estimate(str(path), "dgx-h100", gpus=8)


def test_cp_under_auto_is_costed_in_its_model_parallel_stack_and_the_search_floor_is_named():
    """--cp 2 under --stack auto stopped at the data-parallel stack ("hf-trainer runs no context parallelism") though
    auto costs CP plans in megatron-core; and a sequence too short for the search's 2,048 tokens a CP rank was blamed
    on divisibility that held (a sweep of bad inputs found both)."""
    from advisor import plan

    found = plan("llama3-8b", "dgx-h100", cp=2, seq=8192)
    assert found.plans and all(p.estimate.plan.cp == 2 for p in found.plans)
    assert {p.estimate.stack for p in found.plans} == {"megatron-core"}
    with pytest.raises(AdvisorError, match="2 x cp chunks of at least 1,024 tokens, the search's floor.*advisor estimate "
                                           "costs any cp"):
        plan("gpt2", "dgx-a100", cp=2)


def test_auto_says_why_a_model_parallel_plan_went_to_its_data_parallel_stack():
    """OLMo 2's full-width q/k norms have no Megatron-LM flag, so --stack auto costs its plans in hf-trainer, which has
    no pipeline: the refusal named hf-trainer, a stack the user never picked, without saying why (a sweep found it,
    with GPT-OSS, whose sinks and experts' activation Megatron-LM's flags now write)."""
    from advisor import estimate

    with pytest.raises(AdvisorError, match=r"\(--stack auto costs olmo-2-7b in hf-trainer: megatron-core's code or "
                                           r"formats lack full-width q/k norms; --stack megatron-core costs the plan, "
                                           r"its export refused\)$"):
        estimate("olmo-2-7b", "dgx-h100", gpus=16, pp=2, seq=4096, global_batch=64)


def test_tp_overlap_without_sp_does_not_tell_a_user_to_drop_a_no_sp_never_given():
    # megatron-core's TP runs without SP unless --sp is given (sequence_parallel defaults to False,
    # megatron/core/model_parallel_config.py:94) and Megatron-LM asserts SP under --tp-comm-overlap
    # (megatron/training/arguments.py:1401-1402): the fix is to add --sp; no --no-sp was given here
    with pytest.raises(AdvisorError, match=r"tp=2 runs without SP \(all-reduces\): add --sp \(dropping --no-sp where "
                                           r"given\) or use --tp-overlap none"):
        estimate("llama3-8b", "dgx-h100", tp=2, tp_overlap="userbuffers", stack="megatron-core")


def test_pp_split_edges_without_a_pipeline_asks_for_pp_not_a_divisibility_that_holds():
    # was: "uneven split needs layers + 2 (embedding, loss) divisible by pp x chunks: 32 layers + 2 on pp=1 x 1 chunks",
    # though 34 is divisible by 1: the split places the embedding and the loss on pipeline stages (Megatron-LM's
    # --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split), so it needs pp > 1
    with pytest.raises(AdvisorError, match=r"--pp-split edges places the embedding and the loss on pipeline stages: "
                                           r"it needs --pp > 1 \(set --pp or drop --pp-split\)"):
        estimate("llama3-8b", "dgx-h100", pp_split="edges", stack="megatron-core")


def test_stack_any_names_the_stacks_it_left_out_and_why():
    """--stack any searches only the stacks that run the setup: litgpt trains in bf16-true (its profile's
    precisions), so the default bf16-mixed leaves it out of a QLoRA search, which the footer says instead of
    ranking deepspeed and hf-trainer as though they were every stack there is."""
    from advisor.search import plan

    found = plan("llama3-8b", "rtx-4090", gpus=1, method="qlora", seq=2048, global_batch=16, stack="any", top=2)
    assert "litgpt" not in {s.name for s in found.stacks}
    assert "does not train in bf16-mixed (it trains in bf16): use --precision bf16" in found.left_out["litgpt"]
    line = next(n for n in found.notes() if n.startswith("stacks left out"))
    assert "litgpt, litgpt-2023: does not train in bf16-mixed" in line and "does not run qlora fine-tuning" in line
    assert found.to_json()["stacks_left_out"] == found.left_out  # --json carries them


def test_stack_any_names_its_left_out_stacks_when_one_stack_alone_runs_the_setup():
    """Only nanotron runs --tp-overlap linear-async (its tp_linear_async_communication, stack_profiles/nanotron.yaml):
    the footer named every other stack's reason only when two or more stacks were ranked, and otherwise said 'every
    plan costed as nanotron runs it; ... --stack any ranks every stack's', as if --stack any had not been asked."""
    from advisor.search import plan

    found = plan("llama3-8b", "dgx-h100", gpus=8, stack="any", tp_overlap="linear-async", top=1)
    assert [s.name for s in found.stacks] == ["nanotron"]
    notes = found.notes()
    assert any("only stack that runs what was asked (--stack any)" in n for n in notes)
    line = next(n for n in notes if n.startswith("stacks left out"))
    assert "megatron-core" in line and "does not overlap its TP collectives with linear-async" in line
    assert not any("--stack any ranks every stack's" in n for n in notes)


def test_stack_any_with_no_stack_left_says_why_each_was_left_out():
    """--fp8-attention under the H100's default bf16-mixed: no stack runs it, and the error said only 'no stack
    profile runs llama3-8b with what was asked', not that FP8 attention needs an FP8 recipe (advisor.precision)."""
    from advisor.search import plan

    with pytest.raises(AdvisorError) as err:
        plan("llama3-8b", "dgx-h100", gpus=8, stack="any", fp8_attention=True, top=1)
    msg = str(err.value)
    assert "\n" not in msg and "litgpt, litgpt-2023: does not train in bf16-mixed" in msg
    assert "megatron-core" in msg and "--fp8-attention runs the attention core under an FP8 recipe" in msg


@pytest.mark.parametrize("call", [
    lambda: estimate("llama3-8b", "dgx-h100", dp=8, recompute="selective", recompute_modules="core_attn,foo"),
    lambda: plan("llama3-8b", "dgx-h100", gpus=8, recompute_modules="foo"),
])
def test_an_unknown_recompute_module_is_named_as_the_option_spells_it(call):
    """'recompute_modules.1: Input should be ...' named TrainingSetup's field and a tuple index, not the option."""
    with pytest.raises(AdvisorError, match=r"--recompute-modules (core_attn,)?foo: unknown sub-module 'foo': use "
                                           r"core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts"):
        call()


@pytest.mark.parametrize("hw_base, gpus, says", [
    ("gpus_per_node: 3", (1, 12), "4 GPUs is not a whole number of 3-GPU nodes of g3; start the range at a multiple of "
                                  "3 (--gpus 3:12)"),
    (None, (3, 64), "12 GPUs is not a whole number of 8-GPU nodes of dgx-h100; start the range at 1, 2, 4 or a multiple "
                    "of 8 (--gpus 8:64)"),
])
def test_a_gpu_range_off_whole_nodes_names_the_starts_that_work(tmp_path, hw_base, gpus, says):
    """'start the range at a divisor or multiple of 3' for --gpus 1:12 on 3-GPU nodes: 1 is a divisor, and its ladder
    1, 2, 4 still breaks; the starts named are those whose doublings stay whole nodes."""
    hw = "dgx-h100"
    if hw_base:
        hw = tmp_path / "g3.yaml"
        hw.write_text(f"name: g3\ndescription: d\nbase: dgx-h100\n{hw_base}\n")
    with pytest.raises(AdvisorError, match=f"--gpus {gpus[0]}:{gpus[1]}: {re.escape(says)}$"):
        plan("llama3-8b", str(hw), gpus=gpus)
    start = int(says.rpartition("--gpus ")[2].partition(":")[0])
    assert plan("llama3-8b", str(hw), gpus=(start, gpus[1]), top=1).plans  # the range it names runs


@pytest.mark.parametrize("kw, says", [
    (dict(gpus=16, dp=4, cp=2), "dp(4) x cp(2) x tp(1) x pp(1) = 8 != world size 16: give --dp 8 or --gpus 8"),
    (dict(gpus=16, dp=3, tp=4), "dp(3) x tp(4) x pp(1) = 12 != world size 16: give --dp 4"),  # 12 GPUs: not whole nodes
    (dict(gpus=64, pp=64), "pp=64 > 32 layers: give --pp at most 32"),
])
def test_a_plan_off_its_world_or_its_layers_names_the_degree_that_fits(kw, says):
    """'dp(4) x cp(2) x tp(1) x pp(1) = 8 != world size 16' and 'pp=64 > 32 layers' said what broke, not what to give."""
    with pytest.raises(AdvisorError, match=re.escape(says)):
        estimate("llama3-8b", "dgx-h100", **kw)


@pytest.mark.parametrize("kw, says", [
    (dict(gpus=8, dp=2, pp=4, schedule="interleaved", virtual_stages=3, global_batch=8),
     "32 layers in pp x v = 4 x 3 chunks leave a chunk empty: give --virtual-stages 2 or 4 or 8"),
    (dict(gpus=8, dp=8, schedule="interleaved"), "a layer in every chunk: set --pp > 1"),
    (dict(gpus=8, dp=8, global_batch=12), "1 x 8 = 8: give --global-batch a multiple of 8 (e.g. 16)"),
])
def test_an_interleaving_or_a_batch_that_cannot_split_names_the_values_that_do(kw, says):
    """'needs pp > 1, 2 or more virtual stages and a layer in every chunk' for pp=4, v=3 listed three conditions of
    which only the last failed (ceil(32 / 12) = 3 layers a chunk leaves the 12th empty: pipeline.layout_fills); the
    batch that micro_batch x dp does not divide named no batch that it does."""
    with pytest.raises(AdvisorError, match=re.escape(says)):
        estimate("llama3-8b", "dgx-h100", **kw)


def test_fp8_attention_under_bf16_names_the_recipe_that_runs_it_not_that_nothing_does():
    """--fp8-attention under the default bf16-mixed: the refusal's fix is a recipe (megatron-core runs FP8 attention
    under fp8-delayed), so it no longer closes with 'no stack profile runs it' (a user sweep found the contradiction)."""
    with pytest.raises(AdvisorError, match=r"add --precision fp8-delayed or drop --fp8-attention\); no stack profile "
                                           r"runs it as asked$"):
        estimate("llama3-8b", "dgx-h100", gpus=8, fp8_attention=True)


def test_a_float_bound_prints_its_digits_not_an_exponent():
    """--tokens is bounded by le=1e18 (advisor/options.py Plan.tokens), a float: '{le:,}' wrote it 1e+18, and the value
    given as repr wrote it 1e+19. Both now print as digits, the bound with separators as the integer bounds do."""
    with pytest.raises(AdvisorError, match=re.escape(
            "plan: --tokens must be at most 1,000,000,000,000,000,000 (got 10000000000000000000)")):
        plan("gpt2-xl", "dgx-a100", tokens=1e19)
    with pytest.raises(AdvisorError, match=re.escape("--global-batch must be at most 1,000,000,000 (got 10000000000)")):
        plan("gpt2-xl", "dgx-a100", global_batch=10_000_000_000)
    with pytest.raises(AdvisorError, match=re.escape("--lora-dropout must be less than 1 (got 1.5)")):
        plan("gpt2-xl", "dgx-a100", method="lora", lora_dropout=1.5)
    from advisor.errors import plain

    assert (plain(1e18, ","), plain(0.5), plain(-8), plain(True), plain("a")) == (
        "1,000,000,000,000,000,000", "0.5", "-8", "True", "'a'")



@pytest.mark.parametrize("kw, words", [
    (dict(tp=1.5), "estimate: --tp: Input should be a whole number, not 1.5: round it"),
    (dict(micro_batch=None), "estimate: --micro-batch: Input should be a valid integer, not None: give one, or leave it out "
                             "for its default"),
    (dict(precision=5), "estimate: --precision: Input should be a valid string, not 5: write it in quotes"),
    (dict(tp=[2]), "estimate: --tp: Input should be a valid integer, not [2]: give one number in its place"),
    (dict(offload=("a",)), "estimate: --offload: Input should be a valid string, not ('a',): give one string in its place"),
])
def test_a_value_of_the_wrong_type_is_named_with_its_fix(kw, words):
    """pydantic's wrong-type errors said what the value should be ('Input should be a valid integer, got a number with a
    fractional part (got 1.5)', 'a valid string (got 5)') and not what to do: each now ends with the fix."""
    with pytest.raises(AdvisorError, match=f"^{re.escape(words)}$"):
        estimate("llama3-8b", "dgx-h100", gpus=8, **kw)


def test_a_profile_key_of_the_wrong_type_is_named_with_its_fix(tmp_path):
    from advisor.hardware import load_hardware

    path = tmp_path / "hw.yaml"
    path.write_text("base: dgx-h100\nname: 42\ndescription: d\n")
    with pytest.raises(AdvisorError, match=re.escape("name: Input should be a valid string, not 42: write it in quotes")):
        load_hardware(str(path))


def test_an_expert_parallel_degree_that_does_not_divide_names_the_ones_that_do():
    """Mixtral 8x7B's 8 experts on dp x tp = 8 ranks: ep must divide both (expert_layout.violations; Megatron-LM
    arguments.py num_experts % ep); --ep 3 was told only that --ep 1 turns EP off."""
    with pytest.raises(AdvisorError, match=re.escape("ep=3, etp=1, dp x tp = 8, 8 experts of width 14336 (give --ep 2, 4 "
                                                     "or 8; --ep 1 turns expert parallelism off)")):
        estimate("mixtral-8x7b", "dgx-h100", gpus=8, ep=3)


def test_a_profile_section_given_as_a_number_and_a_peak_out_of_range_name_the_fix(tmp_path):
    """'gpu: 5' said 'Input should be a valid dictionary or instance of GPU (got 5)', and a peak out of range wrote its
    bound as 1e6: each now says what to write (hardware.py GPU.peak_tflops: the dense peak per precision)."""
    from advisor.hardware import load_hardware

    path = tmp_path / "hw.yaml"
    for body, words in (("gpu: 5", "gpu: Input should be a mapping, not 5: give its keys under it, key: value"),
                        ("gpu: {peak_tflops: 5}", "gpu.peak_tflops: Input should be a mapping, not 5: give its keys "
                                                  "under it, key: value"),
                        ("gpu: {peak_tflops: {fp32: 60, bf16: -5}}", "peak_tflops.bf16=-5 must be a TFLOP/s figure from "
                         "0.001 to below 1,000,000 (the datasheet's dense figure, in TFLOP/s)")):
        path.write_text(f"base: dgx-h100\nname: x\ndescription: d\n{body}\n")
        with pytest.raises(AdvisorError, match=re.escape(words)):
            load_hardware(str(path))


def test_a_list_key_given_one_value_is_told_to_write_a_list(tmp_path):
    """engine.offers: ddp in a stack profile said 'Input should be a valid list (got 'ddp')'."""
    from advisor.stack import load_stack

    path = tmp_path / "st.yaml"
    path.write_text("name: x\ndescription: d\nbase: torch-1.11\nengine: {offers: ddp}\n")
    with pytest.raises(AdvisorError, match=re.escape("engine.offers: Input should be a list, not 'ddp': write it as a "
                                                     "list, [ddp]")):
        load_stack(str(path))
