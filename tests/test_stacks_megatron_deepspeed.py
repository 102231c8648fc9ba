"""The megatron-core and deepspeed stack profiles (issue 15), read from megatron-core 0.16.1's and deepspeed 0.19.8's
source: their numbers as the sources say, used by plan and estimate, and their bad files as one-line errors."""

from __future__ import annotations

import pytest
from _robust import tried
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor import estimate, plan
from advisor.cli import cli
from advisor.errors import AdvisorError
from advisor.stack import load_stack, stack_from_yaml, stack_to_yaml

MC, DS = load_stack("megatron-core"), load_stack("deepspeed")


@pytest.mark.parametrize("name", ["megatron-core", "deepspeed"])
def test_the_profile_round_trips_through_stacks_show(name):
    res = CliRunner().invoke(cli, ["stacks", "show", name])
    assert res.exit_code == 0, res.output
    assert stack_from_yaml(res.output) == load_stack(name) == stack_from_yaml(stack_to_yaml(load_stack(name)))
    assert name in CliRunner().invoke(cli, ["stacks"]).output


def test_megatron_core_numbers_are_its_sources():
    e = MC.engine
    # distributed_data_parallel.py:65: bucket_size max(40,000,000, 1,000,000 x dp) elements; 40M fp32 = 152.6 MiB
    assert e.bucket_MiB == pytest.approx(40e6 * 4 / 2**20, abs=0.05)
    # grad_reduce_in_fp32 under --bf16 (Megatron-LM arguments.py): an fp32 main_grad buffer, reduced in fp32
    assert (e.main_grads, e.reduce_dtype, e.master_weights) == ("fp32", "fp32", "always")
    # transformer_config.py:1194: recompute_modules defaults to ["core_attn"]
    assert e.selective.recomputes == ["attention/core"]
    # schedules.py: no pipelining, 1F1B, interleaved; no GPipe; Megatron-FSDP's ZeRO-2/3 strategies
    assert "gpipe" not in e.offers and "dataparallel" not in e.offers
    assert {"ddp", "zero1", "zero2", "zero3", "tp", "sp", "pp", "interleaved"} <= set(e.offers)
    assert e.zero3_calls is None and e.device_syncs == "per_phase" and not e.pipeline_scatter_gather


def test_megatron_core_distributed_optimizer_is_6_plus_12_over_d_bytes_a_parameter():
    # docs/user-guide/features/dist_optimizer.md: bf16 parameters, fp32 gradients: 18 bytes a parameter without the
    # distributed optimizer, 6 + 12/d with it
    kw = dict(gpus=8, micro_batch=1, seq=2048, precision="bf16-mixed", stack="megatron-core", optimizer="adamw-fused")
    for zero, per_param in ((0, 18.0), (1, 6.0 + 12.0 / 8)):
        e = estimate("llama3-8b", "dgx-h100", zero=zero, **kw)
        states = sum(e.memory.parts[k] for k in ("weights", "gradients", "optimizer_states"))
        assert states / e.params == pytest.approx(per_param, rel=0.01)


def test_a_te_layer_saves_korthikanti_34_sbh_under_sequence_parallelism():
    # Korthikanti et al. 2022 Table 2, TP+SP with the s x s scores gone (fused attention): 34 s b h / t at 16 bits,
    # here with the fused attention's fp32 softmax statistics (4 bytes per head) and the LayerNorms' fp32 mean and
    # rsigma (8 bytes each)
    from advisor.model import load_model
    layer = load_model("gpt2-xl").layer
    t = MC.tables("mixed", "sdpa", layer)
    h, heads = layer.d_model, layer.n_heads
    for tp in (1, 2, 8):
        assert float(t.saved_layer.per_gpu(tp, True)) == pytest.approx((34 * h + 4 * heads + 16) / tp)
    assert float(t.saved_full_recompute.per_gpu(8, True)) == pytest.approx(2 * h / 8)


