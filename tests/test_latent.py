"""Multi-head latent attention as megatron-core 0.19.2 runs it (transformer/multi_latent_attention.py MLASelfAttention):
its GEMMs against the source's shapes and Megatron-LM's own FLOPs formula, the element-wise kernels it runs in place of
a GPT layer's q/k/v layout copies (stack_profiles/megatron-core.yaml kernels.latent), what it keeps for backward and what
--recompute-modules mla_up_proj frees and reruns. DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): h 7168, 128 heads,
q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128."""

from __future__ import annotations

import pytest

from advisor import estimate
from advisor.hardware import load_hardware
from advisor.model import load_model
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload

H, N, QL, KVL, NOPE, ROPE, V, S = 7168, 128, 1536, 512, 128, 64, 128, 4096
QK = NOPE + ROPE  # 192: each head's query/key width


def test_mla_linears_are_megatron_cores_shapes():
    """multi_latent_attention.py MLASelfAttention.__init__: linear_q_down_proj h -> q_lora_rank and linear_kv_down_proj
    h -> kv_lora_rank + qk_pos_emb_head_dim, both parallel_mode "duplicated" (whole on every TP rank);
    linear_q_up_proj q_lora_rank -> heads x (qk_head_dim + qk_pos_emb_head_dim) and linear_kv_up_proj kv_lora_rank ->
    heads x (qk_head_dim + v_head_dim), column-parallel; linear_proj heads x v_head_dim -> h, row-parallel. The core's
    QK^T at 192 and PV at 128 over the (s + 1) / 2 keys a causal query sees."""
    layer = load_model("deepseek-v3").layer
    shapes = {lin.name: (lin.n_in, lin.n_out, lin.split.value) for lin in layer.linears if lin.name.startswith("attention/")}
    assert shapes == {"attention/q_a": (H, QL, "replicated"), "attention/q_b": (QL, N * QK, "column"),
                      "attention/kv_a": (H, KVL + ROPE, "replicated"), "attention/kv_b": (KVL, N * (NOPE + V), "column"),
                      "attention/out": (N * V, H, "row")}
    fl = layer.flops_per_token(S)
    # Megatron-LM training.py num_floating_point_operations, MLA's token-linear term per token and layer (forward: its
    # 3 x 2 over 3), less the "+ 1" it adds per latent element for the q and kv norms (not GEMMs, not counted here)
    megatron = 2 * (QL * (H + N * QK) + KVL * (H + N * (NOPE + V)) + H * ROPE + N * V * H)
    assert fl["attention/qkv"] + fl["attention/out"] == pytest.approx(megatron, rel=1e-12)
    assert fl["attention/qkv"] + fl["attention/out"] == pytest.approx(374_210_560, rel=1e-12)
    assert fl["attention/core"] == pytest.approx(2 * (S + 1) / 2 * N * (QK + V), rel=1e-12)


_MEGATRON_FLOPS = '''
import json, sys, typing
typing.override = getattr(typing, "override", lambda f: f)  # 3.12's no-op decorator, for Python 3.11
from types import SimpleNamespace
from megatron.training.training import num_floating_point_operations
print(json.dumps([num_floating_point_operations(SimpleNamespace(**case), 1) for case in json.load(sys.stdin)]))
'''


