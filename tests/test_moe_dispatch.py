"""Issue 17: how routed tokens travel. The flex dispatcher (DeepEP / HybridEP) sends a token once to each GPU (and
across NVLink domains once to each domain); --overlap-moe-expert-parallel-comm runs one micro-batch's all-to-alls
beside another's compute (megatron-core 0.19 pipeline_parallel/combined_1f1b.py). Sources in advisor/parallel/expert.py."""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest
from click.testing import CliRunner

from advisor import api
from advisor.candidates import Candidates, Mesh
from advisor.cli import cli
from advisor.errors import AdvisorError
from advisor.layout import Plan
from advisor.parallel import expert
from advisor.training import TrainingSetup


@pytest.mark.parametrize("n_experts, k, groups", [(8, 2, 4), (8, 3, 2), (12, 4, 3), (6, 2, 6)])
def test_reached_is_the_mean_over_every_routing(n_experts, k, groups):
    """The expected distinct groups a token's k experts fall in, counted over every choice of k experts (uniform
    routing, as megatron-core's moe_router_force_load_balancing draws it)."""
    size = n_experts // groups
    counts = [len({e // size for e in choice}) for choice in itertools.combinations(range(n_experts), k)]
    assert float(expert.reached(n_experts, k, groups)) == pytest.approx(np.mean(counts), rel=1e-12)


@pytest.mark.parametrize("n_experts,k,units,groups,group_topk", [
    (16, 2, 8, 4, 2), (16, 3, 2, 4, 2), (16, 2, 4, 4, 1), (24, 3, 2, 6, 3), (16, 4, 16, 8, 4)])
def test_group_limited_reach_is_the_mean_over_every_routing(n_experts, k, units, groups, group_topk):
    """Every choice of group_topk groups, then every k-subset of their experts, equally likely: the mean distinct
    units by enumeration equals reached() (units within a group, and units of several groups)."""
    per_group, per_unit, counts = n_experts // groups, n_experts // units, []
    for chosen in itertools.combinations(range(groups), group_topk):
        pool = [e for g in chosen for e in range(g * per_group, (g + 1) * per_group)]
        counts += [len({e // per_unit for e in pick}) for pick in itertools.combinations(pool, k)]
    assert float(expert.reached(n_experts, k, units, groups, group_topk)) == pytest.approx(np.mean(counts), rel=1e-12)


def test_deepseek_v3_routes_within_four_of_eight_groups():
    """DeepSeek-V3's config.json: n_group 8, topk_group 4 under topk_method noaux_tc (V2-Lite's greedy: none). On
    four 8-GPU nodes (EP 32) a token reaches ~2.9 of the 4 nodes (3.6 unlimited); DeepSeek's own selection on random
    logits (groups by their top-2 sums) spreads wider, within 10% (Monte Carlo: 3.13 nodes, 6.84 of 32 GPUs)."""
    from advisor.model import load_model

    x = load_model("deepseek-v3").experts
    assert (x.groups, x.group_topk) == (8, 4) and load_model("deepseek-v2-lite").experts.groups == 1
    assert float(expert.reached(256, 8, 4, 8, 4)) == pytest.approx(2.93, abs=0.01)
    assert float(expert.reached(256, 8, 4)) == pytest.approx(3.61, abs=0.01)
    assert float(expert.reached(256, 8, 4, 8, 4)) == pytest.approx(3.13, rel=0.10)
    assert float(expert.reached(256, 8, 32, 8, 4)) == pytest.approx(6.84, rel=0.10)


def test_reached_qwen3_30b_on_eight_gpus():
    """Qwen3-30B-A3B (128 experts, top-8) on EP 8: 16 experts a GPU, a token reaches 8 (1 - C(112, 8) / C(128, 8)) =
    5.34 GPUs, where the alltoall dispatcher sends all 8 copies; one expert a group: every copy; one group: one."""
    assert float(expert.reached(128, 8, 8)) == pytest.approx(8 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-12)
    assert float(expert.reached(128, 8, 8)) == pytest.approx(5.34, abs=0.01)
    assert float(expert.reached(128, 8, 128)) == pytest.approx(8.0)
    assert float(expert.reached(128, 8, 1)) == pytest.approx(1.0)


def _share(pp, v, ga, recompute="none", ep=8):
    schedule = "interleaved" if v > 1 else "1f1b"
    plan = Plan(dp=8, pp=pp, ep=ep, etp=1, zero=1, schedule=schedule, virtual_stages=v)
    setup = TrainingSetup(seq_len=4096, micro_batch=1, grad_accum=ga, recompute=recompute)
    c = Candidates.of_plan(plan, setup, ga)
    return float(np.asarray(expert.batch_overlap_share(c, Mesh.of(c, 8, 8))).reshape(-1)[0])


def test_batch_overlap_share_follows_megatrons_schedules():
    """Without a pipeline every forward but the first runs beside a backward (combined_1f1b_schedule_for_no_pipelining);
    interleaved, the first rank's warm-up is 2 (pp - 1) + (v - 1) pp forwards plus one (schedules.py), of ga x v;
    Megatron asserts the overlap away under a 1F1B pipeline, full recomputation or no EP (transformer_config.py)."""
    assert _share(1, 1, 8) == pytest.approx(7 / 8)
    assert _share(4, 4, 32) == pytest.approx(1 - (2 * 3 + 3 * 4 + 1) / 128)
    assert _share(4, 1, 32) == 0.0
    assert _share(1, 1, 8, recompute="full") == 0.0
    assert _share(1, 1, 8, ep=1) == 0.0


BASE = dict(model="qwen3-30b-a3b", micro_batch=4, global_batch=512, seq=4096, precision="mxfp8", zero=1, etp=1,
            stack="megatron-core", recompute="selective")


@pytest.mark.parametrize("hw, gpus, ep, precision", [
    ("gb200-nvl72", 8, 8, "mxfp8"), ("dgx-h100", 16, 16, "fp8-tensorwise"), ("dgx-b200", 32, 32, "mxfp8"),
    ("gb300-nvl72", 64, 64, "mxfp8"), ("aws-p5", 16, 8, "bf16-mixed")])
def test_flex_and_overlap_never_cost_more(hw, gpus, ep, precision):
    """Sending a token once a GPU never moves more than sending every routed copy, and running the all-to-alls beside
    other work never exposes more of them: on NVLink, across nodes, and on an NVL72 rack."""
    kw = dict(BASE, precision=precision)
    t = {(d, o): api.estimate(hw=hw, gpus=gpus, ep=ep, moe_dispatcher=d, moe_overlap=o, **kw).breakdown["comm/ep_alltoall"]
         for d in ("alltoall", "flex") for o in ("none", "batch")}
    assert t["flex", "none"] < t["alltoall", "none"]
    assert t["alltoall", "batch"] < t["alltoall", "none"]
    assert t["flex", "batch"] <= t["flex", "none"]


def test_flex_across_nodes_sends_a_token_once_a_node():
    """Qwen3-30B-A3B on EP 16 over two DGX H100s: pairwise, 4 of a token's 8 copies cross the network on average;
    HybridEP sends it once to the other node when an expert there is chosen (1 - C(64, 8) / C(128, 8) = 0.9965): the
    network part carries a quarter of the bytes, so the dispatch takes well under half the time."""
    kw = dict(BASE, hw="dgx-h100", gpus=16, ep=16, micro_batch=1, global_batch=1024, precision="fp8-tensorwise",
              recompute="none", moe_overlap="none")
    pairwise = api.estimate(moe_dispatcher="alltoall", **kw).breakdown["comm/ep_alltoall"]
    flex = api.estimate(moe_dispatcher="flex", **kw).breakdown["comm/ep_alltoall"]
    assert 0.2 < flex / pairwise < 0.45


def test_a_dispatcher_or_overlap_the_stack_lacks_is_one_line():
    with pytest.raises(AdvisorError, match=r"stack megatron-deepspeed has no flex token dispatcher: use --moe-dispatcher alltoall"):
        api.estimate(**{**BASE, "stack": "megatron-deepspeed", "precision": "bf16-mixed"}, hw="dgx-h100", gpus=8, ep=8,
                     moe_dispatcher="flex")
    with pytest.raises(AdvisorError, match=r"does not overlap the expert all-to-alls with batch: use --moe-overlap none"):
        api.estimate(**{**BASE, "stack": "megatron-deepspeed", "precision": "bf16-mixed"}, hw="dgx-h100", gpus=8, ep=8,
                     moe_overlap="batch")
    r = CliRunner().invoke(cli, ["estimate", "--model", "qwen3-30b-a3b", "--hw", "dgx-h100", "--gpus", "8", "--ep", "8",
                                  "--zero", "1", "--stack", "megatron-core", "--moe-dispatcher", "deepep"])
    assert r.exit_code == 2 and "deepep" in r.output and "Traceback" not in r.output


def test_estimate_says_how_tokens_travel():
    r = CliRunner().invoke(cli, ["estimate", "--model", "qwen3-30b-a3b", "--hw", "gb200-nvl72", "--gpus", "8", "--ep", "8",
                                  "--zero", "1", "--micro-batch", "4", "--global-batch", "512", "--seq", "4096",
                                  "--stack", "megatron-core", "--recompute", "selective", "--moe-dispatcher", "flex",
                                  "--moe-overlap", "batch"])
    assert r.exit_code == 0, r.output
    assert "flex dispatcher: 5.3 of 8 routed copies" in r.output
    assert "beside another micro-batch's compute" in r.output


def test_a_collective_holding_sms_slows_the_compute_beside_it():
    """The pair ends at max(comm, compute + comm x held): 10 ms of GEMMs beside a 5 ms all-to-all on 32 of 160 SMs run
    1 ms longer; a 20 ms all-to-all beside them is left exposed for the 10 ms the GEMMs do not cover."""
    from advisor import comm

    assert float(comm.beside(5e-3, 10e-3, 32 / 160)) == pytest.approx(1e-3, rel=1e-12)
    assert float(comm.beside(20e-3, 10e-3, 32 / 160)) == pytest.approx(10e-3, rel=1e-12)
    assert float(comm.beside(5e-3, 10e-3, 0.0)) == 0.0 and float(comm.beside(5e-3, 0.0, 0.2)) == pytest.approx(5e-3)


def test_flex_dispatcher_sms_cost_under_an_overlap_only():
    """HybridEP's kernels hold 32 SMs (Megatron-Bridge 0.6.2 perf_recipes/_common.py): beside another micro-batch's
    compute they cost more than free SMs would and less than running exposed; exposed, the SMs change nothing."""
    from advisor.stack import stack_from_yaml

    free = stack_from_yaml("base: megatron-core\nname: free-sms\ndescription: x\nengine:\n  flex_dispatcher_sms: null\n")
    kw = dict(BASE, hw="gb200-nvl72", gpus=8, ep=8, moe_dispatcher="flex")
    t = {(getattr(s, "name", s), o): api.estimate(moe_overlap=o, **{**kw, "stack": s}).breakdown["comm/ep_alltoall"]
         for s in ("megatron-core", free) for o in ("none", "batch")}
    assert t["megatron-core", "none"] == pytest.approx(t["free-sms", "none"], rel=1e-12)
    assert t["free-sms", "batch"] < t["megatron-core", "batch"] < t["megatron-core", "none"]


def test_flex_hands_tokens_over_grouped_by_expert():
    """megatron-core's alltoall dispatcher sorts the received chunks by local expert and back (sort_chunks_by_idxs:
    read and write k h each way); HybridEP / DeepEP hand them over grouped: 4 k h bytes a token fewer, forward."""
    from advisor.hardware import load_hardware
    from advisor.model import load_model
    from advisor.stack import load_stack
    from advisor.workload import Workload

    def fwd(dispatcher):
        setup = TrainingSetup(seq_len=4096, micro_batch=1, precision="bf16", moe_dispatcher=dispatcher)
        w = Workload.of(load_model("qwen3-30b-a3b"), load_hardware("dgx-h100"), load_stack("megatron-core"), setup)
        return expert.permute_bytes(w, 4096.0, 1, False, 8)[0]
    assert fwd("alltoall") - fwd("flex") == pytest.approx(4096 * 2048 * 2 * 4 * 8, rel=1e-12)


def test_a_flex_dispatcher_taking_every_sm_is_one_line():
    from advisor.stack import stack_from_yaml

    greedy = stack_from_yaml("base: megatron-core\nname: ep-greedy\ndescription: x\nengine:\n  flex_dispatcher_sms: 148\n")
    with pytest.raises(AdvisorError, match="stack ep-greedy's flex dispatcher takes 148 SMs and the B200-180GB has 148: "
                                           "lower engine.flex_dispatcher_sms below 148"):
        api.estimate(**{**BASE, "stack": greedy}, hw="dgx-b200", gpus=8, ep=8, moe_dispatcher="flex")


# -- Transformer Engine's userbuffers: the sequence-parallel collectives pipelined with their GEMMs ----------------
TP = dict(model="llama3-70b", hw="dgx-h100", gpus=64, tp=4, pp=8, sp=True, zero=1, micro_batch=1, global_batch=128,
          seq=8192, precision="fp8-tensorwise", stack="megatron-core", recompute="selective")


def test_userbuffers_hide_what_the_gemms_cover():
    """Transformer Engine 2.13's default userbuffers methods (module/base.py initialize_ub): forward, the input's
    all-gather by ring exchange beside the column-parallel GEMM, max(C, G) + min(C, G) / tp, and the output's
    reduce-scatter pipelined in 4 splits beside the row-parallel GEMM launched on the SMs the collective's 16 leave,
    G' = G x SMs / (SMs - 16); backward, the output gradient's gather by ring exchange beside the row-parallel dgrad,
    and, in bulk beside the column-parallel dgrad and wgrad, the input's re-gather and the input gradient's
    reduce-scatter, each holding 16 SMs while it runs: max(C, G + C x 16 / SMs). Each pair less its GEMM, over the
    layer's four collectives (2 x (AG + RS))."""
    from types import SimpleNamespace

    from advisor.engine import UserBuffers
    from advisor.model.layer import Split
    from advisor.parallel import tensor

    lins = [SimpleNamespace(name="attention/qkv", copies=1, split=Split.column),
            SimpleNamespace(name="attention/proj", copies=1, split=Split.row)]

    def share(g_col: float, g_row: float, tp: float, sms=None) -> float:
        w = SimpleNamespace(layer=SimpleNamespace(linears=lins), hw=SimpleNamespace(gpu=SimpleNamespace(sm_count=sms)),
                            stack=SimpleNamespace(engine=SimpleNamespace(userbuffers=UserBuffers())))
        return float(tensor.overlap_share(w, {"attention/qkv": g_col, "attention/proj": g_row}, np.array(1.0),
                                          np.array(1.0), tp))

    # no SMs costed: C = G = 1 on tp 4: ring 1/4, pipeline 1/4, ring 1/4, bulk 0, bulk 0 -> 0.75 of 4 collectives
    assert share(1.0, 1.0, 4.0) == pytest.approx(0.75 / 4.0)
    # no GEMM beside them: every collective exposed, the backward's input re-gather with them (5 for the table's 4)
    assert share(0.0, 0.0, 4.0) == pytest.approx(5.0 / 4.0)
    # H100's 132 SMs: pipeline G' = 132/116; bulk max(1, 1 + 16/132) - 1 = 16/132 each
    slow = 132.0 / 116.0
    expected = 0.25 + (slow + 1.0 / 4.0 - 1.0) + 0.25 + 2.0 * 16.0 / 132.0
    assert share(1.0, 1.0, 4.0, sms=132) == pytest.approx(expected / 4.0)
    # uneven GEMMs on tp 2: ring (C 1, G 0.5) 1 + 0.25 - 0.5; pipeline (1, 2) 2 + 0.25 - 2; ring (1, 2) 2 + 0.5 - 2;
    # bulk (1, 0.5) 1 - 0.5 twice
    assert share(0.5, 2.0, 2.0) == pytest.approx((0.75 + 0.25 + 0.5 + 0.5 + 0.5) / 4.0)


def test_async_backward_collectives_hide_behind_dgrad_and_wgrad():
    """Without userbuffers TE 2.13's linear backward gathers the column-parallel input (SP) beside the dgrad GEMM and
    reduce-scatters (or all-reduces) the input gradient beside the wgrad GEMM, asynchronously; the row-parallel output
    gradient's gather comes first, exposed. Per sub-block: AG_go + (AG_in - G)+ + (RS - G)+ under SP, (AR - G)+ without;
    no column-parallel GEMM (G = 0): every collective exposed."""
    from types import SimpleNamespace

    from advisor.model.layer import Split
    from advisor.parallel import tensor

    lins = [SimpleNamespace(name="attention/qkv", copies=1, split=Split.column),
            SimpleNamespace(name="attention/proj", copies=1, split=Split.row)]
    w = SimpleNamespace(layer=SimpleNamespace(linears=lins))
    one, sp = np.array(1.0), np.array(True)
    gemms = {"attention/qkv": 0.75, "attention/proj": 2.0}
    assert float(tensor.backward_exposed(w, gemms, one, one, one, one, sp)) == pytest.approx(1.0 + 0.25 + 0.25)
    assert float(tensor.backward_exposed(w, gemms, one, one, one, one, ~sp)) == pytest.approx(0.25)
    none = {"attention/qkv": 0.0, "attention/proj": 0.0}
    assert float(tensor.backward_exposed(w, none, one, one, one, one, sp)) == pytest.approx(2.0)
    # megatron-core runs it (megatron-deepspeed's profile, vTrain's and SC21's Megatron, does not): the same stack with
    # it off exposes its backward collectives whole; forward and compute unchanged
    from advisor.stack import load_stack

    core = load_stack("megatron-core")
    assert core.engine.tp_backward_overlap and not load_stack("megatron-deepspeed").engine.tp_backward_overlap
    off = core.model_copy(update={"engine": core.engine.model_copy(update={"tp_backward_overlap": False})})
    on_est, off_est = (api.estimate(tp_overlap="none", **{**TP, "stack": st}) for st in (core, off))
    assert on_est.breakdown["comm/tp"] < off_est.breakdown["comm/tp"]
    assert on_est.breakdown["compute/backward"] == pytest.approx(off_est.breakdown["compute/backward"])


def test_userbuffers_shrink_the_tp_part_and_nothing_else():
    off = api.estimate(tp_overlap="none", **TP)
    on = api.estimate(tp_overlap="userbuffers", **TP)
    # Llama 3 70B TP 4 on H100, FP8: 0.42 s against 0.80 s of exposed collectives (off: the async backward overlap)
    assert on.breakdown["comm/tp"] < 0.6 * off.breakdown["comm/tp"]
    assert on.breakdown["compute/forward"] == pytest.approx(off.breakdown["compute/forward"])
    # Megatron's --tp-comm-overlap needs sequence parallelism (megatron/training/arguments.py:1401-1402 asserts it):
    # asked for without SP it is refused (advisor.constraints.overlap_without_sp), not costed as a no-op
    no_sp = {**TP, "sp": False}
    with pytest.raises(AdvisorError, match="--tp-overlap userbuffers .* tp=4 runs without SP"):
        api.estimate(tp_overlap="userbuffers", **no_sp)



def test_an_asked_tp_overlap_without_sp_is_refused_and_left_out_of_the_search():
    """--tp-overlap userbuffers or async pipelines SP's all-gathers and reduce-scatters with their GEMMs: Megatron-LM
    asserts SP under --tp-comm-overlap (megatron/training/arguments.py:1401-1402), torch's micro-pipeline TP pass (async
    TP) matches all_gather_into_tensor -> mm and mm -> reduce_scatter_tensor only (torch 2.13
    _inductor/fx_passes/micro_pipeline_tp.py:91, :340). Asked for with TP without SP it was costed as a no-op: estimate
    (and the typed API) now refuse it in one line; the search leaves those plans out, counted, so that every row it
    ranks re-estimates as it is. A stack's default overlap (megatron-bridge-perf's userbuffers) is not asked for: its
    plans without SP run without it, as before."""
    from advisor.search import plan

    kw = dict(model="llama3-8b", hw="dgx-h100", gpus=8, tp=8, micro_batch=1, seq=4096)
    for stack, overlap in (("megatron-core", "userbuffers"), ("torchtitan", "async")):
        why = rf"--tp-overlap {overlap} pipelines .* tp=8 runs without SP .* add --sp \(dropping --no-sp where given\) or use --tp-overlap none"
        # async TP is a torch.compile pass: asked of the model's compile (advisor.workload.tp_overlap_choice)
        compiled = {"compile": "model,loss"} if overlap == "async" else {}
        with pytest.raises(AdvisorError, match=why):
            api.estimate(sp=False, stack=stack, tp_overlap=overlap, **kw, **compiled)
        setup = TrainingSetup(seq_len=4096, micro_batch=1, stack=stack, tp_overlap=overlap, **compiled)
        with pytest.raises(AdvisorError, match=why):
            api.estimate_plan("llama3-8b", "dgx-h100", Plan(tp=8, sp=False), setup)
        # the two ways out it names are valid plans
        api.estimate(sp=False, stack=stack, tp_overlap="none", **kw)
        api.estimate(sp=True, stack=stack, tp_overlap=overlap, **kw, **compiled)
    # megatron-core's SP is off unless asked (engine.sequence_parallel opt_in): the overlap alone is refused too
    with pytest.raises(AdvisorError, match="--tp-overlap userbuffers .* tp=8 runs without SP"):
        api.estimate(stack="megatron-core", tp_overlap="userbuffers", **kw)
    # the stack's default overlap, not asked: TP without SP still runs, without it
    bridge = dict(sp=False, stack="megatron-bridge-perf", **kw)
    assert api.estimate(**bridge).breakdown["comm/tp"] == pytest.approx(
        api.estimate(tp_overlap="none", **bridge).breakdown["comm/tp"])
    search = dict(model="llama3-8b", hw="dgx-h100", gpus=8, seq=4096, stack="megatron-core", top=10_000)
    reason = "--tp-overlap userbuffers needs sequence parallelism: TP without SP"
    asked, unasked = plan(tp_overlap="userbuffers", **search), plan(**search)
    assert any(p.plan.tp > 1 and not p.plan.sp for p in unasked.plans) and reason not in unasked.rejected
    assert asked.rejected[reason] > 0 and any(p.plan.tp > 1 for p in asked.plans)
    assert all(p.plan.sp for p in asked.plans if p.plan.tp > 1)
    for p in [p for p in asked.plans if p.plan.tp > 1][:3]:  # a row passed back re-estimates as it is
        again = api.estimate_plan("llama3-8b", "dgx-h100", p.plan, p.setup, p.estimate.world_size)
        assert again.step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-9)

def test_estimate_says_the_tp_collectives_are_pipelined():
    r = CliRunner().invoke(cli, ["estimate", "--model", "llama3-70b", "--hw", "dgx-h100", "--gpus", "64", "--tp", "4",
                                 "--pp", "8", "--sp", "--zero", "1", "--global-batch", "128", "--seq", "8192",
                                 "--stack", "megatron-core", "--tp-overlap", "userbuffers"])
    assert r.exit_code == 0, r.output
    assert "pipelined with the GEMMs they feed (userbuffers, --tp-comm-overlap)" in r.output


def test_a_tp_overlap_the_stack_lacks_is_one_line():
    with pytest.raises(AdvisorError, match="stack megatron-deepspeed does not overlap its TP collectives with userbuffers: "
                                           "use --tp-overlap none"):
        api.estimate(**{**TP, "stack": "megatron-deepspeed", "precision": "bf16-mixed"}, tp_overlap="userbuffers")


def test_userbuffers_taking_every_sm_is_one_line():
    from advisor.stack import stack_from_yaml

    greedy = stack_from_yaml("base: megatron-core\nname: ub-greedy\ndescription: greedy userbuffers\n"
                             "engine:\n  userbuffers: {pipeline_sms: 200}\n")
    with pytest.raises(AdvisorError, match="stack ub-greedy's userbuffers take 200 SMs from a GEMM and the "
                                           "H100-SXM5-80GB has 132: lower engine.userbuffers' SMs below 132"):
        api.estimate(**{**TP, "stack": greedy}, tp_overlap="userbuffers")


def test_plan_names_a_faster_way_to_move_the_tokens():
    """DeepSeek-V3 on 256 GB200s in megatron-core: the best plan splits the experts; the same plan with HybridEP's
    flex dispatcher beside another micro-batch is re-estimated and named with its flags (advisor.travel)."""
    args = ["plan", "--model", "deepseek-v3", "--hw", "gb200-nvl72", "--gpus", "256", "--stack", "megatron-core",
            "--precision", "mxfp8", "--seq", "4096", "--global-batch", "4096", "--top", "1"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    note = next(line for line in r.output.splitlines() if line.startswith("note: megatron-core also runs"))
    assert "--moe-dispatcher flex --moe-overlap batch" in note
    step = float(note.split("would take ")[1].split(" s")[0])
    r2 = CliRunner().invoke(cli, args + ["--moe-dispatcher", "flex", "--moe-overlap", "batch"])
    assert r2.exit_code == 0 and "also runs" not in r2.output
    best = float(next(line for line in r2.output.splitlines() if line.startswith("1 ")).split(" s ")[0].split()[-1])
    assert best <= step + 1e-3  # the search with those flags finds that plan or a faster one


def test_no_travel_note_for_a_dense_model():
    from advisor.search import plan
    from advisor.travel import faster_travel

    assert faster_travel(plan("llama3-8b", "dgx-h100", gpus=8, stack="megatron-core", top=1)) is None


def test_plan_json_carries_the_travel_note():
    import json

    r = CliRunner().invoke(cli, ["plan", "--model", "deepseek-v3", "--hw", "gb200-nvl72", "--gpus", "256", "--stack",
                                 "megatron-core", "--precision", "mxfp8", "--seq", "4096", "--global-batch", "4096",
                                 "--top", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert "--moe-dispatcher flex --moe-overlap batch" in json.loads(r.output)["moe_travel_note"]
    r = CliRunner().invoke(cli, ["plan", "--model", "gpt2", "--hw", "dgx-a100", "--gpus", "8", "--top", "1", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["moe_travel_note"] is None


@pytest.mark.parametrize("stack", ["auto", "any"])
def test_a_choice_only_megatron_core_runs_steers_auto_and_any(stack):
    """--moe-dispatcher flex under --stack auto costs in the stack that runs it (hf-trainer has none), and --stack any
    ranks only the stacks that do: no error for the stacks that lack it."""
    from advisor.search import plan

    res = plan("qwen3-30b-a3b", "dgx-h100", gpus=8, stack=stack, moe_dispatcher="flex", top=3)
    assert res.plans and all(p.estimate.stack in ("megatron-core", "megatron-bridge-perf") for p in res.plans)
    est = api.estimate("qwen3-30b-a3b", "dgx-h100", gpus=8, ep=8, zero=1, tp_overlap="none", moe_dispatcher="flex")
    assert est.stack == "megatron-core"


def test_group_limited_routing_in_the_megatron_exports():
    """megatron-core 0.19 TransformerConfig moe_router_num_groups / moe_router_group_topk (--moe-router-num-groups,
    --moe-router-group-topk): written where a model limits its routing to top groups."""
    import yaml

    from advisor.export import ExportError, export
    from advisor.hardware import load_hardware
    from advisor.model import load_model

    base = load_model("mixtral-8x7b")
    # 4 groups of 2 experts, the top 2 groups for top-4: megatron-core ranks a group by the sum of its top 4 // 2 = 2
    # experts, DeepSeek-V3's rule (the spec's group_score default)
    grouped = base.model_copy(update={"experts": base.experts.model_copy(update={"groups": 4, "group_topk": 2,
                                                                                  "experts_per_token": 4})})
    args = (load_hardware("dgx-h100"), Plan(dp=8, zero=1, ep=8, etp=1), TrainingSetup(seq_len=4096, stack="megatron-core"),
            1, 8)
    text = export("megatron", grouped, *args).text
    assert "--moe-router-num-groups 4" in text and "--moe-router-group-topk 2" in text
    assert "--moe-router-num-groups" not in export("megatron", base, *args).text
    bridge = yaml.safe_load(export("megatron-bridge", grouped, *args).text)["model"]
    assert (bridge["moe_router_num_groups"], bridge["moe_router_group_topk"]) == (4, 2)
    # DeepSeek-V2's group_limited_greedy ranks a group by its best expert: megatron-core's sum of the top two is another
    # model (with top-2 of 2 groups, its top 2 // 2 = 1 would be the same)
    v2 = grouped.model_copy(update={"experts": grouped.experts.model_copy(update={"group_score": "max"})})
    with pytest.raises(ExportError, match="routing groups ranked by their best expert"):
        export("megatron", v2, *args)


# -- torchtitan's async tensor parallel: torch's symmetric-memory micro-pipeline ---------------------------------------
def test_async_tp_pipelines_every_pair_and_sums_the_partials():
    """torch 2.13 distributed/_symmetric_memory: fused_all_gather_matmul runs the local shard's GEMM, then tp - 1 copy-
    engine pulls beside the previous shard's GEMM (max(C, G) + min(C, G) / tp, no SMs taken); fused_matmul_reduce_scatter
    the same in chunks, then sums the tp partials (reads the [s, b, h] output, writes 1/tp of it). Forward AG-col and
    RS-row, backward AG-row (dgrad) and RS-col (dgrad), over the layer table's four collectives."""
    from types import SimpleNamespace

    from advisor.model.layer import Split
    from advisor.parallel import tensor

    lins = [SimpleNamespace(name="attention/qkv", copies=1, split=Split.column),
            SimpleNamespace(name="attention/proj", copies=1, split=Split.row)]
    # memory_bandwidth_bytes_per_s x elementwise = 1 byte/s: the partial sum of act bytes takes act x (1 + 1/tp) s
    hw = SimpleNamespace(gpu=SimpleNamespace(memory_bandwidth_bytes_per_s=1.0), efficiency=SimpleNamespace(elementwise=1.0))
    w = SimpleNamespace(layer=SimpleNamespace(linears=lins), hw=hw)

    def share(g_col: float, g_row: float, tp: float, act: float = 0.0) -> float:
        return float(tensor.async_share(w, {"attention/qkv": g_col, "attention/proj": g_row}, np.array(1.0),
                                        np.array(1.0), tp, act))

    assert share(1.0, 1.0, 4.0) == pytest.approx(4 * 0.25 / 4.0)  # C = G: each pair leaves C / tp
    assert share(0.0, 0.0, 4.0) == pytest.approx(1.0)  # nothing to hide behind: all four exposed, as without it
    assert share(10.0, 10.0, 8.0) == pytest.approx(4 * (1.0 / 8.0) / 4.0)  # long GEMMs: C / tp of each left
    assert share(1.0, 1.0, 4.0, act=0.4) == pytest.approx((1.0 + 2.0 * 0.4 * 1.25) / 4.0)  # + two partial sums


def test_async_tp_is_torchtitans_and_shrinks_the_tp_part_only():
    """torchtitan runs it when asked (0.3.0 compile.enable_async_tensor_parallel), megatron-core does not; the TP
    collectives shrink, the compute stays; the estimate says how they run."""
    # 16 GPUs: on 64 the compiled blocks leave ZeRO-3's gathers across 8 nodes exposed, which hide what async TP saves
    tt = dict(model="llama3-70b", hw="dgx-h100", gpus=16, tp=8, sp=True, zero=3, micro_batch=1, seq=8192,
              stack="torchtitan", recompute="full", compile="model,loss")
    off, on = api.estimate(tp_overlap="none", **tt), api.estimate(tp_overlap="async", **tt)
    assert on.breakdown["comm/tp"] < 0.5 * off.breakdown["comm/tp"] and on.step_time_s < off.step_time_s
    assert on.breakdown["compute/forward"] == pytest.approx(off.breakdown["compute/forward"])
    with pytest.raises(AdvisorError, match="stack megatron-core does not overlap its TP collectives with async: use "
                                           "--tp-overlap none or userbuffers"):
        api.estimate(**{**TP, "tp_overlap": "async"})
    r = CliRunner().invoke(cli, ["estimate", "--model", "llama3-70b", "--hw", "dgx-h100", "--gpus", "16", "--tp", "8",
                                 "--sp", "--zero", "3", "--stack", "torchtitan", "--tp-overlap", "async", "--compile",
                                 "model,loss"])
    assert r.exit_code == 0, r.output
    assert "pipelined with the GEMMs they feed (async TP" in r.output
    # torchtitan refuses async TP without compile (0.3.0 CompileConfig.__post_init__): so does the estimate
    with pytest.raises(AdvisorError, match="--tp-overlap async is a pass of torch.compile .*: add --compile model,loss"):
        api.estimate(**{**tt, "compile": "none", "tp_overlap": "async"})


def test_async_tp_under_auto_and_any():
    """Neither stack --stack auto costs (hf-trainer, megatron-core) runs async TP: one line naming the stacks that do;
    --stack any ranks only those."""
    from advisor.search import plan

    with pytest.raises(AdvisorError, match=r"--stack auto costs hf-trainer or megatron-core, and neither runs what was "
                                           r"asked \(.*\); --stack torchtitan or torchtitan-0.1 or torchtitan-0.2 runs it"):
        plan(model="llama3-70b", hw="dgx-h100", gpus=64, tp_overlap="async", compile="model,loss", top=3)
    found = plan(model="llama3-70b", hw="dgx-h100", gpus=64, stack="any", tp_overlap="async", compile="model,loss", top=20)
    assert {p.setup.stack for p in found.plans} <= {"torchtitan", "torchtitan-0.1", "torchtitan-0.2"} and found.plans


def test_async_tp_beyond_the_nvlink_domain_is_not_pipelined():
    """Symmetric memory maps the peers' buffers over NVLink: a TP group forced across nodes runs its collectives as
    without async TP, and the estimate does not call them pipelined (Llama 2 7B: 32 KV heads, which torchtitan splits over tp 16)."""
    kw = dict(model="llama2-7b", hw="dgx-h100", gpus=16, tp=16, dp=1, stack="torchtitan", allow_tp_across_nodes=True,
              global_batch=64, compile="model,loss")
    off, on = api.estimate(tp_overlap="none", **kw), api.estimate(tp_overlap="async", **kw)
    assert on.breakdown["comm/tp"] == pytest.approx(off.breakdown["comm/tp"])
    assert "pipelined" not in on.collectives["tp"]


def test_no_plan_summary_names_the_batch_overlap_setup_every_plan_breaks():
    """--moe-overlap batch with two MTP depths breaks megatron-core's assert (transformer_config.py:2710-2713,
    mtp_num_layers <= 1) whatever the plan; the tally counts each plan under its first reason, layout ones before it,
    so the "no plan fits" line names it first, as every plan's, not the two largest tallies."""
    r = CliRunner().invoke(cli, ["plan", "--model", "qwen3-30b-a3b", "--hw", "dgx-h100", "--gpus", "8",
                                 "--moe-overlap", "batch", "--mtp-layers", "2"])
    assert r.exit_code == 2
    assert "every plan breaks a constraint: --moe-overlap batch" in r.output and "(every plan)" in r.output
