"""Mixture of experts and expert parallelism (issue 17, advisor/parallel/expert.py): memory against a count from first
principles, the all-to-all bytes and time by hand, FLOPs as torchtitan and Megatron count them, the search and the
Megatron export, and the invariants (memory never grows with ep; a dense model is untouched by EP).

Model states are also checked against Megatron-LM's own theoretical memory report
(megatron/training/theoretical_memory_usage.py compute_weight_and_optimizer_memory, shipped in megatron-core 0.19.2's
wheel: the README's test install unpacks it to .megatron-lm), on the arguments its own parse_args and validate_args
read from advisor's Megatron export. Its activation formula is the dense Table 2 of Korthikanti et al. (no experts),
so activations are checked by the first-principles count below.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor import estimate, plan
from advisor.comm import Collective, collective_time
from advisor.errors import AdvisorError
from advisor.hardware import load_hardware
from advisor.model import load_model
from advisor.model.spec import Experts, LayerRun, ModelSpec
from advisor.parallel import expert

MD = "megatron-deepspeed"
# Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1 config.json): h 4096, 32 layers, 32 heads, 8 KV heads of 128, 8 experts
# of width 14336, top-2, vocabulary 32000, untied
H, L, F, E, K, V, KV = 4096, 32, 14336, 8, 2, 32000, 8 * 128
ATTN = H * (H + 2 * KV) + H * H  # q, k, v and out
ROUTER, EXPERT, NORMS = H * E, 3 * H * F, 2 * H  # the router, one expert's gate, up and down, the two RMSNorms
DENSE = L * (ATTN + ROUTER + NORMS) + 2 * V * H + H  # everything but the experts: embeddings, head, final norm


def test_mixtral_counts():
    m = load_model("mixtral-8x7b")
    assert m.n_params == DENSE + L * E * EXPERT == 46_702_792_704
    assert m.active_params == DENSE + L * K * EXPERT == 12_879_925_248


def test_mixtral_gets_a_real_plan():
    """The issue's first complaint: Mixtral loaded as a 7.24B dense model. Now it is planned as 46.7B with EP."""
    found = plan("mixtral-8x7b", "dgx-h100", gpus=16, seq=4096, global_batch=256, top=3)
    best = found.plans[0].estimate
    assert best.params == 46_702_792_704 and best.fits and best.plan.ep > 1
    assert "12.88B of 46.70B parameters active" in best.moe and "balanced routing" in best.moe
    assert any("mixture of experts" in n for n in found.notes())
    row = found.to_json()["plans"][0]  # `advisor plan --json`
    assert row["plan"]["ep"] == row["layout"]["ep"] == best.plan.ep and row["breakdown"]["comm/ep_alltoall"] > 0


def _mixtral(ep: int, gpus: int = 8, **kw):
    return estimate("mixtral-8x7b", "dgx-h100", gpus=gpus, zero=1, ep=ep, micro_batch=1, seq=4096,
                    global_batch=gpus, stack=MD, **kw)


def test_memory_from_first_principles():
    """8 GPUs, dp 8, ep 8: each holds the dense part and one expert per layer (E / ep); bf16 weights and gradients
    (2 bytes each), and the distributed optimizer's fp32 master weights and Adam moments (12 bytes) sharded over dp
    for the dense part and over the expert data-parallel group (dp x tp / ep = 1 rank) for the experts."""
    e = _mixtral(8)
    local = DENSE + L * EXPERT * E / 8
    assert e.memory.parts["weights"] == pytest.approx(2 * local, rel=1e-12)
    assert e.memory.parts["gradients"] == pytest.approx(2 * local, rel=1e-12)
    assert e.memory.parts["optimizer_states"] == pytest.approx(12 * (DENSE / 8 + L * EXPERT), rel=1e-12)
    # Routed activations at top-k (bf16): Korthikanti's 16h + 10h per token (LayerNorms, attention, residuals) and
    # SwiGLU's 6 bytes per unit of the MLP width a token passes through, k x F; the permuted copies the experts read
    # and the outputs the combine weighs (2 k h elements), the router's logits (E, bf16) and routing map (E bytes)
    per_token_layer = 26 * H + 6 * K * F + 2 * K * H * 2 + E * 3
    assert e.memory.parts["activations"] == pytest.approx(per_token_layer * 4096 * L, rel=1e-12)


def test_imbalance_scales_the_routed_parts_and_a_capacity_caps_it():
    base, hot = _mixtral(8), _mixtral(8, moe_imbalance=1.5)
    capped = _mixtral(8, moe_imbalance=1.5, moe_capacity_factor=1.25)
    extra = (hot.memory.parts["activations"] - base.memory.parts["activations"]) / (4096 * L)
    assert extra == pytest.approx(0.5 * 2 * K * H * 2, rel=1e-9)  # only the routed copies grow
    assert hot.breakdown["comm/ep_alltoall"] > capped.breakdown["comm/ep_alltoall"] > base.breakdown["comm/ep_alltoall"]
    assert hot.breakdown["comm/ep_alltoall"] / base.breakdown["comm/ep_alltoall"] > 1.3
    assert "imbalance 1.5x" in hot.moe and "capacity factor 1.25" in capped.moe and "dropless" in base.moe


def test_imbalance_is_what_a_rank_can_take():
    """The busiest of ep ranks holds E / ep experts and takes at most min(k, E / ep) of a token's k copies, min(ep, E / k)
    times its balanced share k / ep: one rank (ep 1) takes every copy, whatever the routing, and Mixtral's top-2 of 8
    at most 4x. A review found --moe-imbalance 1000 accepted on one rank (a 150x slower step)."""
    assert _mixtral(1, moe_imbalance=1.5).step_time_s == pytest.approx(_mixtral(1).step_time_s, rel=1e-12)
    assert _mixtral(2, moe_imbalance=3.0).step_time_s == pytest.approx(_mixtral(2, moe_imbalance=2.0).step_time_s, rel=1e-12)
    assert _mixtral(8, moe_imbalance=4.0).step_time_s > _mixtral(8, moe_imbalance=3.0).step_time_s
    with pytest.raises(AdvisorError, match=r"--moe-imbalance 4.5: a rank of mixtral-8x7b's experts takes at most E / k = 4x"):
        _mixtral(8, moe_imbalance=4.5)


