"""What the Megatron exports write against what transformers 5.23 computes, through megatron-core's own functions on
CPU (the environment's 0.16.1; 0.19.2, whose flags the exports write, computes the same in fp32 throughout): the router (each family's TopKRouter from the catalogue's config.json, against
topk_routing_with_score_function under megatron_shape.router_fields: the same experts get the same weights, or the
export refuses the model) and the rotary embedding (--rotary-percent, --rotary-interleaved: RotaryEmbedding and
apply_rotary_pos_emb against each family's own)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from advisor.export.megatron_shape import router_fields, router_unwritten  # noqa: E402
from advisor.model import load_model  # noqa: E402
from advisor.model.hub_configs import HUB_CONFIGS  # noqa: E402

# catalogue name -> (transformers module, router class); every MoE family with a hub config that Megatron can route
ROUTERS = {"mixtral-8x7b": ("mixtral", "MixtralTopKRouter"), "qwen3-30b-a3b": ("qwen3_moe", "Qwen3MoeTopKRouter"),
           "deepseek-v3": ("deepseek_v3", "DeepseekV3TopkRouter"), "kimi-k2": ("deepseek_v3", "DeepseekV3TopkRouter"),
           "deepseek-v2-lite": ("deepseek_v2", "DeepseekV2TopkRouter"), "gpt-oss-120b": ("gpt_oss", "GptOssTopKRouter"),
           "glm-4.5-air": ("glm4_moe", "Glm4MoeTopkRouter"), "minimax-m2": ("minimax_m2", "MiniMaxM2TopKRouter"),
           "llama4-scout": ("llama4", "Llama4Router"), "ernie-4.5-21b-a3b": ("ernie4_5_moe", "Ernie4_5_MoeTopKRouter")}
TOKENS, WIDTH = 64, 32


def _hf_routing(name: str) -> tuple:
    """(logits, dense [tokens, experts] weights, choice bias or None) from transformers' router on random inputs."""
    import importlib

    from transformers import AutoConfig

    module, cls = ROUTERS[name]
    raw = dict(HUB_CONFIGS[name])
    cfg = AutoConfig.for_model(raw.pop("model_type"), **{**raw, "hidden_size": WIDTH})
    cfg = getattr(cfg, "text_config", cfg)
    router = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls)(cfg).float()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in router.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 0.1))
        bias = None
        for buf_name, buf in router.named_buffers():
            if "e_score_correction_bias" in buf_name:
                bias = torch.randn(buf.shape, generator=gen) * 0.05
                buf.copy_(bias)
        h = torch.randn(TOKENS, WIDTH, generator=gen)
        if cls == "Ernie4_5_MoeTopKRouter":  # its statics' bias is a parameter (counted as a router bias)
            bias = router.moe_statics.e_score_correction_bias.detach().reshape(-1).clone()
        if cls == "MiniMaxM2TopKRouter":  # the bias sits on its MoE block and is handed in
            bias = torch.randn(cfg.num_local_experts, generator=gen) * 0.05
            logits, weights, index = router(h, bias)
        elif cls == "Llama4Router":  # dense sigmoid scores, zero where not chosen
            dense, logits = router(h)
            return logits.float(), dense.float(), None
        else:
            logits, weights, index = router(h)[:3]
    dense = torch.zeros(TOKENS, logits.shape[-1]).scatter(1, index, weights.float())
    return logits.float(), dense, bias


