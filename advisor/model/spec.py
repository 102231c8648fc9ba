"""A decoder-only transformer: its shape, its parameter count as a named breakdown.

The layers' own parameters come from the layer table (advisor.model.layer, filled by advisor.model.build);
here are those outside the layers: the token embedding, learned positions where the model has them, BLOOM's
embedding norm, the final norm and an untied LM head. The counts equal what Hugging Face ``transformers``
builds, tested family by family on the meta device (tests/test_hf_families.py): GPT-2 small 124,439,808 (tied
embeddings, biases on every Linear, learned positions); Llama-2 7B 6,738,415,616 (untied, no biases, RMSNorm,
SwiGLU); BLOOM-176B 176,247,271,424; Mixtral-8x7B 46,702,792,704 (every expert; 12.9B active per token).

Besides the dense shape: per-linear biases, the norms in a layer and q/k norms, parallel attention + MLP blocks,
multi-head latent attention (``latent``), routed and shared experts (``experts``), and runs of layers that
differ in their attention window or chunk or in being dense (``layer_runs``), soft-capping and attention sinks.
Beside the shape, what changes neither the parameters nor the cost but that an export must write, or it trains
another model: RoPE's base (``rope_theta``) and scaling (``rope_scaling``), and the norms' epsilon (``norm_eps``).
Deliberately left out: encoder-decoder models, multimodal towers, hybrid recurrent / linear-attention layers.
"""

from __future__ import annotations

from enum import Enum
import math
from typing import Literal, Optional

from pydantic import Field, model_validator

from advisor.errors import AdvisorError
from advisor.model.layer import DecoderLayer, MLPKind, NormKind
from advisor.spec import ApiSpec, Spec


class PositionKind(str, Enum):
    learned = "learned"  # absolute position embedding table (GPT-2, GPT-3)
    rotary = "rotary"  # RoPE: no parameters
    alibi = "alibi"  # BLOOM: no parameters


class QKNorm(str, Enum):
    none = "none"
    head = "head"  # one d_head-wide norm for q and one for k, shared by the heads (Qwen3, Gemma 3)
    full = "full"  # q_dim- and kv_dim-wide norms over the projections (OLMo 2, Cohere's per-head weights)


class ModelError(AdvisorError):
    pass