def test_alltoall_bytes_and_time_by_hand():
    """Per MoE layer and micro-batch: dispatch and combine forward, their gradients backward, each GPU sending its
    tokens x top-k hidden states in bf16 (under TP with SP, its sequence share)."""
    hw = load_hardware("dgx-h100")
    e = _mixtral(8)
    size = 4096 * K * H * 2
    assert size == 64 * 2**20
    one = float(collective_time(Collective.all_to_all, 8, size, hw, 8))
    assert e.breakdown["comm/ep_alltoall"] == pytest.approx(L * 4 * one, rel=1e-12)
    assert "all-to-all of 64.00 MiB over 8 GPUs (one node)" in e.collectives["ep"]
    sp = estimate("mixtral-8x7b", "dgx-h100", gpus=16, tp=2, sp=True, zero=1, ep=8, etp=1, micro_batch=1, seq=4096,
                  global_batch=16, stack=MD)
    assert "all-to-all of 32.00 MiB over 8 GPUs" in sp.collectives["ep"]
    # ep 16 over two nodes leaves NVLink: slower per byte than ep 8 in one
    two = float(collective_time(Collective.all_to_all, 16, size, hw, 8))
    assert two > one


def test_alltoalls_beside_shared_experts_only_where_the_model_has_them():
    """megatron-core's default overlap runs the all-to-alls beside the shared experts (--moe-shared-expert-overlap);
    Mixtral has none (config.json: no shared expert), so its all-to-alls are costed exposed, as under --moe-overlap
    none, and the collectives line must not say they run beside shared experts' GEMMs; DeepSeek-V2-Lite has 2
    (n_shared_experts, d_ff 2816), and its line says so."""
    kw = dict(gpus=8, dp=8, zero=1, ep=8, micro_batch=1, seq=4096, global_batch=64, stack="megatron-core")
    mixtral, none = (estimate("mixtral-8x7b", "dgx-h100", moe_overlap=o, **kw) for o in (None, "none"))
    assert mixtral.step_time_s == none.step_time_s and mixtral.collectives["ep"] == none.collectives["ep"]
    assert "shared experts" not in mixtral.collectives["ep"]
    assert "beside the shared experts' GEMMs" in estimate("deepseek-v2-lite", "dgx-h100", **kw).collectives["ep"]


def test_flops_count_active_parameters_as_torchtitan_does():
    """torchtitan get_num_flop_per_token: 6 x (active parameters less the embedding) + attention; advisor leaves the
    norms' parameters out (no GEMM) and counts attention causally: the rest is identical."""
    e = _mixtral(8)
    m = load_model("mixtral-8x7b")
    core = 2.0 * (4096 + 1) / 2 * 32 * (128 + 128)  # per token and layer: QK^T and PV over the (s + 1) / 2 keys seen
    per_token = e.tflops_per_gpu * 1e12 * e.world_size * e.step_time_s / e.tokens_per_step
    assert per_token == pytest.approx(6 * (m.active_params - V * H - L * NORMS - H) + 3 * L * core, rel=1e-12)


def test_megatron_mlp_flops_match_num_floating_point_operations():
    """Megatron-LM training.py num_floating_point_operations, MoE terms: 12 x h^2 x (moe_ffn / h x topk x 3/2 (SwiGLU)
    + shared / h x 3/2) per token and layer for forward and backward; advisor's expert and shared GEMMs the same."""
    m = load_model("deepseek-v3")
    routed = next(k for k in m.layers if k.routed)
    fl = routed.flops_per_token(4096)
    e = m.experts
    megatron = 12 * m.d_model ** 2 * (e.d_ff_expert / m.d_model * e.experts_per_token * 1.5
                                      + e.d_ff_shared / m.d_model * 1.5) / 3  # forward only
    assert fl["mlp/experts"] + fl["mlp/shared"] == pytest.approx(megatron, rel=1e-12)


def test_dense_first_layers_are_costed_in_flops():
    m = load_model("deepseek-v3")
    assert len(m.layers) == 2 and sorted(k.count for k in m.layers) == [3, 58]
    e = estimate(m, "gb200-nvl72", gpus=256, pp=4, ep=64, zero=1, micro_batch=1, global_batch=256, seq=4096,
                 precision="fp8-mixed", stack=MD)
    per_token = e.tflops_per_gpu * 1e12 * e.world_size * e.step_time_s / e.tokens_per_step
    expect = 3 * (sum(k.count * sum(k.flops_per_token(4096).values()) for k in m.layers) + 2 * m.d_model * m.vocab)
    assert per_token == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("kw,word", [
    (dict(ep=3), "ep does not divide the routed experts"),
    (dict(ep=16), "ep x etp does not divide dp x cp x tp"),
    (dict(ep=2, fsdp="hybrid-shard", zero=3, gpus=16), "HYBRID_SHARD"),
    (dict(ep=2, tp=2), "sequence parallelism"),
])
def test_bad_ep_is_one_line(kw, word):
    args = dict(gpus=8, zero=1, micro_batch=1, seq=4096, global_batch=8, stack=MD) | kw
    with pytest.raises(AdvisorError) as exc:
        estimate("mixtral-8x7b", "dgx-h100", **args)
    assert word in str(exc.value) and "\n" not in str(exc.value)


def test_dense_model_refuses_ep_and_is_unchanged_at_ep_1():
    with pytest.raises(AdvisorError, match="without routed experts"):
        estimate("llama-3-8b", "dgx-h100", gpus=8, ep=2, stack=MD)
    a = estimate("llama-3-8b", "dgx-h100", gpus=8, tp=2, sp=True, zero=1, seq=4096, global_batch=64, stack=MD)
    b = estimate("llama-3-8b", "dgx-h100", gpus=8, tp=2, sp=True, zero=1, seq=4096, global_batch=64, stack=MD, ep=1, etp=2)
    assert a.step_time_s == b.step_time_s and a.memory.peak_bytes == b.memory.peak_bytes
    assert a.breakdown["comm/ep_alltoall"] == 0.0 and a.moe == ""


def test_hf_trainer_runs_no_expert_parallelism():
    with pytest.raises(AdvisorError, match="hf-trainer does not run expert parallelism"):
        estimate("mixtral-8x7b", "dgx-h100", gpus=8, ep=2, stack="hf-trainer")


def test_hf_trainer_runs_each_routed_linear_as_one_grouped_gemm():
    """transformers 5.23's MoE families default to experts_implementation "grouped_mm" (modeling_utils.py
    get_correct_experts_implementation): one torch._grouped_mm per routed linear, as torchtitan and Megatron run them;
    Megatron-DeepSpeed's and litgpt's experts are one GEMM each. Qwen3-30B-A3B's 128 experts: 128 kernels' fixed time
    apart."""
    from advisor.workload import Workload
    from advisor.stack import load_stack
    from advisor.training import TrainingSetup

    model, hw = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")
    lin = next(x for x in model.layer.linears if x.copies > 1)
    setup = TrainingSetup(seq_len=4096, precision="bf16")  # litgpt's tables are pure bf16's (bf16-true)
    kernels = {name: expert.gemm_shape(Workload.of(model, hw, load_stack(name), setup), lin,
                                        4096.0, 1, 1, 1)[3] for name in ("hf-trainer", "deepspeed", "megatron-deepspeed",
                                                                          "litgpt")}
    # litgpt's LLaMAMoE loops over its experts (litgpt 0.5.12 model.py): one GEMM each, as Megatron-DeepSpeed's
    assert kernels == {"hf-trainer": 1.0, "deepspeed": 1.0, "megatron-deepspeed": 128.0, "litgpt": 128.0}


