"""The plan search: issue 7's acceptance examples, ranking, explanation, agreement with estimate."""

import re

import pytest

from advisor import comm, estimate, plan
from advisor.comm import Collective
from advisor.search import PAYS_NOT


@pytest.fixture(scope="module")
def gpt3():
    # arXiv 2104.04473 Table 2 setting: GPT-3 175B, 1536 A100s, global batch 1536, seq 2048. Its ZeRO-3 comparison
    # (Sec. 5.4: PTD-P 70% faster at 1536 GPUs) ran DeepSpeed's ZeRO-3 of 2021 beside Megatron: the stack that
    # comparison measured. (Under today's megatron-core, Megatron-FSDP with block recomputation is not a comparison
    # anyone published at this scale, so this test does not pin it.)
    return plan(model="gpt3-175b", hw="dgx-a100", gpus=1536, global_batch=1536, seq=2048, top=5,
                stack="megatron-deepspeed")


def test_gpt3_top_plan_keeps_tp_in_a_node_and_pipelines_across_nodes(gpt3):
    best = gpt3.plans[0].estimate
    assert gpt3.candidates > 10_000
    assert best.plan.tp <= 8 and 8 % best.plan.tp == 0
    assert best.plan.pp > 1 and best.plan.tp * best.plan.dp >= 8  # each stage spans >= a node
    assert all(p.estimate.fits for p in gpt3.plans)


def test_ranked_by_step_time_with_reasons():
    res = plan(model="gpt2-xl", hw="dgx-a100", top=10)
    times = [p.estimate.step_time_s for p in res.plans]
    assert times == sorted(times) and len(times) == 10
    assert all(p.reason and "headroom" in p.reason for p in res.plans)
    assert {"ddp", "zero"} <= set(res.best_by_kind)
    assert min(res.best_by_kind.values()) == pytest.approx(times[0])


def test_search_and_estimate_agree():
    res = plan(model="gpt2-medium", hw="dgx-h100", gpus=8, top=3)
    for p in res.plans:
        e = p.estimate
        again = estimate(model="gpt2-medium", hw="dgx-h100", gpus=8, dp=e.plan.dp, tp=e.plan.tp, pp=e.plan.pp,
                         zero=e.plan.zero, sp=e.plan.sp, schedule=e.plan.schedule,
                         virtual_stages=e.plan.virtual_stages, micro_batch=e.setup.micro_batch,
                         global_batch=res.global_batch, seq=e.setup.seq_len, recompute=e.setup.recompute,
                         offload=e.plan.offload.value, stack=e.setup.stack)
        assert again.step_time_s == pytest.approx(e.step_time_s, rel=1e-9)
        assert again.memory.peak_bytes == pytest.approx(e.memory.peak_bytes, rel=1e-9)


def test_objective_memory_orders_by_memory():
    res = plan(model="gpt2-large", hw="dgx-a100", objective="memory", top=5)
    mem = [p.estimate.memory.peak_bytes + p.estimate.memory.overhead_bytes for p in res.plans]
    assert mem == sorted(mem)


PTD_P = dict(tp=8, pp=12, dp=16, micro_batch=1, schedule="interleaved", virtual_stages=2)  # Table 2, 1536 GPUs
ZERO3 = dict(tp=1, pp=1, dp=1536, zero=3, micro_batch=1)


def _table2(kw):
    return estimate(model="gpt3-175b", hw="dgx-a100", gpus=1536, global_batch=1536, seq=2048, recompute="full",
                    precision="fp16-mixed", attention="eager", stack="megatron-deepspeed", optimizer="adamw-fused",
                    overlap_grad_reduce=False, **kw).hw_tflops_per_gpu