def test_deepspeed_numbers_are_its_sources():
    e, z = DS.engine, DS.engine.zero3_calls
    # runtime/zero/config.py: reduce_bucket_size 5e8 elements (953.7 MiB in bf16), stage3_prefetch_bucket_size 5e7,
    # stage3_param_persistence_threshold 1e5, stage3_max_live_parameters 1e9
    assert e.bucket_MiB == pytest.approx(5e8 * 2 / 2**20, abs=0.05)
    assert (z.gather_bucket_elements, z.reduce_bucket_elements) == (5e7, 5e8)
    assert (z.persistence_elements, z.max_live_elements) == (1e5, 1e9)
    # all_gather_into_tensor of flat buffers; waits on events, not device synchronisations
    assert (z.gathers, z.reduces, z.host_ops_per_rank_gather, z.device_sync_per_fetch) == ("per_bucket", "per_bucket", 0, False)
    # engine.py _configure_distributed_model casts the module to the half type; fp32 master weights in the optimizer
    assert (e.module_dtype, e.master_weights) == ("half", "always")
    assert e.offers == ["ddp", "zero1", "zero2", "zero3"]


def test_deepspeed_03_and_0198_issue_zero3_differently():
    """Megatron-DeepSpeed's DeepSpeed 0.3.13 gathers each tensor and synchronises in every fetch; 0.19.8 coalesces a
    sub-module's tensors and prefetches: on the same 13B model over 64 GPUs the old engine exposes far more."""
    old = load_stack("megatron-deepspeed").engine.zero3_calls
    assert (old.gathers, old.reduces, old.host_ops_per_rank_gather, old.host_ops_per_rank_reduce,
            old.device_sync_per_fetch, old.persistence_elements, old.max_live_elements) == (
        "per_tensor", "per_tensor", 2, 3, True, 1e5, 1e9)
    kw = dict(gpus=64, zero=3, micro_batch=1, seq=2048, precision="bf16-mixed", recompute="full", optimizer="adamw-fused")
    new = estimate("llama2-13b", "dgx-a100", stack="deepspeed", **kw).breakdown["comm/zero_params"]
    was = estimate("llama2-13b", "dgx-a100", stack="megatron-deepspeed", **kw).breakdown["comm/zero_params"]
    assert was > 3 * new


def test_deepspeed_runs_an_hf_model_in_half_precision_throughout():
    # the engine casts the module: every plan uses hf-trainer's half-mode tables, whatever the ZeRO stage
    from advisor.model import load_model
    layer = load_model("llama2-7b").layer
    hf = load_stack("hf-trainer")
    from dataclasses import replace
    ours, theirs = DS.tables("half", "sdpa", layer), hf.tables("half", "sdpa", layer)
    assert (ours.head_forward_ops, ours.head_backward_ops) == (theirs.head_forward_ops + 1, theirs.head_backward_ops + 1)
    assert replace(ours, head_forward_ops=0, head_backward_ops=0) == replace(theirs, head_forward_ops=0, head_backward_ops=0)
    from advisor.hardware import load_hardware
    from advisor.training import TrainingSetup
    from advisor.workload import Workload
    w = Workload.of(load_model("llama2-7b"), load_hardware("dgx-h100"), DS, TrainingSetup(seq_len=2048, global_batch=8))
    assert w.tables == ours  # bf16-mixed asks the half mode's tables (advisor.workload, engine.module_dtype)
    kw = dict(gpus=8, micro_batch=1, seq=2048, precision="bf16-mixed", recompute="none")
    d0 = estimate("llama2-7b", "dgx-h100", stack="deepspeed", zero=1, **kw)
    h0 = estimate("llama2-7b", "dgx-h100", stack="hf-trainer", zero=0, **kw)  # DDP: autocast on fp32 weights
    assert d0.memory.parts["activations"] < h0.memory.parts["activations"]  # no fp32 residual stream under autocast
    h1 = estimate("llama2-7b", "dgx-h100", stack="hf-trainer", zero=1, **kw)  # its ZeRO-1 is DeepSpeed's bf16 engine
    assert d0.memory.parts["activations"] == h1.memory.parts["activations"]


@pytest.mark.parametrize("name", ["megatron-core", "deepspeed"])
def test_plan_uses_the_stack_and_agrees_with_estimate(name):
    res = plan(model="gpt2-xl", hw="dgx-a100", gpus=16, stack=name, top=3)
    assert res.to_json()["stack"] == name
    for p in res.plans:
        e = p.estimate
        assert e.stack == name
        again = estimate(model="gpt2-xl", hw="dgx-a100", gpus=16, dp=e.plan.dp, tp=e.plan.tp, pp=e.plan.pp,
                         zero=e.plan.zero, sp=e.plan.sp, schedule=e.plan.schedule, virtual_stages=e.plan.virtual_stages,
                         micro_batch=e.setup.micro_batch, global_batch=res.global_batch, recompute=e.setup.recompute,
                         stack=name)
        assert again.step_time_s == pytest.approx(e.step_time_s, rel=1e-9)