def test_search_offers_ep_only_for_routed_models():
    from advisor.space import enumerate_candidates, with_experts

    c = enumerate_candidates(16, 64, True, [(2, 1), (1, 2)])
    assert with_experts(c, load_model("llama-3-8b")) is c
    moe = with_experts(c, load_model("mixtral-8x7b"))
    assert len(moe) > len(c) and set(np.unique(moe.ep)) == {1, 2, 4, 8}
    assert not ((moe.ep > 1) & moe.hybrid).any()  # EP plans run DDP, ZeRO-1/2/3 or FSDP, not HSDP
    assert ((moe.dp * moe.tp) % (moe.ep * moe.etp) == 0).all()


@pytest.mark.slow  # importing megatron.core takes ~20 s
def test_megatron_export_writes_the_moe_flags():
    pytest.importorskip("megatron.core")
    from megatron.core.transformer import TransformerConfig

    from advisor.api import build_inputs
    from advisor.export import export
    from advisor.layout import resolve_grad_accum

    spec, hw, _, p, setup, world = build_inputs("mixtral-8x7b", "dgx-h100", gpus=16, tp=2, sp=True, zero=1, ep=8,
                                                etp=1, seq=4096, global_batch=256, stack="megatron-core")
    text = export("megatron", spec, hw, p, setup, resolve_grad_accum(setup, p)[0], world).text
    import re
    import shlex

    body = re.search(r"MEGATRON_ARGS=\((.*?)\n\)", text, re.S).group(1)
    toks = shlex.split(body, comments=True)
    f = {t[2:].replace("-", "_"): (toks[i + 1] if i + 1 < len(toks) and not toks[i + 1].startswith("--") else True)
         for i, t in enumerate(toks) if t.startswith("--")}
    assert f["num_experts"] == "8" and f["expert_model_parallel_size"] == "8" and f["moe_router_topk"] == "2"
    assert f["moe_grouped_gemm"] is True and f["moe_token_dispatcher_type"] == "alltoall"
    # As Megatron-LM's core_transformer_config_from_args maps them (--num-experts -> num_moe_experts)
    tc = TransformerConfig(num_layers=int(f["num_layers"]), hidden_size=int(f["hidden_size"]),
                           num_attention_heads=int(f["num_attention_heads"]), ffn_hidden_size=int(f["ffn_hidden_size"]),
                           tensor_model_parallel_size=int(f["tensor_model_parallel_size"]), sequence_parallel=True,
                           num_moe_experts=int(f["num_experts"]), moe_ffn_hidden_size=int(f["moe_ffn_hidden_size"]),
                           moe_router_topk=int(f["moe_router_topk"]),
                           expert_model_parallel_size=int(f["expert_model_parallel_size"]),
                           expert_tensor_parallel_size=int(f["expert_tensor_parallel_size"]),
                           moe_grouped_gemm=True, moe_token_dispatcher_type=f["moe_token_dispatcher_type"],
                           gated_linear_unit=True, add_bias_linear=False)
    assert tc.num_moe_experts % tc.expert_model_parallel_size == 0
    # megatron-core parallel_state: the expert ranks of a stage, etp x ep x edp, are the dense ones' tp x dp
    assert (world // int(f["pipeline_model_parallel_size"])) % (tc.expert_model_parallel_size * tc.expert_tensor_parallel_size) == 0


def test_dense_first_layers_in_the_export():
    from advisor.export import megatron_args
    from advisor.layout import Plan
    from advisor.training import TrainingSetup

    m2 = SMALL.model_copy(update={"layer_runs": (LayerRun(count=1, dense=True), LayerRun(count=3))})
    args, _ = megatron_args(m2, load_hardware("dgx-h100"), Plan(dp=8, ep=8, zero=1), TrainingSetup(seq_len=4096), 1)
    freq = args[args.index("--moe-layer-freq") + 1]
    assert freq == "[0,1,1,1]"


# --- invariants ------------------------------------------------------------------------------------------------
SMALL = ModelSpec(name="tiny-moe", n_layers=4, d_model=512, n_heads=8, n_kv_heads=4, d_ff=1024, vocab=4096,
                  max_positions=1024, mlp="swiglu", norm="rmsnorm", position="rotary", tied_embeddings=False,
                  linear_bias=False, experts=Experts(n_experts=16, experts_per_token=2, d_ff_expert=512, d_ff_shared=512))


@settings(max_examples=10, deadline=None)
@given(tp=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1]), k=st.integers(0, 3), mb=st.sampled_from([1, 2]))
def test_memory_per_gpu_never_grows_with_ep(tp, zero, k, mb):
    """Doubling ep holds fewer experts per GPU and no more of anything else: the peak, and the states held in every
    phase (the peak's other parts are those of whichever phase peaks, which may change)."""
    ep = 2 ** k
    kw = dict(gpus=16, tp=tp, sp=tp > 1, zero=zero, etp=1, micro_batch=mb, seq=1024, global_batch=16 // tp * mb,
              stack=MD)
    a, b = estimate(SMALL, "dgx-h100", ep=ep, **kw), estimate(SMALL, "dgx-h100", ep=2 * ep, **kw)
    assert b.memory.peak_bytes <= a.memory.peak_bytes * (1 + 1e-12)
    for part in ("weights", "optimizer_states"):
        assert b.memory.parts[part] <= a.memory.parts[part] * (1 + 1e-12)


@settings(max_examples=8, deadline=None)
@given(ep=st.sampled_from([1, 2, 4, 8, 16]), imbalance=st.floats(1.0, 3.0))
def test_imbalance_never_speeds_a_step(ep, imbalance):
    kw = dict(gpus=16, zero=1, ep=ep, seq=1024, global_batch=16, stack=MD)
    assert (estimate(SMALL, "dgx-h100", moe_imbalance=imbalance, **kw).step_time_s
            >= estimate(SMALL, "dgx-h100", **kw).step_time_s * (1 - 1e-12))


def test_table_layer_is_the_routed_width():
    layer = next(k for k in SMALL.layers if k.routed)
    assert expert.table_layer(layer).d_ff == 2 * 512 + 512
    dense = load_model("llama-3-8b").layer
    assert expert.table_layer(dense) is dense