# Issue 19: NCCL's ring all-gather crosses the network on every NIC the group's GPUs own, so 175B parameters gather on
# 1,536 A100s in ~2 s, and a ZeRO-3 step costed as one gather call per pass is compute-bound (176 TFLOP/s against
# SC21's 44). DeepSpeed 0.3.13 gathers each tensor on its own (4 per GPT layer above stage3_param_persistence_threshold),
# reduce-scatters each of the 12, synchronises the device in every fetch, prefetches only while fewer than 1e9 elements
# are live, and issues its list-form collectives with host ops per rank (stack_profiles/megatron-deepspeed.yaml
# zero3_calls, advisor/parallel/zero3.py). Derived, not fitted: the six ZeRO-3 rows come out 14% off on average (bias
# -2%), but at 1,536 GPUs the per-rank host ops make the 175B step 103 s against the 66.7 s measured: 28.6 TFLOP/s.
SC21_ZERO3 = pytest.mark.xfail(strict=True, reason="SC21's 175B ZeRO-3 row at 1,536 GPUs: the per-call costs derived "
                               "from DeepSpeed 0.3.13 give 28.6 TFLOP/s against the 44 measured (the 768-GPU row within 5%)")


def test_table2_order_ptd_p_beats_zero3():
    # Narayanan et al. 2021 Table 2 at 1536 GPUs: PTD-P 141 TFLOP/s per GPU, ZeRO-3 44 (recompute counted)
    assert _table2(PTD_P) > 1.5 * _table2(ZERO3)


def test_table2_ptd_p_within_15_percent():
    assert _table2(PTD_P) == pytest.approx(141, rel=0.15)


@SC21_ZERO3
def test_table2_zero3_within_15_percent():
    assert _table2(ZERO3) == pytest.approx(44, rel=0.15)


def test_deepspeed_03_zero3_pays_a_ring_start_up_per_tensor():
    """DeepSpeed 0.3.13 issues one all-gather per tensor of >= 1e5 elements (4 per GPT-3 layer: qkv, out, fc1, fc2
    weights; biases and LayerNorms persist) and one reduce-scatter per tensor (12): at 768 ranks each call pays
    NCCL's ring start-up over every rank (~3.7 ms, advisor.comm), plus 2 or 3 host ops per rank at the stack's
    8.6 us an op (torch's list-form collectives)."""
    from advisor.hardware import load_hardware
    from advisor.model import load_model
    from advisor.parallel import zero3
    from advisor.stack import load_stack
    from advisor.training import TrainingSetup
    from advisor.workload import Workload
    st = load_stack("megatron-deepspeed")
    w = Workload.of(load_model("gpt3-175b"), load_hardware("dgx-a100"), st,
                    TrainingSetup(seq_len=2048, micro_batch=1, global_batch=768, precision="fp16-mixed"))
    sizes = zero3.tensors(w, 1.0)
    assert [len(v) for v in sizes.values()] == [2 + 4, 2, 2, 2]  # weight + bias each, the two LayerNorms' w and b
    z = st.engine.zero3_calls
    calls = zero3.submodule_calls(w, z, 1.0, 768.0, 8.0, 2.0, 2.0, 0.0, 8.6)
    one_call = float(comm.collective_time(Collective.all_gather, 768, 1.0, w.hw, 8))
    assert one_call == pytest.approx(3.7e-3, rel=0.05)
    out = float(calls.gather_s[1])  # attention/out: one 12288 x 12288 weight, its 12288-element bias persists
    assert out == pytest.approx(float(comm.collective_time(Collective.all_gather, 768, 12288**2 * 2.0, w.hw, 8))
                                + 2 * 768 * 8.6e-6, rel=1e-9)
    assert float(calls.reduce_s[1]) > 2 * one_call + 2 * 3 * 768 * 8.6e-6  # two reduce-scatters, bias included


def _zero3_gpt3(stack, recompute, gpus=1536, mb=1):
    return estimate(model="gpt3-175b", hw="dgx-a100", gpus=gpus, dp=gpus, zero=3, micro_batch=mb, global_batch=1536,
                    seq=2048, recompute=recompute, precision="fp16-mixed", stack=stack, optimizer="adamw-fused")