@pytest.mark.slow  # ~10 s: imports Megatron-LM's training package in a subprocess
def test_model_flops_are_megatron_lms_less_the_router():
    """advisor's model FLOPs per token (3 x the layers' forward and the logits) against Megatron-LM's own MFU formula
    (training.py num_floating_point_operations, megatron-core 0.19.2's tree) for DeepSeek-V3 without its MTP layer:
    equal but for the router GEMM, which Megatron leaves out (h x 256 a routed layer), and its s / 2 keys a query
    where advisor counts the (s + 1) / 2 a causal kernel computes. With the MTP layer the perf recipes run
    (mtp_num_layers 1) Megatron counts 4.1% more, and so does advisor (advisor.mtp): one more routed layer, eh_proj's
    2h -> h and a second logits, less the same router, keys and norms differences, and Megatron's 3h of MTP norms."""
    import json
    import os
    import subprocess
    import sys

    root = os.environ.get("ADVISOR_MEGATRON_LM") or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                                 ".megatron-lm")
    if not os.path.isfile(os.path.join(root, "megatron", "training", "training.py")):
        pytest.skip("set ADVISOR_MEGATRON_LM to megatron-core 0.19.2's tree (tests/test_export_stacks.py docstring)")
    m = load_model("deepseek-v3")
    x, e = m.latent, m.experts
    case = dict(hybrid_layer_pattern=None, group_query_attention=False, num_attention_heads=m.n_heads,
                num_query_groups=m.n_heads, num_experts=e.n_experts, moe_layer_freq=[0] * 3 + [1] * 58,
                num_layers=m.n_layers, mtp_num_layers=None, moe_ffn_hidden_size=e.d_ff_expert, ffn_hidden_size=m.d_ff,
                moe_latent_size=None, moe_shared_expert_intermediate_size=e.d_ff_shared, swiglu=True,
                multi_latent_attention=True, q_lora_rank=x.q_lora_rank, kv_lora_rank=x.kv_lora_rank, hidden_size=m.d_model,
                qk_head_dim=x.qk_nope_head_dim, qk_pos_emb_head_dim=x.qk_rope_head_dim, v_head_dim=x.v_head_dim,
                experimental_attention_variant=None, padded_vocab_size=m.vocab, seq_length=S, moe_router_topk=8)
    run = subprocess.run([sys.executable, "-c", _MEGATRON_FLOPS], input=json.dumps([case, {**case, "mtp_num_layers": 1}]),
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])})
    assert run.returncode == 0, run.stderr[-2000:]
    theirs, with_mtp = (f / S for f in json.loads(run.stdout.strip().splitlines()[-1]))
    ours = 3 * (sum(k.count * sum(k.flops_per_token(S).values()) for k in m.layers) + 2 * m.d_model * m.vocab)
    router = 3 * 58 * 2 * H * e.n_experts
    keys = 3 * m.n_layers * 2 * (1 / 2) * N * (QK + V)  # (s + 1) / 2 keys against s / 2
    # Megatron's "+ 1" per latent element (the q and kv norms) in its MLA term
    norms = 3 * 2 * m.n_layers * (QL + KVL)
    assert ours - router - keys + norms == pytest.approx(theirs, rel=1e-12)
    assert with_mtp / theirs == pytest.approx(1.0408, abs=1e-4)
    from advisor import mtp

    ours_mtp = ours + 3 * mtp.forward_flops_per_token(m, 1, S)
    # one layer's router, keys and latent norms more, and Megatron's MTP norms: 3 x 2 x 3h (training.py "MTP eh norm +
    # final nrom")
    one = (router / 58, keys / m.n_layers, norms / m.n_layers)
    assert ours_mtp - router - one[0] - keys - one[1] + norms + one[2] + 3 * 2 * 3 * H == pytest.approx(with_mtp, rel=1e-12)


def _workload(model="deepseek-v3", stack="megatron-core", **setup):
    return Workload.of(load_model(model), load_hardware("gb200-nvl72"), load_stack(stack), TrainingSetup(seq_len=S, **setup))