@pytest.mark.parametrize("kind", ["deepspeed", "accelerate", "torchrun"])
def test_other_exports_refuse_expert_parallelism(kind):
    from advisor.export import ExportError, export
    from advisor.layout import Plan
    from advisor.training import TrainingSetup

    # refused in one line: the stack that launches the format runs no expert parallelism (hf-trainer, deepspeed)
    with pytest.raises(ExportError, match="expert parallelism"):
        export(kind, load_model("mixtral-8x7b"), load_hardware("dgx-h100"), Plan(dp=8, ep=8, zero=1),
               TrainingSetup(seq_len=4096), 1, 8)


# -- torchtitan 0.3.0's expert parallelism and per-op SAC in MoE blocks ---------------------------------------------
def test_torchtitan_splits_experts_over_tp_only_without_ep():
    """torchtitan 0.3.0 models/common/moe_sharding.py: under EP the routed experts are whole on each EP rank
    (expert_param_placement_sparse: Shard(0) over ep only); without EP they split over TP as the dense linears do."""
    kw = dict(gpus=16, dp=8, tp=2, sp=True, zero=3, micro_batch=1, seq=4096, stack="torchtitan")
    with pytest.raises(AdvisorError, match="torchtitan splits experts over the TP ranks without EP only: --etp 1"):
        estimate("qwen3-30b-a3b", "dgx-h100", ep=4, **kw)  # etp defaults to tp (Megatron's default)
    with pytest.raises(AdvisorError, match="without EP only"):
        estimate("qwen3-30b-a3b", "dgx-h100", ep=1, etp=1, **kw)
    est = estimate("qwen3-30b-a3b", "dgx-h100", ep=4, etp=1, **kw)
    assert est.plan.ep == 4 and est.breakdown["comm/ep_alltoall"] > 0
    best = plan("qwen3-30b-a3b", "dgx-h100", gpus=16, seq=4096, global_batch=64, stack="torchtitan", top=50)
    rows = [r.plan for r in best.plans]
    assert any(p.ep > 1 for p in rows)
    etp = [p.tp if p.etp is None else p.etp for p in rows]
    assert all(e == 1 if p.ep > 1 else e == p.tp for p, e in zip(rows, etp)) and any(p.tp > 1 for p in rows)


def test_torchtitan_sac_in_moe_blocks_follows_its_mm_count():
    """SelectiveAC (distributed/activation_checkpoint.py): every second mm of a block recomputed, the router's gate
    forced (force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]), torch._grouped_mm not in the save list.
    Qwen3-MoE's block: wqkv (1, kept), wo (2, rerun), router, grouped w1 w3 w2 (rerun); DeepSeek-V3's MLA:
    wq_a 1, wq_b 2, wkv_a 3, wkv_b 4, wo 5, then the shared expert's w1 6, w3 7, w2 8."""
    from advisor.stack import load_stack

    sel = load_stack("torchtitan").engine.selective
    qwen, ds = load_model("qwen3-30b-a3b").layer.linears, load_model("deepseek-v3").layer.linears
    assert set(sel.ops(qwen)) == {"elementwise", "attention/out", "mlp/router", "mlp/experts/gate", "mlp/experts/up",
                                  "mlp/experts/down"}
    assert set(sel.ops(ds)) == {"elementwise", "attention/q_b", "attention/kv_b", "mlp/router", "mlp/experts/gate",
                                "mlp/experts/up", "mlp/experts/down", "mlp/shared/gate", "mlp/shared/down"}
    assert set(sel.ops(load_model("llama3-8b").layer.linears)) == {"elementwise", "attention/out", "mlp/up"}
    kw = dict(gpus=8, dp=8, zero=3, ep=8, etp=1, micro_batch=1, seq=4096)
    titan = estimate("qwen3-30b-a3b", "dgx-h100", recompute="selective", stack="torchtitan", **kw)
    core = estimate("qwen3-30b-a3b", "dgx-h100", recompute="selective", stack="megatron-core", **kw)
    full = estimate("qwen3-30b-a3b", "dgx-h100", recompute="full", stack="torchtitan", **kw)
    # torchtitan reruns every expert GEMM (most of an MoE block's FLOPs), Megatron only the attention core
    assert 3 * core.breakdown["compute/recompute"] < titan.breakdown["compute/recompute"] < full.breakdown["compute/recompute"]


def test_torchtitan_02_sac_counts_wq_wk_wv_apart_and_runs_moe_blocks():
    """torchtitan 0.2.2's per-op SAC (distributed/activation_checkpoint.py _get_custom_policy) on blocks that run wq, wk
    and wv apart: mm order wq 1, wk 2 (rerun), wv 3, wo 4 (rerun), then w1 5, w3 6 (rerun), w2 7 in a dense block; an
    MoE block forces the router's gate (ActivationCheckpoint.per_op_sac_force_recompute_mm_shapes_by_fqns defaults to
    ["moe.router.gate"]) and reruns torch._grouped_mm, which no 0.2.2 _op_sac_save_list holds. Its MoE models are
    costed, not refused (a fixed list of a dense block's linears named mlp/up, which an MoE layer lacks, refused them)."""
    from advisor.stack import load_stack

    sel = load_stack("torchtitan-0.2").engine.selective
    assert set(sel.ops(load_model("llama3-8b").layer.linears)) == {"elementwise", "attention/k", "attention/out",
                                                                    "mlp/up"}
    assert set(sel.ops(load_model("gpt-oss-120b").layer.linears)) == {
        "elementwise", "attention/k", "attention/out", "mlp/router", "mlp/experts/gate", "mlp/experts/up",
        "mlp/experts/down"}
    kw = dict(gpus=16, dp=16, zero=3, ep=4, etp=1, micro_batch=1, seq=4096, stack="torchtitan-0.2")
    sac, full = (estimate("qwen3-30b-a3b", "dgx-h100", recompute=r, **kw) for r in ("selective", "full"))
    assert 0 < sac.breakdown["compute/recompute"] < full.breakdown["compute/recompute"]
    # its recipes reach a mixture of experts' grouped GEMMs only through torchao prototypes, not costed: refused
    with pytest.raises(AdvisorError) as err:
        estimate("qwen3-30b-a3b", "dgx-h100", precision="fp8-rowwise", **kw)
    assert str(err.value) == ("stack torchtitan-0.2 does not run fp8-rowwise on a mixture of experts (it runs no recipe "
                              "there): use --precision bf16-mixed or another --stack")
    estimate("llama3-8b", "dgx-h100", gpus=8, zero=3, precision="fp8-rowwise", stack="torchtitan-0.2")  # dense: runs