def test_deepspeed_zero3_regathers_for_recomputation_and_overlaps_per_linear_layer():
    from advisor import comm
    from advisor.comm import Collective
    from advisor.hardware import load_hardware
    from advisor.model import load_model
    hw = load_hardware("dgx-a100")
    params = load_model("gpt3-175b").n_params  # gathered and reduced in half precision: 2 bytes each
    ag = float(comm.collective_time(Collective.all_gather, 1536, params * 2.0, hw, 8))
    # the whole model gathers at the nodes' NIC rate (8x 200 Gb/s, 0.85 of it), NCCL's ring on every NIC
    assert params * 2.0 * 1535 / 1536 / ag == pytest.approx(200e9 * 0.85, rel=0.05)
    # DeepSpeed gathers again for the recomputed forward, one tensor at a time: a third gather pass is exposed with
    # full recomputation (the per-tensor reduce-scatters, the same in both, are most of the rest) ...
    e, none = _zero3_gpt3("megatron-deepspeed", "full"), _zero3_gpt3("megatron-deepspeed", "none")
    assert e.breakdown["comm/zero_params"] > 1.1 * none.breakdown["comm/zero_params"] > 0
    # ... while FSDP (the hf-trainer stack) prefetches a whole layer ahead and hides nearly all of it
    f = _zero3_gpt3("hf-trainer", "full")
    assert f.breakdown["comm/zero_params"] < 0.2 * e.breakdown["comm/zero_params"]


def test_fits_one_gpu_is_asked_again_only_when_the_stack_changed(monkeypatch):
    """The auto stack asks whether the model fits one GPU in the hf-trainer stack; when it does, the decision
    tree reuses that answer (the same question). When it does not, the tree asks again in megatron-core (auto's
    stack then), whose memory peak differs: gpt2 (bf16-mixed) fits a 3.04 GiB GPU in neither."""
    from advisor import auto, search
    from advisor.hardware import load_hardware

    calls, real = [], auto.fits_one_gpu
    monkeypatch.setattr(auto, "fits_one_gpu", lambda m, hw, st, su, h=0.0: calls.append(st.name) or real(m, hw, st, su, h))
    res = search.plan("gpt2-xl", "dgx-a100", top=1)
    assert calls == ["hf-trainer"] and res.tree["fits_one_gpu"]
    calls.clear()
    a100 = load_hardware("dgx-a100")
    small = a100.model_copy(update={"gpu": a100.gpu.model_copy(update={"memory_GiB": 3.04})})
    res = search.plan("gpt2", small, gpus=8, top=1)
    assert calls == ["hf-trainer", "megatron-core"]
    # megatron-core keeps fp32 main gradients (2 bytes a parameter more than hf-trainer's DDP): no fit either
    assert res.plans[0].setup.stack == "megatron-core" and not res.tree["fits_one_gpu"]


def test_the_search_says_which_stack_it_costed():
    # --stack auto costs each plan kind in the stack its users most likely run (api.AUTO_RULE): gpt2 fits one GPU, so
    # its data-parallel plans are hf-trainer's and its TP/PP plans megatron-core's; llama3-8b does not fit one H100 in
    # hf-trainer, so every plan of it is megatron-core's. The output states the rule; an FSDP plan exported to
    # accelerate runs on HF modules, so each row names its stack.
    from advisor.api import AUTO_RULE
    small = plan(model="gpt2", hw="dgx-a100", top=50)
    big = plan(model="llama3-8b", hw="dgx-h100", top=5)
    forced = plan(model="gpt2", hw="dgx-a100", top=1, stack="megatron-deepspeed")
    for res in (small, big):
        doc = res.to_json()
        assert doc["stack"] == "auto" and doc["stack_rule"] == AUTO_RULE
        assert any(n.startswith("stack: --stack auto: plans with tensor, pipeline or context parallelism in megatron-core")
                   for n in res.notes())
        for row in doc["plans"]:
            mp = row["plan"]["tp"] > 1 or row["plan"]["pp"] > 1
            assert row["stack"] == ("megatron-core" if mp or res is big else "hf-trainer"), row["label"]
    assert small.to_json()["stacks"] == ["hf-trainer", "megatron-core"] and big.to_json()["stacks"] == ["megatron-core"]
    # both kinds were costed: hf-trainer's DDP and ZeRO plans ranked, megatron-core's TP and PP plans left out, as
    # none beats megatron-core's own data-parallel best (the next test)
    assert {"ddp", "zero"} <= set(small.best_by_kind) and small.rejected[PAYS_NOT.format(stack="megatron-core")] > 0
    assert big.stack_note is None and PAYS_NOT.format(stack="megatron-core") not in big.rejected
    assert forced.to_json()["stack"] == "megatron-deepspeed" and forced.to_json()["stack_rule"] is None
    assert any("Megatron's fused kernels" in n for n in forced.notes())