def test_the_stacks_refuse_plans_they_do_not_run():
    tried("plans")
    with pytest.raises(AdvisorError, match="megatron-core does not run a GPipe schedule"):
        estimate("gpt2", "dgx-a100", gpus=8, pp=2, schedule="gpipe", stack="megatron-core")
    with pytest.raises(AdvisorError, match="deepspeed does not run tensor parallelism"):
        estimate("gpt2", "dgx-a100", gpus=8, tp=2, stack="deepspeed")


@settings(max_examples=15, deadline=None)
@given(shard=st.sampled_from([8, 64, 512, 4096]), elems=st.integers(10**5, 10**9))
def test_a_zero3_call_never_costs_less_with_more_host_ops_or_ranks(shard, elems):
    """Property: the per-rank host ops only add; more ranks never make a per-tensor call cheaper."""
    from advisor.hardware import load_hardware
    from advisor.model import load_model
    from advisor.parallel import zero3
    from advisor.training import TrainingSetup
    from advisor.workload import Workload
    st_ = load_stack("megatron-deepspeed")
    w = Workload.of(load_model("gpt3-175b"), load_hardware("dgx-a100"), st_, TrainingSetup(seq_len=2048, global_batch=4096))
    z = st_.engine.zero3_calls
    quiet = z.model_copy(update={"host_ops_per_rank_gather": 0, "host_ops_per_rank_reduce": 0})
    a = zero3.submodule_calls(w, z, 1.0, float(shard), 8.0, 2.0, 2.0, float(elems), 8.6)
    b = zero3.submodule_calls(w, quiet, 1.0, float(shard), 8.0, 2.0, 2.0, float(elems), 8.6)
    c = zero3.submodule_calls(w, z, 1.0, float(shard) * 2, 8.0, 2.0, 2.0, float(elems), 8.6)
    for x, y, more in zip(a.gather_s + a.reduce_s, b.gather_s + b.reduce_s, c.gather_s + c.reduce_s):
        assert float(x) >= float(y) and float(more) >= float(x)


def test_nanotron_numbers_are_its_sources():
    """nanotron 0.4 read from its source (flash_attn does not build on CPU, so nothing is probed): DDP bucket 25 MB
    (config/config.py:182), fp32 gradient accumulation and master weights, DDP / ZeRO-1, TP (+SP), AFAB (GPipe) and
    1F1B pipelines, no recomputation (0.4's LlamaDecoderLayer checkpoints nothing; git main's recompute_layer came
    after it, and the exporter writes 0.4's keys); a Llama layer saves 8f of its GLU MLP (gate_up output, SiLU
    output, product), as torchtitan's probed SwiGLU block does."""
    nt = load_stack("nanotron")
    e = nt.engine
    assert (e.bucket_MiB, e.main_grads, e.reduce_dtype, e.master_weights) == (25.0, "fp32", "fp32", "always")
    assert e.offers == ["ddp", "zero1", "tp", "sp", "pp", "gpipe"] and e.selective is None
    saved = nt.memory.saved[0]
    assert saved.layer.split["d_ff"] == 8 == load_stack("torchtitan").memory.saved[0].layer.split["d_ff"]
    with pytest.raises(AdvisorError, match="nanotron has no selective recomputation"):
        estimate("llama3-8b", "dgx-h100", gpus=8, recompute="selective", stack="nanotron")
    assert e.checkpointing == ["none"]
    with pytest.raises(AdvisorError, match="nanotron does not run full checkpointing"):
        estimate("llama3-8b", "dgx-h100", gpus=8, recompute="full", stack="nanotron")
    with pytest.raises(AdvisorError, match="nanotron does not run ZeRO-2"):
        estimate("llama3-8b", "dgx-h100", gpus=8, zero=2, stack="nanotron")
    # GPT-2 (GELU, LayerNorm) is not nanotron's model: the profile says so in one line
    with pytest.raises(AdvisorError, match="stack nanotron's model code does not build gpt2, which has a gelu MLP, "
                                           "layernorm norms"):
        estimate("gpt2", "dgx-a100", gpus=8, stack="nanotron")