def test_routed_activations_as_each_stack_keeps_them():
    """What an MoE layer keeps besides its table at the routed width, per token (first principles, k = 8, h = 2048,
    E = 128 for Qwen3-30B-A3B). megatron-core 0.19 applies the router's probabilities inside the experts (experts.py
    weighted SwiGLU; token_dispatcher.py unpermutes without probs): no expert output kept; under MXFP8 Transformer
    Engine keeps the first grouped GEMM's input quantised (1 byte + an E8M0 scale per 32). torchtitan weighs the outputs
    cast to fp32 after the experts (token_dispatcher.py combine): 4 bytes each. A selective policy keeps them all where
    it reruns none of the routed path (Megatron's core attention), only the all-to-alls' outputs (bf16, both ways)
    where it reruns the rest (torchtitan's SelectiveAC)."""
    from types import SimpleNamespace

    from advisor.stack import load_stack
    from advisor.training import TrainingSetup
    from advisor.workload import Workload

    model, hw, k, h, e = load_model("qwen3-30b-a3b"), load_hardware("gb200-nvl72"), 8, 2048, 128
    router = e * 3.0

    def saved(stack, precision, **kw):
        w = Workload.of(model, hw, load_stack(stack), TrainingSetup(seq_len=4096, precision=precision))
        return float(expert.routed_saved(w, SimpleNamespace(tp=1, ep=8), False, **kw))  # no TP, EP 8 (balanced: ep unused)

    assert saved("megatron-core", "mxfp8") == pytest.approx(k * h * (1 + 1 / 32) + router)
    assert saved("megatron-core", "bf16-mixed") == pytest.approx(k * h * 2 + router)
    assert saved("torchtitan", "bf16-mixed") == pytest.approx(k * h * (2 + 4) + router)
    assert saved("torchtitan", "bf16-mixed", exchanged=True) == pytest.approx(2 * k * h * 2)
    kw = dict(gpus=8, dp=8, zero=1, ep=8, etp=1, micro_batch=1, seq=4096, stack="megatron-core")
    none, sel = (estimate("qwen3-30b-a3b", "dgx-h100", recompute=r, **kw).memory.parts["activations"]
                 for r in ("none", "selective"))
    # flash attention saves no scores, but megatron-core's core-attention checkpoint keeps linear_qkv's whole output (the
    # value a view of it) beside the normed, RoPE'd q and k (advisor.memory checkpointed_qkv_kept): 32 query heads and
    # 4 KV heads of 128 (config.json), 2 x (4096 + 512) B a token more in each of the 48 layers, less the fp32 softmax
    # statistics (4 B a head) the core run under no_grad does not keep (tensor_parallel/random.py:606)
    assert sel - none == pytest.approx(48 * 4096 * (2 * (4096 + 512) - 4 * 32), rel=1e-12)


# Megatron-LM's report, run in a subprocess on the megatron-core 0.19.2 tree (tests/test_export_stacks.py explains why)
_THEORETICAL = textwrap.dedent('''
    import json, os, sys, typing
    typing.override = getattr(typing, "override", lambda f: f)  # 3.12's no-op decorator, for Python 3.11
    import megatron.training.arguments as A
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding
    from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory
    out = []
    for case in json.load(sys.stdin):
        A.get_device_arch_version = lambda: 9  # Hopper (CPU here)
        A.torch.cuda.get_device_capability = lambda *_: (9, 0)
        os.environ.update(case["env"])
        sys.argv = ["pretrain_gpt.py", *case["argv"]]
        args = A.parse_args()
        A.validate_args(args)
        args.padded_vocab_size = vocab_size_with_padding(case["vocab"], args, logging_enabled=False)  # as training does
        out.append(compute_weight_and_optimizer_memory(args))
    print(json.dumps(out))
''')
THEORETICAL = {  # bf16 training, as the report assumes: bf16 weights, fp32 main gradients, master weights and Adam
    "ddp-ep8": ("mixtral-8x7b", 8, dict(dp=8, ep=8, etp=1)),
    "distopt-ep8": ("mixtral-8x7b", 16, dict(dp=16, zero=1, ep=8, etp=1)),
    "distopt-pp2-ep8": ("mixtral-8x7b", 32, dict(dp=16, pp=2, zero=1, ep=8, etp=1)),
    "distopt-tp2-pp4-ep4-etp2": ("mixtral-8x7b", 64, dict(dp=8, tp=2, pp=4, sp=True, zero=1, ep=4, etp=2)),
}


@pytest.mark.slow  # ~10 s: imports Megatron-LM's training package in a subprocess
def test_model_states_equal_megatron_lms_theoretical_memory_report(tmp_path):
    """Weights, gradients and optimizer states of the busiest GPU equal Megatron-LM's compute_weight_and_optimizer_memory
    (the most loaded shard: experts over ep x etp, their optimizer over the expert data-parallel group) to 1e-4."""
    import json
    import os
    import subprocess
    import sys

    from test_export import _run_megatron_script

    from advisor.export import export
    from advisor.layout import Plan
    from advisor.training import TrainingSetup

    root = os.environ.get("ADVISOR_MEGATRON_LM") or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                                 ".megatron-lm")
    if not os.path.isfile(os.path.join(root, "megatron", "training", "theoretical_memory_usage.py")):
        pytest.skip("set ADVISOR_MEGATRON_LM to megatron-core 0.19.2's tree (tests/test_export_stacks.py docstring)")
    hw, cases, ours = load_hardware("dgx-h100"), [], []
    for name, (model_name, world, plan_kw) in THEORETICAL.items():
        model, setup = load_model(model_name), TrainingSetup(micro_batch=1, global_batch=64, seq_len=4096)
        text = export("megatron", model, hw, Plan(**plan_kw), setup, 64 // (plan_kw["dp"]), world, "megatron-core").text
        argv, env = _run_megatron_script(text, tmp_path, {})
        argv += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab - 1), "--mock-data"]
        cases.append({"argv": argv, "env": {**env, "WORLD_SIZE": str(world), "RANK": "0"}, "vocab": model.vocab})
        parts = estimate(model, hw, gpus=world, micro_batch=1, global_batch=64, seq=4096, stack="megatron-core",
                         **plan_kw).memory.parts
        ours.append(parts["weights"] + parts["gradients"] + parts["optimizer_states"])
    run = subprocess.run([sys.executable, "-c", _THEORETICAL], input=json.dumps(cases), capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])},
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    assert dict(zip(THEORETICAL, ours)) == pytest.approx(dict(zip(THEORETICAL, theirs)), rel=1e-4)