def test_auto_ranks_a_model_parallel_plan_only_where_it_beats_its_own_stacks_data_parallel_plans():
    """GPT-2 XL on one DGX A100 (the README's first command): megatron-core's ZeRO-1 dp=4 x PP=2 (interleaved) once
    ranked first under --stack auto, above hf-trainer's ZeRO-2, for megatron-core's kernels rather than for its
    pipeline: megatron-core's own ZeRO-1 dp=8 is faster than every TP/PP plan of it. So the auto ranking holds
    hf-trainer's data-parallel plans (the decision tree's DDP/ZeRO branch for a model that fits one GPU) and says
    what megatron-core's best is."""
    auto = plan(model="gpt2-xl", hw="dgx-a100", top=20)
    mc = plan(model="gpt2-xl", hw="dgx-a100", top=2000, stack="megatron-core")
    mc_dp = [p.estimate for p in mc.plans if p.estimate.plan.tp == 1 and p.estimate.plan.pp == 1]
    mc_mp = [p.estimate for p in mc.plans if p.estimate.plan.tp > 1 or p.estimate.plan.pp > 1]
    assert mc_dp[0].step_time_s < mc_mp[0].step_time_s  # within megatron-core the pipeline does not pay
    assert all(p.estimate.stack == "hf-trainer" for p in auto.plans)
    assert auto.stack_note == (f"megatron-core's own best data-parallel plan is {mc_dp[0].plan.label()} at "
                               f"{mc_dp[0].step_time_s:.3g} s; none of its TP/PP/CP plans beats it, so none is ranked "
                               "(--stack megatron-core ranks them all)")
    assert f"stack: {auto.stack_note}" in auto.notes() and auto.to_json()["stack_note"] == auto.stack_note
    assert auto.rejected[PAYS_NOT.format(stack="megatron-core")] >= len(mc_mp)


def test_estimate_and_export_follow_the_auto_rule():
    """The same rule for one plan: gpt2 DDP in hf-trainer, gpt2 TP=2 in megatron-core, printed and in --json; a
    searched row and its estimate agree."""
    from advisor.api import AUTO_RULE
    ddp = estimate(model="gpt2", hw="dgx-a100", gpus=8)
    tp = estimate(model="gpt2", hw="dgx-a100", gpus=8, tp=2)
    assert (ddp.stack, tp.stack) == ("hf-trainer", "megatron-core")
    assert tp.stack_rule == AUTO_RULE and estimate(model="gpt2", hw="dgx-a100", gpus=8, stack="hf-trainer").stack_rule is None
    res = plan(model="gpt2", hw="dgx-a100", top=50, stack="megatron-core")
    row = next(p.estimate for p in res.plans if p.estimate.plan.tp > 1 or p.estimate.plan.pp > 1)
    again = estimate(model="gpt2", hw="dgx-a100", gpus=8, dp=row.plan.dp, tp=row.plan.tp, pp=row.plan.pp,
                     zero=row.plan.zero, sp=row.plan.sp, schedule=row.plan.schedule,
                     virtual_stages=row.plan.virtual_stages, micro_batch=row.setup.micro_batch,
                     global_batch=res.global_batch, recompute=row.setup.recompute)
    assert again.stack == row.stack == "megatron-core"
    assert again.step_time_s == pytest.approx(row.step_time_s, rel=1e-9)