class LatentAttention(Spec):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 s.2.1): queries through a low-rank q_lora_rank
    (or a full q projection where it is None), keys and values from one kv_lora_rank latent plus a shared rope key."""

    q_lora_rank: Optional[int] = Field(default=None, ge=1, le=10_000_000)
    kv_lora_rank: int = Field(ge=1, le=10_000_000)
    qk_nope_head_dim: int = Field(ge=0, le=1_000_000)
    qk_rope_head_dim: int = Field(ge=0, le=1_000_000)
    v_head_dim: int = Field(ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _qk(self) -> "LatentAttention":
        if self.qk_nope_head_dim + self.qk_rope_head_dim < 1:
            raise ValueError("qk_nope_head_dim + qk_rope_head_dim must be at least 1")
        return self


class Experts(Spec):
    """Mixture of experts in a layer's MLP: a router picks ``experts_per_token`` of ``n_experts`` gated MLPs of
    width ``d_ff_expert``; ``d_ff_shared`` is the width of the always-active shared experts (0: none)."""

    n_experts: int = Field(ge=1, le=1_000_000)
    experts_per_token: int = Field(ge=1, le=1_000_000)
    d_ff_expert: int = Field(ge=1, le=100_000_000)
    d_ff_shared: int = Field(default=0, ge=0, le=100_000_000)
    shared_gate: bool = False  # Qwen2-MoE: a sigmoid gate, h -> 1, on the shared expert's output
    router_bias: bool = False  # GPT-OSS
    expert_bias: bool = False  # GPT-OSS: biases on the experts' linears
    # group-limited routing (DeepSeek-V3's n_group / topk_group under topk_method noaux_tc; Megatron's
    # --moe-router-num-groups / --moe-router-group-topk): a token's experts come from its top group_topk of groups
    # equal groups of consecutive experts; 1 of 1: unlimited
    groups: int = Field(default=1, ge=1, le=1_000_000)
    group_topk: int = Field(default=1, ge=1, le=1_000_000)
    # how the router weighs the experts it picks (no parameters, no cost: another model if an export writes otherwise;
    # transformers' routers, Megatron's --moe-router-* flags): softmax or sigmoid scores, the k chosen renormalised to
    # sum to 1 (top_k_norm), a per-expert bias on the scores for the choice alone, kept by the load balancing and not
    # trained (choice_bias: DeepSeek-V3's e_score_correction_bias, a buffer), the weights' factor (scale: DeepSeek's
    # routed_scaling_factor), and a group's score for group-limited routing (the sum of its top two, DeepSeek-V3;
    # its best expert, DeepSeek-V2's group_limited_greedy)
    score: Literal["softmax", "sigmoid", "sparsemixer"] = "softmax"  # sparsemixer: PhiMoE's (modeling_phimoe.py)
    top_k_norm: bool = True
    choice_bias: bool = False
    scale: float = Field(default=1.0, gt=0, le=1e4)
    group_score: Literal["top2_sum", "max"] = "top2_sum"
    weights_on_input: bool = False  # the router's weight scales the expert's input, not its output (Llama 4)
    # GPT-OSS's swiglu_limit: the experts clamp both halves of the GLU input before the activation (transformers
    # modeling_gpt_oss.py GptOssExperts; Megatron's --activation-func-clamp-value); no parameters, element-wise work
    # where a stack runs it outside its fused activation (the profile's kernels.routed_unfused)
    act_clamp: Optional[float] = Field(default=None, gt=0, le=1e6)
    # the experts' GLU as GPT-OSS computes it (modeling_gpt_oss.py GptOssExperts: gate x sigmoid(1.702 gate) x (up + 1)):
    # quick GELU on the gate half, an offset of 1 on the linear half; Megatron's --quick-geglu (megatron-core
    # fusions/fused_bias_geglu.py quick_gelu, 1.702) and --glu-linear-offset 1. Element-wise work the same as SwiGLU's
    quick_glu: bool = False

    @model_validator(mode="after")
    def _top_k(self) -> "Experts":
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds n_experts={self.n_experts}")
        if self.n_experts % self.groups or self.group_topk > self.groups:
            raise ValueError(f"routing groups: {self.n_experts} experts in {self.groups} groups, top {self.group_topk} "
                             "of them: the groups must divide the experts and hold the top groups")
        if self.groups > 1 and self.group_topk * self.n_experts // self.groups < self.experts_per_token:
            raise ValueError(f"top {self.group_topk} of {self.groups} groups hold fewer than experts_per_token="
                             f"{self.experts_per_token} experts")
        return self


class LayerRun(Spec):
    """Consecutive layers alike: their attention span, a sliding ``window`` or a ``chunk`` (None for both: every
    earlier key), and whether their MLP is dense in a model whose other layers route to experts (DeepSeek's
    first_k_dense_replace, Qwen-MoE's mlp_only_layers)."""

    count: int = Field(ge=1, le=100_000)
    window: Optional[int] = Field(default=None, ge=1, le=100_000_000)
    # chunked local attention (Llama 4's attention_chunk_size): the sequence cut into chunks of ``chunk`` tokens, a
    # query attending to the earlier keys of its own chunk (transformers' create_chunked_causal_mask)
    chunk: Optional[int] = Field(default=None, ge=1, le=100_000_000)
    dense: bool = False

    @model_validator(mode="after")
    def _one_span(self) -> "LayerRun":
        if self.window is not None and self.chunk is not None:
            raise ValueError(f"a layer run has both a sliding window ({self.window}) and a chunk ({self.chunk}): give one")
        return self


class RopeScaling(Spec):
    """RoPE's frequencies scaled for a longer context (config.json's rope_parameters, rope_scaling before transformers 5;
    transformers 5.23 modeling_rope_utils.py): its rope_type, its factor, the context the model was first trained on,
    Llama 3.1's low and high frequency factors, YaRN's betas and DeepSeek's mscales, each None where the config gives
    none. No parameters; a YaRN runs megatron-core's RoPE unfused (advisor.unfused_bytes.rotary_bytes)."""

    kind: str = Field(min_length=1, max_length=40, pattern=r"^[^\x00-\x1f\x7f]+$")  # linear, dynamic, yarn, llama3, ...
    factor: Optional[float] = Field(default=None, gt=0, le=1e6)
    original_max_positions: Optional[int] = Field(default=None, ge=1, le=100_000_000)
    low_freq_factor: Optional[float] = Field(default=None, gt=0, le=1e6)
    high_freq_factor: Optional[float] = Field(default=None, gt=0, le=1e6)
    beta_fast: Optional[float] = Field(default=None, gt=0, le=1e6)
    beta_slow: Optional[float] = Field(default=None, gt=0, le=1e6)
    mscale: Optional[float] = Field(default=None, ge=0, le=1e6)
    mscale_all_dim: Optional[float] = Field(default=None, ge=0, le=1e6)
    attention_factor: Optional[float] = Field(default=None, gt=0, le=100)  # YaRN's, where the config states it
    truncate: Optional[bool] = None  # YaRN's correction range rounded to integers (transformers' default: True)


class ModelSpec(ApiSpec):
    name: str
    n_layers: int = Field(ge=1, le=100_000)
    d_model: int = Field(ge=1, le=10_000_000)
    n_heads: int = Field(ge=1, le=1_000_000)
    n_kv_heads: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    head_dim: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    d_ff: int = Field(ge=1, le=100_000_000)
    vocab: int = Field(ge=1, le=100_000_000)
    max_positions: int = Field(default=2048, ge=1, le=100_000_000)
    mlp: MLPKind = MLPKind.gelu
    norm: NormKind = NormKind.layernorm
    position: PositionKind = PositionKind.learned
    tied_embeddings: bool = True
    linear_bias: bool = True  # biases on every Linear (GPT-2/3, BLOOM)
    qkv_bias: bool = False  # biases on q, k, v (Qwen2; with linear_bias False)
    out_bias: bool = False  # a bias on the attention output projection (Llama's attention_bias)
    mlp_bias: bool = False  # biases on the MLP's linears (GPT-NeoX, GPT-J)
    lm_head_bias: bool = False  # a bias on the LM head (GPT-J, Phi-2)
    embedding_norm: bool = False  # BLOOM's word_embeddings_layernorm
    norms_per_layer: int = Field(default=2, ge=1, le=4)  # d_model-wide norms: 1 (Falcon-7B), 2, 4 (Gemma 2/3)
    qk_norm: QKNorm = QKNorm.none
    parallel_block: bool = False  # attention and MLP read the same input and add to one residual (GPT-J, Falcon)
    latent: Optional[LatentAttention] = None
    experts: Optional[Experts] = None
    layer_runs: tuple[LayerRun, ...] = ()  # in layer order; empty: every layer global-attention (and routed)
    # layers (0-based) that apply no rotary embedding to q and k (NoPE: Llama 4's and SmolLM3's no_rope_layers zeros):
    # no parameters and an element-wise pass less, but another model if an export writes RoPE there
    nope_layers: tuple[int, ...] = ()
    # the share of each head's query/key width that RoPE rotates (GPT-NeoX's rotary_pct, partial_rotary_factor), and
    # whether it rotates interleaved pairs (GPT-J, GLM-4: RoFormer's) rather than the two halves: no parameters
    rotary_fraction: float = Field(default=1.0, gt=0, le=1)
    rotary_interleaved: bool = False
    qk_l2_norm: bool = False  # a weightless L2 norm of q and k on the RoPE layers (Llama 4's use_qk_norm): no parameters
    attn_softcap: Optional[float] = Field(default=None, gt=0)  # tanh(scores / c) c (Gemma 2)
    logit_softcap: Optional[float] = Field(default=None, gt=0)  # tanh(logits / c) c (Gemma 2)
    attention_sinks: bool = False  # one learned sink logit per head and layer (GPT-OSS)
    # RoPE's base (config.json's rope_theta, rope_parameters' under transformers 5) and the norms' epsilon (rms_norm_eps,
    # layer_norm_eps, layer_norm_epsilon, norm_epsilon: the family's key), the config class's default where absent; None
    # where not known (a catalogue shape without its config.json), not one value (Gemma 3's local and global bases), or
    # without RoPE. No parameters, no cost, but another model where an export writes another value (Megatron's
    # --rotary-base default 10000, --norm-epsilon 1e-5): advisor.export.megatron_shape writes them
    rope_theta: Optional[float] = Field(default=None, gt=0, le=1e15)
    norm_eps: Optional[float] = Field(default=None, gt=0, le=1)
    rope_scaling: Optional[RopeScaling] = None  # None: RoPE unscaled (rope_type default), or no RoPE
    family: str = "gpt"  # informational: the config.json model_type it was read from

    @model_validator(mode="after")
    def _heads(self) -> "ModelSpec":
        kv = self.kv_heads
        if kv > self.n_heads or self.n_heads % kv:
            raise ValueError(f"n_kv_heads={kv} must divide n_heads={self.n_heads}")
        if self.head_dim is None and self.latent is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.layer_runs and sum(r.count for r in self.layer_runs) != self.n_layers:
            raise ValueError(f"layer_runs cover {sum(r.count for r in self.layer_runs)} layers, not n_layers={self.n_layers}")
        if any(not 0 <= i < self.n_layers for i in self.nope_layers):
            raise ValueError(f"nope_layers holds layer indices outside 0..{self.n_layers - 1}")
        if self.experts is None and any(r.dense for r in self.layer_runs):
            raise ValueError("a layer run is marked dense in a model without experts")
        return self

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        """Query and key width per head (MLA: the no-position and rotary parts together)."""
        if self.latent is not None:
            return self.latent.qk_nope_head_dim + self.latent.qk_rope_head_dim
        return self.head_dim or self.d_model // self.n_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.d_head

    @property
    def layers(self) -> tuple[DecoderLayer, ...]:
        """Every distinct layer of the model with how many layers it is (advisor.model.build)."""
        from advisor.model.build import build_layers

        return build_layers(self)

    @property
    def layer(self) -> DecoderLayer:
        """The layer most of the model's layers are (every layer of a dense model: the one the cost model costs)."""
        return max(self.layers, key=lambda layer: layer.count)

    # -- parameter counts (a named breakdown) ---------------------------------------------------
    def layer_params(self) -> dict[str, int]:
        return self.layer.params()

    def param_breakdown(self) -> dict[str, int]:
        layer = self.layer
        out = {"embedding": self.vocab * self.d_model}
        if self.position is PositionKind.learned:
            out["position_embedding"] = self.max_positions * self.d_model
        if self.embedding_norm:
            out["embedding_norm"] = layer.norm_params
        out["layers"] = sum(k.n_params * k.count for k in self.layers)
        out["final_norm"] = layer.norm_params
        if not self.tied_embeddings:
            out["lm_head"] = self.vocab * self.d_model
        if self.lm_head_bias:
            out["lm_head_bias"] = self.vocab
        return out

    @property
    def n_params(self) -> int:
        return sum(self.param_breakdown().values())

    @property
    def active_params(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to (= n_params for a dense model)."""
        layers = sum(k.active_params * k.count for k in self.layers)
        return round(self.n_params - self.param_breakdown()["layers"] + layers)

    @property
    def routed(self) -> bool:
        """Whether some layer routes tokens to experts."""
        return any(k.routed for k in self.layers)

    @property
    def embedding_params(self) -> int:
        """Parameters outside the transformer layers (embeddings, final norm, untied head)."""
        return self.n_params - self.param_breakdown()["layers"]

    @property
    def rope_attention_factor(self) -> float:
        """YaRN's attention factor on RoPE's cos and sin (transformers 5.23 _compute_yarn_parameters): the config's
        attention_factor, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) where both are set
        (DeepSeek-V3's 1 / 1), else get_mscale(factor) = 0.1 ln(factor) + 1 (GPT-OSS: 1.347), 1 where factor <= 1,
        factor defaulting to max positions / the original context; 1 without YaRN. No parameters (what an export's
        YaRN flags must reproduce)."""
        r = self.rope_scaling
        if r is None or r.kind != "yarn":
            return 1.0
        if r.attention_factor is not None:
            return r.attention_factor
        factor = r.factor if r.factor is not None else self.max_positions / (r.original_max_positions or self.max_positions)

        def mscale(m: float = 1.0) -> float:
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

        return mscale(r.mscale) / mscale(r.mscale_all_dim) if r.mscale and r.mscale_all_dim else mscale()

    @property
    def position_params(self) -> int:
        """A learned position table's parameters (0 for rotary and ALiBi)."""
        return self.max_positions * self.d_model if self.position is PositionKind.learned else 0

    def llama_departures(self) -> list[str]:
        """What departs from a Llama decoder as nanotron 0.4's LlamaForTraining (models/llama.py) builds it:
        TritonRMSNorm, GLUActivation over one merged gate_up column linear (:127-181), bias-free linears, head width
        hidden_size / heads (:291), RoPE, no experts, windows, q/k norms or soft-capping."""
        found = {
            f"a {self.mlp.value} MLP": self.mlp is not MLPKind.swiglu,
            f"{self.norm.value} norms": self.norm is not NormKind.rmsnorm,
            f"{self.position.value} positions": self.position is not PositionKind.rotary,
            "experts": self.experts is not None, "multi-head latent attention": self.latent is not None,
            "biases": self.linear_bias or self.qkv_bias or self.out_bias or self.mlp_bias or self.lm_head_bias,
            "q/k norms": self.qk_norm is not QKNorm.none, "parallel attention + MLP blocks": self.parallel_block,
            f"{self.norms_per_layer} norms per layer": self.norms_per_layer != 2,
            "an embedding norm": self.embedding_norm,
            f"head_dim {self.head_dim} != hidden / heads": (self.head_dim is not None
                                                             and self.head_dim * self.n_heads != self.d_model),
            "sliding-window attention": any(r.window for r in self.layer_runs),
            "chunked attention": any(r.chunk for r in self.layer_runs),
            "layers without RoPE": bool(self.nope_layers),
            "partial RoPE": self.rotary_fraction != 1.0, "RoPE on interleaved pairs": self.rotary_interleaved,
            "L2 q/k norms": self.qk_l2_norm,
            "soft-capping": self.attn_softcap is not None or self.logit_softcap is not None,
            "attention sinks": self.attention_sinks,
        }
        return [name for name, present in found.items() if present]