# -- Megatron's --recompute-modules -----------------------------------------------------------------------------------
def test_recompute_modules_free_what_megatron_discards():
    """megatron-core 0.19 (transformer_config.py recompute_modules; CheckpointWithoutOutput for layernorm, moe_act and
    mla_up_proj): moe_act stops keeping the routed experts' activation output, fc2's input (k x F per token),
    layernorm both norms' outputs (2 h); core_attn is the default selective policy. Mixtral-8x7B, bf16, 4,096 tokens,
    every layer on the GPU (no pipeline): the differences by hand."""
    kw = dict(gpus=8, ep=8, etp=1, zero=1, seq=4096, stack="megatron-core", recompute="selective")
    act = {m: estimate("mixtral-8x7b", "dgx-h100", recompute_modules=m, **kw).memory.parts["activations"]
           for m in (None, "core_attn", "core_attn,moe_act", "core_attn,layernorm")}
    assert act[None] == act["core_attn"]
    assert act["core_attn"] - act["core_attn,moe_act"] == pytest.approx(K * F * 2 * 4096 * L, rel=1e-9)
    assert act["core_attn"] - act["core_attn,layernorm"] == pytest.approx(2 * H * 2 * 4096 * L, rel=1e-9)
    more = estimate("mixtral-8x7b", "dgx-h100", recompute_modules="core_attn,moe_act,layernorm", **kw)
    less = estimate("mixtral-8x7b", "dgx-h100", **kw)
    assert more.memory.peak_bytes < less.memory.peak_bytes
    assert more.breakdown["compute/recompute"] > less.breakdown["compute/recompute"]


@pytest.mark.parametrize("model,kw,message", [
    ("llama3-8b", dict(recompute_modules="moe_act"), "moe_act needs routed experts, which llama3-8b does not have"),
    ("mixtral-8x7b", dict(recompute_modules="mla_up_proj", ep=8, etp=1), "mla_up_proj needs multi-head latent attention"),
    ("mixtral-8x7b", dict(recompute_modules="moe", ep=8, etp=1), "stack megatron-core costs core_attn, layernorm"),
    ("mixtral-8x7b", dict(recompute_modules="attn", ep=8, etp=1), "--recompute-modules attn: unknown sub-module .attn."),
    ("llama3-8b", dict(recompute_modules="core_attn", recompute="full"), "add --recompute selective"),
    ("llama3-8b", dict(recompute_modules="core_attn", stack="torchtitan"), "torchtitan has no --recompute-modules"),
])
def test_recompute_modules_refusals_are_one_line(model, kw, message):
    kw = {"gpus": 8, "zero": 1, "seq": 4096, "stack": "megatron-core", "recompute": "selective", **kw}
    if kw["stack"] == "torchtitan":
        kw["zero"] = 3
    with pytest.raises(AdvisorError, match=message) as exc:
        estimate(model, "dgx-h100", **kw)
    assert "\n" not in str(exc.value)


def test_recompute_modules_in_the_megatron_exports():
    from advisor.export import export
    from advisor.layout import Plan
    from advisor.training import TrainingSetup

    setup = TrainingSetup(seq_len=4096, recompute="selective", recompute_modules=("core_attn", "moe_act"),
                          stack="megatron-core")
    args = (load_model("mixtral-8x7b"), load_hardware("dgx-h100"), Plan(dp=8, zero=1, ep=8, etp=1), setup, 1, 8)
    text = export("megatron", *args).text
    assert "--recompute-granularity selective" in text and "--recompute-modules core_attn\n    moe_act" in text
    import yaml

    bridge = yaml.safe_load(export("megatron-bridge", *args).text)["model"]
    assert bridge["recompute_granularity"] == "selective" and bridge["recompute_modules"] == ["core_attn", "moe_act"]


def test_gpt_oss_clamp_and_expert_bias_cost_what_megatron_core_runs_unfused():
    """GPT-OSS (k = 4, h = d_ff_expert = 2880, swiglu_limit 7.0) in megatron-core without Transformer Engine's op
    fuser: the clamp and cat before the fused quick-GeGLU (fusions/fused_bias_geglu.py) move 8 elements per element
    of the activation's output forward and 10 backward and keep the cat's output (2 more); fc2's bias added per expert
    scaled by the probabilities (experts.py _apply_bias) moves 6 and 8 per output element. bf16: 2 bytes an element.
    Megatron-Bridge's full-iteration MXFP8 recipes run the expert MLP fused (none of it); a model without the clamp
    or the biases (Qwen3-30B-A3B) runs none of it either."""
    from advisor import compute
    from advisor.stack import RoutedUnfused, load_stack
    from advisor.training import TrainingSetup
    from advisor.unfused_bytes import routed_unfused
    from advisor.workload import Workload

    hw, k, h = load_hardware("gb200-nvl72"), 4, 2880

    def unfused(model, stack, precision, tp=1, etp=1, **setup):
        w = Workload.of(load_model(model), hw, load_stack(stack), TrainingSetup(seq_len=4096, precision=precision,
                                                                               **setup))
        return routed_unfused(w, tp, 8, etp)

    u = unfused("gpt-oss-120b", "megatron-core", "bf16-mixed")
    assert load_model("gpt-oss-120b").experts.act_clamp == 7.0
    assert (u.forward, u.backward) == (k * h * 2 * (8 + 6), k * h * 2 * (10 + 8))
    assert (u.clamp_forward, u.clamp_kept, u.bias_kept) == (k * h * 2 * 8, k * h * 2 * 2, 0.0)
    assert unfused("gpt-oss-120b", "megatron-core", "bf16-mixed", tp=2).forward == u.forward / 2
    # ETP 2: a rank gathers twice the routed rows, the clamp on half their width, the bias on their whole output
    assert unfused("gpt-oss-120b", "megatron-core", "bf16-mixed", tp=2, etp=2).forward == k * h * (8 + 2 * 6)
    # the flex dispatchers hand the probabilities over in fp32 (token_dispatcher.py .float()): the bias runs in fp32
    flex = unfused("gpt-oss-120b", "megatron-core", "bf16-mixed", moe_dispatcher="flex")
    assert (flex.forward, flex.backward) == (k * h * 2 * (8 + 14), k * h * 2 * (10 + 19))
    assert unfused("gpt-oss-120b", "megatron-bridge-perf", "bf16-mixed") == u
    assert unfused("gpt-oss-120b", "megatron-bridge-perf", "mxfp8") == (0.0,) * 5
    assert unfused("qwen3-30b-a3b", "megatron-core", "bf16-mixed") == (0.0,) * 5
    # the step: 36 routed layers x 4 x 16,384 tokens a micro-batch at the GB200's element-wise rate; the clamp's
    # copies not kept where moe_act reruns (the activation reruns its clamp)
    kw = dict(gpus=64, dp=64, zero=1, ep=64, etp=1, micro_batch=4, global_batch=1280, seq=4096, stack="megatron-core",
              precision="bf16-mixed", moe_dispatcher="alltoall", moe_overlap="none")
    with_ = estimate("gpt-oss-120b", "gb200-nvl72", **kw)
    mc = load_stack("megatron-core")
    none = mc.model_copy(update={"kernels": mc.kernels.model_copy(update={"routed_unfused": RoutedUnfused()})})
    without = estimate("gpt-oss-120b", "gb200-nvl72", **{**kw, "stack": none})
    per_micro = 36 * 16384 * k * h * 2 * (8 + 6 + 10 + 8)
    assert with_.step_time_s - without.step_time_s == pytest.approx(
        5 * float(compute.mem_time(hw, per_micro)), rel=0.02)
    assert with_.memory.parts["activations"] - without.memory.parts["activations"] == pytest.approx(
        36 * 16384 * k * h * 2 * 2, rel=0.01)
    moe_act = dict(recompute="selective", recompute_modules="moe_act")
    a, b = (estimate("gpt-oss-120b", "gb200-nvl72", **{**kw, "stack": s, **moe_act}) for s in ("megatron-core", none))
    assert a.memory.parts["activations"] == pytest.approx(b.memory.parts["activations"], rel=1e-9)