def test_the_search_keeps_the_fastest_checkpointing_policy_that_fits_per_plan():
    """Issue 16: "the search picks the cheapest policy that fits, per plan": no two rows differ only in their
    policy, and for each row every policy that would be faster for the same plan does not fit (5% headroom)."""
    from advisor.api import estimate_plan
    from advisor.training import Recompute

    res = plan(model="llama3-70b", hw="dgx-h100", gpus=64, seq=8192, top=8)
    keys = [(p.estimate.label, p.estimate.setup.micro_batch, p.estimate.stack) for p in res.plans]
    assert len(set(keys)) == len(keys), keys
    cap = res.hardware.gpu.memory_bytes * 0.95
    policies = {p.estimate.setup.recompute.value for p in res.plans}
    assert policies - {"none"}, policies  # at seq 8192 the 70B needs checkpointing in some of the best plans
    for row in res.plans:
        e = row.estimate
        for policy in ("none", "selective", "full"):
            if policy == e.setup.recompute.value:
                continue
            other = estimate_plan(e.model, e.hw, e.plan, e.setup.model_copy(update={"recompute": Recompute(policy), "recompute_layers": 1}),
                                  e.world_size)
            if other.step_time_s < e.step_time_s * (1.0 - 1e-9):  # a tie (recomputation hidden behind gathers) is none
                assert other.memory.peak_bytes + other.memory.overhead_bytes > cap, (e.label, e.setup.recompute, policy)


def test_an_overruled_rule_of_thumb_is_explained_by_the_parts_that_differ():
    """GPT-2 XL on one DGX A100: hf-trainer's ZeRO-1 beats its DDP (the HF guide's "DDP first") by compute, not by
    the optimizer step the reason used to name whatever the numbers said: hf-trainer's DeepSpeed ZeRO-1 and FSDP run
    the layers on bf16 weights (engine.fsdp_param_dtype: half, half_from_zero 1), its DDP under autocast on fp32. The reason gives the
    saving in the two plans' own parts; a ZeRO plan slower than DDP's best overrules nothing."""
    res = plan(model="gpt2-xl", hw="dgx-a100", top=40)
    top = res.plans[0].estimate
    ddp = estimate(model="gpt2-xl", hw="dgx-a100", gpus=8, micro_batch=4, global_batch=res.global_batch)
    # ZeRO-2 (FSDP1 SHARD_GRAD_OP) first since its no_sync accumulation gathers and reduces once a step (advisor.parallel.
    # no_sync), ZeRO-1 (DeepSpeed's) before: either runs on bf16 weights
    assert top.plan.zero in (1, 2) and ddp.step_time_s == pytest.approx(res.best_by_kind["ddp"], rel=1e-9)
    compute = lambda e: sum(e.breakdown[k] for k in ("compute/forward", "compute/backward", "compute/recompute"))  # noqa: E731
    saved = compute(ddp) - compute(top)
    assert saved > 0.9 * (ddp.step_time_s - top.step_time_s)  # compute is the gap (1.82 of 1.87 s)
    assert (f"overrules the rule of thumb (DDP first): {saved:.3g} s less compute (hf-trainer runs ZeRO-1/2/3 on "
            "half-precision weights, DDP under autocast on fp32 ones) than DDP's best") in res.plans[0].reason
    mdp = plan(model="gpt2-xl", hw="dgx-a100", top=40, stack="megatron-deepspeed")
    for p in (*res.plans, *mdp.plans):
        e = p.estimate
        if e.plan.zero >= 1 and e.plan.tp == e.plan.pp == 1 and e.step_time_s > (res if p in res.plans else mdp).best_by_kind["ddp"]:
            assert "overrules" not in p.reason, p.reason
    assert any(re.search(r"s less optimizer step(, [^(]+)? than DDP's best", p.reason) for p in mdp.plans)  # ZeRO-1's sharded step