def _megatron_routing(name: str, logits, bias):
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    e = load_model(name).experts
    f = router_fields(e)
    probs, _ = topk_routing_with_score_function(
        logits, e.experts_per_token, use_pre_softmax=f.get("moe_router_pre_softmax", False),
        num_groups=e.groups if e.groups > 1 else None, group_topk=e.group_topk if e.groups > 1 else None,
        scaling_factor=f.get("moe_router_topk_scaling_factor"), score_function=f.get("moe_router_score_function", "softmax"),
        expert_bias=bias if f.get("moe_router_enable_expert_bias") else None)
    return probs.float()


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_megatron_routes_as_transformers_where_the_export_writes_the_router(name):
    """DeepSeek-V3 / Kimi-K2: sigmoid, the choice bias, top-2 group sums, renormalised, x2.5 / x2.827; DeepSeek-V2-Lite:
    softmax kept unnormalised (--moe-router-pre-softmax); GLM-4.5, MiniMax-M2: sigmoid with the choice bias; Llama 4:
    top-1 sigmoid; Mixtral, Qwen3, GPT-OSS (its router bias in the logits): softmax over the top k. ERNIE 4.5's choice
    bias on softmax scores has no Megatron flag: the export refuses it, and without it Megatron would pick otherwise."""
    logits, hf, bias = _hf_routing(name)
    mc = _megatron_routing(name, logits, bias)
    refused = [k for k, v in router_unwritten(load_model(name).experts).items() if v]
    if refused:
        assert refused == ["a choice bias on softmax router scores"] and not torch.allclose(hf, mc, atol=1e-5)
    else:
        assert torch.allclose(hf, mc, atol=1e-5), (hf - mc).abs().max()
        assert ((hf > 0) == (mc > 0)).all()  # the same experts chosen


# catalogue name -> transformers module: the families whose RoPE rotates part of a head, halves or interleaved pairs
ROPES = {"gpt-neox-20b": "gpt_neox", "glm-4-9b": "glm4", "glm-4.5-air": "glm4_moe", "minimax-m2": "minimax_m2",
         "llama3-8b": "llama"}


@pytest.mark.parametrize("name", sorted(ROPES))
def test_megatron_rotates_as_transformers_with_the_exported_rope_flags(name, monkeypatch):
    """GPT-NeoX-20B rotates a quarter of each head in halves (rotary_pct 0.25), GLM-4 half in interleaved pairs
    (modeling_glm4.py rotate_half on x[..., 0::2], x[..., 1::2]), GLM-4.5 and MiniMax-M2 half in halves, Llama 3 all of
    it: megatron-core's RotaryEmbedding(rotary_percent, rotary_interleaved) with the spec's values gives transformers'
    queries to 1e-5, and neither the whole head nor the other pairing does (where they differ)."""
    import importlib
    from types import SimpleNamespace

    from transformers import AutoConfig

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # get_emb moves inv_freq to the current device
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    spec, module = load_model(name), ROPES[name]
    raw = dict(HUB_CONFIGS.get(name) or {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                                         "rope_theta": 500000.0})
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    hf = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    rope = next(getattr(hf, c) for c in dir(hf) if c.endswith("RotaryEmbedding"))(cfg)
    seq, q = 16, torch.randn(1, 2, 16, spec.d_head, generator=torch.Generator().manual_seed(0))
    cos, sin = rope(q, torch.arange(seq)[None])
    want = hf.apply_rotary_pos_emb(q, q, cos, sin)[0]

    def megatron(share: float, interleaved: bool):
        emb = RotaryEmbedding(kv_channels=spec.d_head, rotary_percent=share, rotary_interleaved=interleaved,
                              rotary_base=cfg.rope_parameters["rope_theta"], use_cpu_initialization=True)(seq)
        conf = SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=interleaved, multi_latent_attention=False,
                               mrope_section=None)
        return apply_rotary_pos_emb(q.permute(2, 0, 1, 3), emb, conf, cp_group=object()).permute(1, 2, 0, 3)

    assert torch.allclose(megatron(spec.rotary_fraction, spec.rotary_interleaved), want, atol=1e-5)
    assert not torch.allclose(megatron(spec.rotary_fraction, not spec.rotary_interleaved), want, atol=1e-5)
    if spec.rotary_fraction < 1.0:
        assert not torch.allclose(megatron(1.0, spec.rotary_interleaved), want, atol=1e-5)