@pytest.mark.parametrize("cf", [0.01, 0.5])
def test_dropped_tokens_count_no_flops(cf):
    """A token beyond an expert's capacity skips it (the residual carries it: Fedus et al. 2021, Switch Transformer
    s.2.2): neither model nor hardware FLOPs. At a capacity factor of 0.01 MFU read 151% and HFU 201% on an H100."""
    from advisor import estimate

    kw = dict(gpus=8, dp=8, ep=8, zero=1, global_batch=64, recompute="full")
    dropping = estimate("mixtral-8x7b", "dgx-h100", moe_capacity_factor=cf, **kw)
    full = estimate("mixtral-8x7b", "dgx-h100", moe_capacity_factor=1.0, **kw)
    assert 0 < dropping.mfu <= dropping.hfu <= 1.0
    from advisor.model.catalogue import load_model

    spec = load_model("mixtral-8x7b")
    routed = sum(k.count * sum(lin.flops_per_token for lin in k.linears if lin.copies > 1) for k in spec.layers)
    peak = full.tflops_per_gpu * 1e12 / full.mfu  # the GPU's peak, as MFU divides by it
    model_flops = lambda e: e.mfu * e.step_time_s * e.world_size * peak  # noqa: E731
    # the model FLOPs lose the routed linears' share (1 - cf) of 3 x forward per token
    lost = 3.0 * (1.0 - cf) * routed * full.tokens_per_step
    assert model_flops(full) - model_flops(dropping) == pytest.approx(lost, rel=1e-6)


@pytest.mark.parametrize("plan_kw,has", [
    (dict(gpus=16, tp=4, pp=2, ep=2, sp=True), "--pp 2 without virtual stages"),
    (dict(gpus=8, dp=8, ep=8, zero=1, recompute="full"), "--recompute full"),
    (dict(gpus=8, dp=8, ep=8, zero=1, recompute="block", recompute_layers=4), "--recompute block"),
    (dict(gpus=8, dp=8, ep=1, zero=1), "--ep 1"),
    # :2710-2713 "MTP supports at most one layer"; :2701-2704 "only ... bf16 or fp16"
    (dict(gpus=8, dp=8, ep=8, zero=1, stack="megatron-core", mtp_layers=2), "--mtp-layers 2"),
    (dict(gpus=8, dp=8, ep=8, zero=1, stack="megatron-core", precision="fp32"), "--precision fp32"),
    (dict(gpus=8, dp=8, ep=8, zero=1, stack="megatron-core", precision="fp32", mtp_layers=2, recompute="full"),
     "--recompute full, --mtp-layers 2, --precision fp32")])
def test_the_batch_overlap_is_refused_where_megatron_core_asserts(plan_kw, has):
    """megatron-core 0.19.2 transformer_config.py (overlap_moe_expert_parallel_comm): virtual stages under a pipeline,
    EP, no full recomputation nor a recompute method, at most one MTP depth, a bf16 or fp16 model; such plans were
    ranked, exported and refused by megatron."""
    from advisor import estimate
    from advisor.errors import AdvisorError

    # the refusal names what of the plan breaks it (it listed every condition, leaving the user to find which)
    with pytest.raises(AdvisorError, match=r"--moe-overlap batch \(--overlap-moe-expert-parallel-comm\) runs with EP.*"
                                           rf"\(megatron-core asserts\): this plan has {has}$"):
        estimate("mixtral-8x7b", "dgx-h100", moe_overlap="batch", **plan_kw)
    assert estimate("mixtral-8x7b", "dgx-h100", moe_overlap="batch", gpus=8, dp=8, ep=8, zero=1).step_time_s > 0
    assert estimate("mixtral-8x7b", "dgx-h100", moe_overlap="batch", gpus=8, dp=8, ep=8, zero=1, stack="megatron-core",
                    mtp_layers=1).step_time_s > 0  # one MTP depth it runs


def test_experts_split_by_tp_without_sp_move_the_tokens_once_and_megatron_refuses_it():
    """megatron-core's MoELayer.forward raises under TP without SP (moe_layer.py: "performance may degrade if MoE and
    tensor parallelism are enabled without also enabling sequence parallelism"): refused, and its estimate turns SP on
    by default for a routed model. Where a stack runs it, every TP rank already holds every token: the experts split
    over the TP ranks reduce their outputs as a dense TP MLP's, the same bytes as SP's gather and reduce-scatter; they
    were charged tp times that (a sweep found 60% of a Qwen3-30B-A3B step)."""
    from advisor.errors import AdvisorError
    from advisor.stack import load_stack

    kw = dict(gpus=8, tp=4, zero=1, seq=4096, global_batch=32)
    with pytest.raises(AdvisorError, match="megatron-core's MoE layer needs sequence parallelism under TP: add --sp"):
        estimate("mixtral-8x7b", "dgx-h100", stack="megatron-core", sp=False, **kw)
    assert estimate("mixtral-8x7b", "dgx-h100", stack="megatron-core", **kw).plan.sp  # SP by default
    mc = load_stack("megatron-core")
    lax = mc.model_copy(update={"engine": mc.engine.model_copy(update={"moe_tp_needs_sp": False})})
    with_sp, without = (estimate("mixtral-8x7b", "dgx-h100", stack=lax, sp=sp, **kw) for sp in (True, False))
    assert without.breakdown["comm/ep_alltoall"] == pytest.approx(with_sp.breakdown["comm/ep_alltoall"], rel=1e-6)


@pytest.mark.parametrize("stack", ["torchtitan", "torchtitan-0.2", "hf-trainer", "deepspeed"])
def test_a_capacity_factor_is_refused_where_the_routers_are_dropless(stack):
    """torchtitan's token-choice router sends every routed copy to its expert (0.3.0 models/common/moe.py
    TokenChoiceTopKRouter, token_dispatcher.py: no capacity; 0.2.2 has none either), as transformers' MoE blocks do:
    Qwen3-30B-A3B at --moe-capacity-factor 0.5 was costed in torchtitan at 393.87 ms, dropping half the routed tokens
    its export could not drop (written dropless). Megatron's --moe-expert-capacity-factor (megatron-core 0.16.1
    transformer_config.py:690) and DeepSpeed-MoE's capacity_factor (deepspeed 0.19.8 moe/layer.py:44-49) drop them."""
    kw = dict(dp=8, zero=3, seq=2048, global_batch=16)
    with pytest.raises(AdvisorError, match=r"^--moe-capacity-factor 0\.5: stack .* MoE routing is dropless .*"
                                           r"use --stack megatron-bridge-perf or megatron-core or megatron-deepspeed$"):
        estimate("qwen3-30b-a3b", "dgx-h100", stack=stack, moe_capacity_factor=0.5, **kw)
    assert estimate("qwen3-30b-a3b", "dgx-h100", stack=stack, **kw).step_time_s > 0  # dropless: costed as before