@pytest.mark.parametrize("kw, ranked", [
    (dict(model="gpt2-medium", hw="dgx-h100", precision="fp32", attention="eager", objective="memory"), True),
    (dict(model="gpt2-large", hw="titan-rtx-pcie", gpus=2), False),
    (dict(model="gpt2", hw="aws-p4d", gpus="8:32", objective="throughput"), False),
], ids=["memory", "pcie", "range-throughput"])
def test_auto_ranks_no_model_parallel_plan_its_own_data_parallel_plans_beat(kw, ranked):
    """The invariant behind the auto rule's note, on other objectives and a GPU range: every megatron-core TP/PP/CP row
    of an auto ranking beats megatron-core's own best data-parallel plan on its GPU count, by the objective (by memory,
    TP and PP do beat it: 32 of them are ranked)."""
    from advisor.ranking import objective_key

    auto = plan(top=200, **kw)
    assert any(p.estimate.stack == "megatron-core" for p in auto.plans) is ranked
    assert auto.stack_note.endswith("(--stack megatron-core ranks them all)")
    mc = plan(top=100_000, stack="megatron-core", **kw)
    for p in auto.plans:
        e = p.estimate
        if e.stack != "megatron-core" or (e.plan.tp == 1 and e.plan.pp == 1 and e.plan.cp == 1):
            continue
        key = lambda x: float(objective_key(auto.objective, x.step_time_s, x.memory.peak_bytes + x.memory.overhead_bytes,  # noqa: E731
                                            x.tokens_per_s * x.step_time_s, x.world_size))
        dp = [q.estimate for q in mc.plans if q.estimate.world_size == e.world_size
              and q.estimate.plan.tp == q.estimate.plan.pp == q.estimate.plan.cp == 1]
        assert dp and key(e) < min(key(q) for q in dp), e.label


def test_an_explicit_stack_that_cannot_write_the_model_says_so():
    """`--stack megatron-core` ranks OLMo 2 in megatron-core's engine, but neither Megatron-LM's flags nor Bridge's
    overrides describe its full-width q/k norms (advisor.export.unwritable), so `advisor export` refuses every row:
    the plan says so, in words and in --json; a model the formats write (Llama 3 8B) gets no such line."""
    from advisor.export import export
    from advisor.export.common import ExportError

    kw = dict(hw="dgx-h100", gpus=8, seq=2048, global_batch=64, top=1, stack="megatron-core")
    olmo = plan("olmo-2-7b", **kw)
    assert olmo.to_json()["export_lacks"] == ["full-width q/k norms"]
    line = next(n for n in olmo.notes() if n.startswith("export:"))
    assert "do not write olmo-2-7b (full-width q/k norms)" in line
    e = olmo.plans[0].estimate
    with pytest.raises(ExportError, match="full-width q/k norms"):
        export(None, olmo.model_spec, olmo.hardware, e.plan, e.setup, e.grad_accum, e.world_size, stack=olmo.stack)
    llama = plan("llama3-8b", **kw)
    assert llama.to_json()["export_lacks"] == [] and not any(n.startswith("export:") for n in llama.notes())
    assert plan("olmo-2-7b", **{**kw, "stack": "auto"}).to_json()["export_lacks"] == []


def test_plans_within_the_tie_band_are_counted_over_the_whole_search():
    """near_best counts every distinct fitting plan within TIE_BAND (5%, the smallest whole-stack step-time MAPE
    `advisor validate` reports) of the fastest step, not only the rows shown: the same count as the full ranking's."""
    from advisor.ranking import TIE_BAND

    kw = dict(hw="dgx-a100", gpus=8, seq=1024, global_batch=64, stack="hf-trainer")
    few, every = plan("gpt2-xl", top=2, **kw), plan("gpt2-xl", top=100_000, **kw)
    best = every.plans[0].estimate.step_time_s
    within = sum(p.estimate.step_time_s <= best * (1 + TIE_BAND) for p in every.plans)
    assert few.near_best == every.near_best == within > len(few.plans)
    assert f"{within:,} plans within 5% of the fastest step" in " ".join(few.notes())
    assert few.to_json()["near_best"] == within


def _again(res, e, **kw):
    """The estimate of a search row's plan, every field the row records passed back (its stack unless ``kw``'s)."""
    p, s = e.plan, e.setup
    args = dict(model=res.model_spec.name, hw=res.hardware.name, gpus=e.world_size, dp=p.dp, tp=p.tp, pp=p.pp,
                zero=p.zero, sp=p.sp, schedule=p.schedule.value, virtual_stages=p.virtual_stages, cp=p.cp,
                micro_batch=s.micro_batch, global_batch=res.global_batch, seq=s.seq_len, recompute=s.recompute.value,
                offload=p.offload.value, stack=e.stack, precision=s.precision.value, attention=s.attention.value,
                recompute_layers=s.recompute_layers,
                tp_overlap=s.tp_overlap)
    return estimate(**{**args, **kw})