def test_its_offload_and_context_parallelism_are_not_ranked_together():
    """megatron-deepspeed's offload is DeepSpeed's ZeRO-Offload (the DeepSpeed JSON) and its CP Megatron's flags: no
    format writes both, so such a plan (ranked first for Llama 3 70B on two DGX H100s) is refused, and the search's
    rows export."""
    with pytest.raises(AdvisorError, match="ZeRO-Offload, whose config has no context parallelism"):
        estimate("llama3-70b", "dgx-h100", gpus=16, dp=2, tp=4, cp=2, zero=2, sp=True, offload="optimizer-cpu",
                 stack="megatron-deepspeed")
    found = plan(model="llama3-70b", hw="dgx-h100", gpus=16, stack="megatron-deepspeed", top=20)
    assert not any(p.plan.cp > 1 and p.plan.offload.value != "none" for p in found.plans)


def test_its_offload_and_expert_parallelism_are_not_ranked_together():
    """Nor its offload with expert parallelism (Megatron's --expert-model-parallel-size; DeepSpeed's JSON has none): such
    plans were ranked for Mixtral 8x7B on a DGX A100 and every format refused them."""
    with pytest.raises(AdvisorError, match="ZeRO-Offload, whose config has no expert parallelism"):
        estimate("mixtral-8x7b", "dgx-a100", gpus=8, dp=8, zero=2, ep=8, offload="optimizer-cpu", micro_batch=2,
                 global_batch=256, seq=2048, stack="megatron-deepspeed")
    found = plan(model="mixtral-8x7b", hw="dgx-a100", gpus=8, seq=2048, stack="megatron-deepspeed", top=40)
    assert not any(p.plan.ep > 1 and p.plan.offload.value != "none" for p in found.plans)


def test_megatron_zero1_waits_for_the_embeddings_bucket_after_backward_and_before_forward(tmp_path):
    """The distributed optimizer's buckets fill in reverse parameter order and never split a parameter (megatron-core
    0.19.2 param_and_grad_buffer.py:975-989), so Llama 3 8B's 128256 x 4096 input embedding, its gradient made last,
    closes the last bucket: its fp32 reduce-scatter starts only once the backward has ended (finish_grad_sync,
    param_and_grad_buffer.py:781), and under --overlap-param-gather the next forward's pre-hook on the embedding waits
    for that bucket's bf16 all-gather before it dispatches the next one (distributed_data_parallel.py:431-466,
    param_and_grad_buffer.py:532-567). Before, ZeRO-1's reduce-scatter had no such floor (with Llama 3 8B on 8 DGX H100s, 22.6
    ms exposed, all of it NCCL's held SMs) and the first gather was a 152.6 MiB bucket of bf16 weights (80M elements)."""
    from advisor import comm
    from advisor.comm import Collective
    from advisor.hardware import load_hardware
    hw, table = load_hardware("dgx-h100"), 128256 * 4096
    # NCCL's held SMs left out (no channels: advisor.comm.held_sms), which alone exposed 22.6 ms of it before
    hw = hw.model_copy(update={link: getattr(hw, link).model_copy(update={"nccl_channels": None})
                               for link in ("intra_node", "inter_node")})
    # the gradient NaN check, costed beside it in comm/dp_grad (test_megatron_grad_nan_check), left out
    stack = tmp_path / "no-check.yaml"
    stack.write_text("base: megatron-core\nname: no-check\ndescription: t\nengine: {grad_nan_check: false}\n")
    for tp in (1, 8):
        e = estimate("llama3-8b", hw, gpus=64 * tp, tp=tp, zero=1, seq=8192, global_batch=256,
                     recompute="full", stack=str(stack), sp=tp > 1)
        rs = float(comm.collective_time(Collective.reduce_scatter, 64, table / tp * 4.0, hw, 8 // tp))
        ag = float(comm.collective_time(Collective.all_gather, 64, table / tp * 2.0, hw, 8 // tp))  # dp ranks 8 // tp to a node
        # 6.4 ms and 3.3 ms at tp 1 (0 and 1.6 ms before), costed as their share of the whole call
        assert e.breakdown["comm/dp_grad"] == pytest.approx(rs, rel=0.1), tp
        assert e.breakdown["comm/zero_params"] == pytest.approx(ag, rel=0.1), tp