def test_auto_costs_a_capacity_factor_in_a_stack_that_drops_tokens():
    """--stack auto picks a stack whose routers have a capacity (megatron-core, not hf-trainer's dropless blocks), and
    the dropped half of the routed copies shortens the step: Qwen3-30B-A3B on 8 H100s, EP 8, 2,048 tokens."""
    kw = dict(dp=8, ep=8, zero=1, seq=2048, global_batch=16)
    capped = estimate("qwen3-30b-a3b", "dgx-h100", moe_capacity_factor=0.5, **kw)
    dropless = estimate("qwen3-30b-a3b", "dgx-h100", **kw)
    assert capped.stack == dropless.stack == "megatron-core"
    # the busiest rank's routed work and all-to-all bytes halve: the all-to-alls fall to 0.60x (69.8 -> 42.0 ms: the
    # bytes halve, the per-message latency stays), the step to 0.80x (405 -> 323 ms)
    assert 0.5 < capped.breakdown["comm/ep_alltoall"] / dropless.breakdown["comm/ep_alltoall"] < 0.65
    assert 0.7 < capped.step_time_s / dropless.step_time_s < 0.9


def test_an_etp_left_to_default_is_named_in_the_refusal():
    """Qwen3-235B-A22B's published H100 layout (reference/megatron_bridge_performance.csv: 256 GPUs, TP 2, PP 8, EP 32)
    has 16 x 2 = 32 data x tensor ranks a stage: EP 32 with --etp left to tp's 2 (Megatron's --expert-tensor-parallel-size
    default) needs 64; the refusal says etp came from tp and that --etp 1 (Bridge's MoE recipes' setting) keeps experts whole."""
    from advisor.errors import AdvisorError

    kw = dict(gpus=256, tp=2, sp=True, pp=8, ep=32, zero=1, global_batch=8192, micro_batch=1, seq=4096,
              stack="megatron-core")
    with pytest.raises(AdvisorError, match=r"etp=2 \(tp's: --etp not given; --etp 1 keeps each expert whole\)"):
        estimate("qwen3-235b-a22b", "dgx-h100", **kw)
    assert estimate("qwen3-235b-a22b", "dgx-h100", etp=1, **kw).plan.etp == 1


def test_experts_split_by_tp_without_ep_say_what_comm_ep_alltoall_holds():
    """GPT-OSS-120B on 64 GB200s, ZeRO-3 dp=32 x TP=2 in hf-trainer (ep 1, etp 2): expert.time charges the split
    experts' token all-gather and output reduce-scatter over the etp ranks to comm/ep_alltoall (11% of the step here),
    yet the collectives named no "ep" row and plan's reason called it an "expert-parallel dispatch/combine all-to-all",
    a plan without EP. Both now say what was costed."""
    from advisor.explain import NO_EP_WORDS, PART_WORDS
    from advisor.search import plan

    kw = dict(gpus=64, tp=2, zero=3, global_batch=1280, micro_batch=8, seq=4096, precision="mxfp8", stack="hf-trainer")
    e = estimate("gpt-oss-120b", "gb200-nvl72", **kw)
    assert (e.layout.ep, e.layout.etp) == (1, 2) and e.breakdown["comm/ep_alltoall"] > 0.05 * e.step_time_s
    # 8 x 4096 tokens x top-4 copies x 2880 x 2 bytes (bf16 activations) = 720 MiB, over the 2 etp ranks
    assert e.collectives["ep"].startswith("all-gather of 720.00 MiB over 2 GPUs")
    assert e.collectives["ep"].endswith("(no EP: the experts split over 2 ranks, each MoE layer)")
    row = plan("gpt-oss-120b", "gb200-nvl72", gpus=64, global_batch=1280, seq=4096, precision="mxfp8", top=1,
               stack="hf-trainer").plans[0]
    assert row.estimate.layout.ep == 1 and f"largest overhead {NO_EP_WORDS}" in row.reason
    assert PART_WORDS["comm/ep_alltoall"] not in row.reason
    with_ep = estimate("qwen3-30b-a3b", "dgx-h100", gpus=8, tp=2, ep=4, zero=1, global_batch=64, seq=4096,
                       stack="megatron-core")
    assert with_ep.collectives["ep"].startswith("all-to-all of 64.00 MiB over 4 GPUs")  # EP's own row unchanged


def test_a_dense_model_under_tp_names_no_expert_collectives():
    """Candidates gives etp = tp by default, experts or not (advisor.candidates): Llama 3 8B at TP 2 in megatron-core
    listed an "ep" row, 'all-gather of 64.00 MiB over 2 GPUs ... (no EP: the experts split over 2 ranks, each MoE
    layer)', for a model without experts, and comm/ep_alltoall costs 0 there."""
    e = estimate("llama3-8b", "dgx-h100", gpus=8, tp=2, pp=2, global_batch=64, stack="megatron-core")
    assert e.breakdown["comm/ep_alltoall"] == 0.0
    assert set(e.collectives) == {"tp", "dp_grad", "pp_p2p"}, e.collectives


def test_plan_etp_that_no_stage_holds_is_one_line_naming_it():
    """plan --etp 3 on 8 GPUs: every row broke a constraint, and the refusal counted them under "megatron-core's MoE
    layer needs sequence parallelism under TP: add --sp" (a flag plan has not) beside "ep x etp does not divide"; an
    expert tensor-parallel group lies within one stage's dp x cp x tp ranks (world / pp), so etp divides the world."""
    with pytest.raises(AdvisorError, match=r"^--etp 3: an expert tensor-parallel group lies within one pipeline stage's "
                                           r"dp x cp x tp ranks, and 8 GPUs hold no stage of a multiple of 3: give --etp "
                                           r"a divisor of 8$"):
        plan("qwen3-30b-a3b", "dgx-h100", gpus=8, etp=3)
    res = plan("qwen3-30b-a3b", "dgx-h100", gpus="1:16", etp=4, top=3)  # a range: the counts 4 divides
    assert res.worlds == [4, 8, 16] and all((p.estimate.plan.etp or p.estimate.plan.tp) == 4 for p in res.plans)