def test_a_search_row_of_tp_without_sp_is_its_estimate_beside_overlapped_plans():
    """A search holds plans with and without the stack's TP overlap (userbuffers, SP only) together: the overlapped
    plans' branch skipped the backward overlap of the others, so a TP=8 plan without SP cost 3.85 s of TP collectives
    in the search and 2.87 s estimated alone (megatron-bridge-perf; a randomized plan -> estimate round trip)."""
    res = plan("phi-3-mini", "azure-nd-h100-v5", stack="megatron-bridge-perf", precision="fp8-tensorwise",
               attention="eager", objective="memory", top=12)
    rows = [p.estimate for p in res.plans]
    assert any(e.plan.tp > 1 and e.plan.sp for e in rows) and any(e.plan.tp > 1 and not e.plan.sp for e in rows)
    for e in rows:
        again = _again(res, e)
        assert again.step_time_s == pytest.approx(e.step_time_s, rel=1e-9), e.label
        assert again.breakdown == pytest.approx(e.breakdown, rel=1e-9), e.label


def test_rows_pass_back_whole_zb_v_chunks_tp_overlap_without_tp_and_auto():
    """Rows the round trip found that did not pass back as they were: ZB-V's two chunks (the search records
    virtual_stages 2, estimate recorded 1); a TP=1 row of a search run with --tp-overlap (nothing to overlap);
    --stack auto deciding whether the model fits one GPU with plan's 5% headroom in both."""
    zb = plan("llama2-7b", "azure-nd-h100-v5", gpus=8, stack="torchtitan", seq=256, global_batch=256, top=6)
    e = next(p.estimate for p in zb.plans if p.estimate.plan.schedule.value in ("zb-v", "dualpipev"))
    assert e.plan.virtual_stages == 2 and _again(zb, e).plan == e.plan
    ub = plan("gpt2-xl", "aws-p5e", gpus=1, stack="megatron-bridge-perf", global_batch=4, tp_overlap="userbuffers", top=1)
    e = ub.plans[0].estimate
    assert e.plan.tp == 1 and _again(ub, e).step_time_s == pytest.approx(e.step_time_s, rel=1e-9)
    auto = plan("llama3-8b", "dgx-h100", seq=256, precision="bf16", top=1)
    e = auto.plans[0].estimate
    again = _again(auto, e, stack="auto")
    assert (again.stack, again.step_time_s) == (e.stack, pytest.approx(e.step_time_s, rel=1e-9))


def test_the_command_lines_headroom_is_the_librarys():
    from advisor.cli import cli
    from advisor.options import DEFAULT_HEADROOM

    opt = next(p for p in cli.commands["plan"].params if p.name == "memory_headroom")
    assert opt.default == DEFAULT_HEADROOM


def test_a_range_from_one_gpu_costs_that_gpu_in_autos_one_gpu_stack():
    """--gpus 1:2 under auto costed the 1-GPU plans in the stack auto picked for 2 GPUs (megatron-core), which
    estimate --stack auto on one GPU does not pick (hf-trainer, the seeds' single-GPU answer: api.resolve_stack)."""
    res = plan("llama2-13b", "dgx-h200", gpus=(1, 2), precision="fp8-delayed", seq=256, objective="throughput", top=400)
    one = [p.estimate for p in res.plans if p.estimate.world_size == 1]
    assert one and {e.stack for e in one} == {"hf-trainer"}
    e = one[0]
    assert _again(res, e, stack="auto").step_time_s == pytest.approx(e.step_time_s, rel=1e-9)