def test_megatron_core_mla_elementwise_bytes_per_token():
    """kernels.latent in place of the tables' q_dim and kv_dim terms (a GPT layer's q/k/v layout copies and output
    merge: 8 bytes each forward in bf16, 16 backward), bytes per token of a DeepSeek-V3 layer, bf16, by hand.
    fused_mla_yarn_rope_apply.py: the query's rope part rotated in place (2 x heads x 64 elements each way); kv_b's output
    (heads x 256) read into new key and value tensors (heads x (192 + 128)), backward dk and dv read and d_kv written.
    On the latents: the q and kv norms (2 x 2048; backward 3 x 2048), the kv latent's contiguous copy (2 x 512), in
    backward kv_a's split gradients concatenated (2 x 576) and the two down projections' input gradients summed
    (3 x 7168)."""
    t = _workload().tables
    heads_fwd = 2 * (2 * N * ROPE + N * (NOPE + V) + N * (QK + V))  # 180,224 bytes
    heads_bwd = heads_fwd
    mlp_fwd, mlp_bwd = 6 * (8 * 2048 + 2048), 12 * (8 * 2048 + 2048)  # the tables' SwiGLU on k routed + the shared
    assert t.elementwise_forward.split == pytest.approx(mlp_fwd + heads_fwd)
    assert t.elementwise_backward.split == pytest.approx(mlp_bwd + heads_bwd)
    assert t.elementwise_forward.sequence == pytest.approx(22 * H + 2 * (2 * (QL + KVL) + 2 * KVL))
    assert t.elementwise_backward.sequence == pytest.approx(44 * H + 2 * (3 * (QL + KVL) + 2 * (KVL + ROPE) + 3 * H))
    # against the tables' 8 (q_dim + kv_dim) forward and 16 backward, what it replaces: ~2x and ~4x the bytes
    gpt = 8 * (N * QK + N * (QK + V) / 2)
    assert (heads_fwd, 2 * gpt) == (180_224, 720_896) and gpt == 360_448
    # under TP 8 with sequence parallelism the heads' kernels split 8 ways, and so do the latents' (on each rank's tokens)
    assert t.elementwise_forward.per_gpu(8, True) == pytest.approx((mlp_fwd + heads_fwd + t.elementwise_forward.sequence) / 8)
    # the forward kernels the mla_up_proj recomputation reruns
    assert t.latent_forward.per_gpu(1, False) == pytest.approx(heads_fwd + 2 * (2 * (QL + KVL) + 2 * KVL))
    # a stack without kernels.latent keeps its tables whole, and a model without MLA is untouched
    titan = _workload(stack="torchtitan").tables
    assert titan.latent_forward.per_gpu(1, False) == 0.0
    llama = _workload("llama3-8b").tables
    assert llama.elementwise_forward.split == pytest.approx(6 * 14336 + 8 * 4096 + 8 * 1024)


def test_mla_keeps_its_latents_and_mla_up_proj_frees_and_reruns_them():
    """What a DeepSeek-V3 layer keeps per token in bf16 (stack_profiles/megatron-core.yaml memory.saved): q, k, v (2 x
    heads x (192 + 192 + 128)), the attention output at the value width (2 x heads x 128: o_dim, not q_dim), the softmax
    statistics, and the up projections' LayerNormLinear input and normed output of each latent (2 x 2 x 2048).
    mla_up_proj (CheckpointWithoutOutput around qkv_up_proj_and_rope_apply) frees q, k, v and the latents' copies and
    reruns q_b, kv_b and MLA's own forward kernels in backward."""
    t = _workload().tables
    # k and v in the kv part, split over min(tp, KV heads): MLA's KV heads are its query heads (advisor.model.build)
    assert t.saved_layer.kv_heads == N
    assert t.saved_layer.split + t.saved_layer.kv == pytest.approx(2 * N * (QK + QK + V) + 2 * N * V + 4 * N
                                                                   + 6 * (8 * 2048 + 2048))
    assert t.saved_layer.sequence == pytest.approx(8 * H + 8 + 2 * 2 * (QL + KVL))
    kw = dict(gpus=8, dp=1, ep=8, etp=1, pp=8, zero=1, seq=S, micro_batch=1, global_batch=8, stack="megatron-core",
              recompute="selective")
    base = estimate("deepseek-v2-lite", "gb200-nvl72", **{**kw, "gpus": 8, "pp": 1, "dp": 8, "global_batch": 64})
    up = estimate("deepseek-v2-lite", "gb200-nvl72", **{**kw, "gpus": 8, "pp": 1, "dp": 8, "global_batch": 64},
                  recompute_modules="core_attn,mla_up_proj")
    lite = load_model("deepseek-v2-lite")  # 16 heads, q projected whole (q_lora_rank None), kv_lora_rank 512
    per_token = 2 * (16 * QK + 16 * QK + 16 * V + KVL)  # q, k, v and the latents' copies (no q latent)
    freed = base.memory.parts["activations"] - up.memory.parts["activations"]
    assert freed == pytest.approx(per_token * S * lite.n_layers, rel=1e-9)
    assert up.breakdown["compute/recompute"] > base.breakdown["compute/recompute"]
