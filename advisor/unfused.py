"""What a stack runs outside the fused kernels its element-wise tables count (advisor.stack), read from its profile's
``kernels``, and the bytes those steps move and keep per token of one layer:

- ``routed_unfused``: a routed MLP's steps around its fused activation (GPT-OSS's clamp on the GLU input, the experts'
  output bias scaled by the router's probabilities: megatron-core's TEGroupedMLP without Transformer Engine's op fuser);
- ``rotary``: RoPE, where the tables were measured on a model without it (megatron-core's come from a GPT layer with
  learned positions): its fused kernel, or the unfused path a stack takes for YaRN (megatron-core's apply_rotary_pos_emb
  falls back to _apply_rotary_pos_emb_bshd on mscale != 1, models/common/embeddings/rope_utils.py; Megatron-LM's
  arguments.py and Megatron-Bridge's validate_rope_fusion_compatibility turn fusion off for any position embedding
  type but rope, so for --position-embedding-type yarn whatever its mscale).

Counts are Passes: elements moved per element of the tensor, in the activation dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import numpy as np
from pydantic import Field

from advisor.engine import RecipeName
from advisor.model.spec import PositionKind
from advisor.spec import Spec

if TYPE_CHECKING:
    from advisor.workload import Workload


class Passes(Spec):
    """Elements one unfused element-wise step moves per element of its tensor, in the activation dtype: forward,
    backward, and kept for backward beyond what the stack's tables keep."""

    forward: float = Field(default=0.0, ge=0, le=100)
    backward: float = Field(default=0.0, ge=0, le=100)
    saved: float = Field(default=0.0, ge=0, le=100)


class RoutedUnfused(Spec):
    """What a routed MLP runs outside its fused kernels, where the model has it: the GLU input's clamp (per element of
    the k x d_ff_expert activation output; advisor.model Experts.act_clamp), and the experts' output bias scaled by
    the router's probabilities (per element of the k x d_model output; Experts.expert_bias). None of it under the
    low-precision recipes in ``fused_under``, whose expert MLP the stack runs through fused kernels."""

    clamp: Passes = Field(default_factory=Passes)
    expert_bias: Passes = Field(default_factory=Passes)
    expert_bias_fp32: Passes = Field(default_factory=Passes)  # the same where the probabilities come in fp32 (flex)
    fused_under: list[RecipeName] = Field(default_factory=list)
    source: Optional[str] = None


class Rotary(Spec):
    """RoPE where the stack's element-wise tables leave it out: ``plain`` the stack's kernel, per element of the q and
    k heads (a fused kernel writes the heads whole, their unrotated part copied); for a YaRN model (cos and sin carry
    its attention factor, and Megatron's yarn position embedding turns RoPE fusion off), ``scaled`` per rotated element
    and ``scaled_whole`` per element of the heads. All zero (the default): the tables hold it, measured on a RoPE
    model."""

    plain: Passes = Field(default_factory=Passes)
    scaled: Passes = Field(default_factory=Passes)
    scaled_whole: Passes = Field(default_factory=Passes)
    # the YaRN path's tensors of the rotated width kept per sequence position, not per head or per sample (the cos and
    # sin it makes anew for q and for k, each saved by its product's backward), in the activation dtype
    scaled_per_position: float = Field(default=0.0, ge=0, le=100)
    source: Optional[str] = None


class Unfused(NamedTuple):
    """Bytes per token of a routed layer's unfused steps (routed_unfused)."""

    forward: Any
    backward: Any
    clamp_forward: Any  # rerun with the activation
    clamp_kept: Any  # kept for backward by the clamp; not kept where the activation is recomputed
    bias_kept: Any


def routed_unfused(w: "Workload", tp: Any, ep: Any, etp: Any = 1.0) -> Unfused:
    """Bytes per token one GPU's routed layer moves, and keeps, in the steps its stack runs outside fused kernels
    (kernels.routed_unfused), at the busiest rank's load, over TP as compute.pointwise_bytes' "mlp/act": the clamp on
    the rank's d_ff / etp share of the routed rows it gathered over ETP (etp x as many: the same elements), the bias
    on those rows' whole d_model-wide output (etp x), in fp32 where the dispatcher hands the router's probabilities
    over in fp32 (expert_bias_fp32: the flex dispatchers)."""
    from advisor.parallel import expert  # expert parallelism's module reads the stack, which reads this one

    u, x, r = w.stack.kernels.routed_unfused, w.model.experts, w.precision.recipe
    if x is None or (r is not None and r.name in u.fused_under):
        return Unfused(0.0, 0.0, 0.0, 0.0, 0.0)
    copies = expert.routed_copies(w, ep) * w.act_bytes / tp
    clamp = copies * w.layer.d_ff * (x.act_clamp is not None)  # bytes per element of the activation output
    bias = copies * w.model.d_model * x.expert_bias * np.asarray(etp, dtype=float)  # of the experts' output
    b = u.expert_bias_fp32 if w.moe_dispatcher == "flex" else u.expert_bias
    return Unfused(clamp * u.clamp.forward + bias * b.forward, clamp * u.clamp.backward + bias * b.backward,
                   clamp * u.clamp.forward, clamp * u.clamp.saved, bias * b.saved)


def rotary_bytes(w: "Workload", tp: Any) -> tuple[Any, Any]:
    """(forward, backward) bytes per token one GPU's layer moves applying RoPE beyond its tables (kernels.rotary): its q
    heads (split over TP) and k heads (over min(tp, kv heads), as Megatron replicates them beyond), their rotated share
    where the step counts it so, on the model's mean layer (NoPE layers rotate nothing). MLA's decoupled rope parts are not
    counted here: the stack's MLA kernels rotate them (its kernels.latent, advisor.stack)."""
    m, r = w.model, w.stack.kernels.rotary
    if m.position is not PositionKind.rotary or m.latent is not None:
        return 0.0, 0.0
    layer = w.layer
    heads = layer.q_dim / tp + layer.kv_heads * layer.d_head / np.minimum(tp, layer.kv_heads)  # q and k elements
    per = heads * w.act_bytes * (1.0 - len(m.nope_layers) / m.n_layers)
    if m.rope_scaling is None or m.rope_scaling.kind != "yarn":
        return r.plain.forward * per, r.plain.backward * per
    f = m.rotary_fraction
    return (f * r.scaled.forward + r.scaled_whole.forward) * per, (f * r.scaled.backward + r.scaled_whole.backward) * per


def rotary_saved(w: "Workload", micro_batch: Any) -> Any:
    """Bytes per token one GPU's layer keeps for the YaRN RoPE's backward beyond its tables (kernels.rotary
    scaled_per_position): tensors of the rotated width a position, shared by the micro-batch's samples and kept whole
    on every TP rank (attention runs the whole sequence's positions there), on the model's mean layer."""
    m = w.model
    yarn = m.rope_scaling is not None and m.rope_scaling.kind == "yarn"
    if m.position is not PositionKind.rotary or m.latent is not None or not yarn:
        return 0.0
    per_position = w.stack.kernels.rotary.scaled_per_position * m.rotary_fraction * w.layer.d_head * w.act_bytes
    return per_position * (1.0 - len(m.nope_layers) / m.n_layers) / np.asarray(micro_batch, dtype=float)