def test_a_default_batch_rounded_far_past_half_a_million_tokens_says_how_far():
    """The default global batch is ~0.5M tokens rounded up to a multiple of the GPU count (every pure-DP plan divides
    it): 512 x 1,024 tokens for GPT-2 XL on 8 GPUs, as aimed; 16,384 x 8,192 = 134M tokens for Llama 3 405B on 16,384
    GPUs, which the header now says (Meta trained it at 16M tokens a step: Dubey et al. 2024 s.3.4.1)."""
    small = plan("gpt2-xl", "dgx-a100", top=1).header()
    assert "global batch 512 (default: ~0.5M tokens, a multiple of the GPU count)" in small
    big = plan("llama3-405b", "dgx-h100", gpus=16_384, top=1).header()
    assert "global batch 16384" in " ".join(big.split()) and "134M tokens a step" in " ".join(big.split())


def test_auto_ranks_zero_infinity_where_nothing_else_fits_and_estimate_agrees():
    """Mixtral-8x7B on 2 H100s: --stack auto costs a model this large in megatron-core, which offloads no parameters,
    and said "no plan fits" (its hint: 16 GPUs) though one GPU found hf-trainer's ZeRO-3 with parameters on the CPU and
    --stack hf-trainer found it on 2. Where none of megatron-core's plans fits, auto ranks hf-trainer's ZeRO-Infinity
    plans (the offloads megatron-core lacks), and estimate costs such a plan there too."""
    res = plan("mixtral-8x7b", "dgx-h100", gpus=2, top=3)
    assert res.plans, "a ZeRO-Infinity plan fits"
    top = res.plans[0].estimate
    assert (top.stack, top.plan.zero, top.plan.offload.value) == ("hf-trainer", 3, "params-cpu")
    again = estimate(model="mixtral-8x7b", hw="dgx-h100", gpus=2, zero=3, offload="params-cpu",
                     micro_batch=top.setup.micro_batch, global_batch=top.setup.global_batch,
                     recompute=top.setup.recompute.value, recompute_layers=top.setup.recompute_layers)
    assert (again.stack, again.step_time_s, again.memory.peak_bytes) == ("hf-trainer", top.step_time_s,
                                                                        top.memory.peak_bytes)
    # a range from one GPU (hf-trainer's, ZeRO-Offload) searches ZeRO-Infinity on the counts nothing else fits: 2
    ranged = plan("mixtral-8x7b", "dgx-h100", gpus="1:2", top=1).plans[0].estimate
    assert (ranged.world_size, ranged.step_time_s) == (2, top.step_time_s)
    # a TP/PP/CP plan with parameters offloaded stays megatron-core's, which refuses it in one line
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match="megatron-core does not offload params-cpu"):
        estimate(model="llama3-70b", hw="dgx-h100", gpus=8, dp=4, tp=2, zero=3, offload="params-cpu")
    # where megatron-core's plans fit, they are auto's: no ZeRO-Infinity row is searched
    assert {p.estimate.stack for p in plan("mixtral-8x7b", "dgx-h100", gpus=8, top=5).plans} == {"megatron-core"}


def test_vs_best_is_said_in_the_objectives_terms_over_gpu_counts():
    """plan --objective throughput over --gpus 128:512 ranked Kimi-K2 on GB300 with plan 2 (128 GPUs, 5,610 tokens/s
    per GPU) 0.6% behind plan 1 (256 GPUs, 5,645), and its reason said "+101.3% vs best": the step times of two GPU
    counts. The ranking's own terms (GPU-seconds a token, ranking.objective_key) say how far behind it ranks."""
    from advisor.search import plan

    res = plan("kimi-k2", "gb300-nvl72", gpus="128:512", global_batch=4096, seq=4096, precision="mxfp8",
               objective="throughput", top=5)
    # the best plan on another GPU count (the 256-GPU plans lead; the next GPU count is 512's, a step half as long)
    first = res.plans[0].estimate
    at, second = next((i, r.estimate) for i, r in enumerate(res.plans) if r.estimate.world_size != first.world_size)
    per_gpu = [e.tokens_per_s / e.world_size for e in (first, second)]
    assert per_gpu[0] >= per_gpu[1]
    said = float(res.plans[at].reason.split("% vs best")[0].rsplit("+", 1)[1])
    assert said == pytest.approx(100 * (per_gpu[0] / per_gpu[1] - 1), abs=0.06)  # printed to 0.1%
    assert abs(said - 100 * (second.step_time_s / first.step_time_s - 1)) > 40  # not the step times' ratio
