"""The bytes a layer's steps outside the stack's fused kernels move and keep per token (the profile's ``kernels``
routed_unfused and rotary, advisor.unfused): a routed MLP's clamp and expert bias, and RoPE where the element-wise
tables leave it out (advisor.compute adds the time, advisor.memory what is kept)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from advisor.model.spec import PositionKind
from advisor.parallel import expert
from advisor.workload import Workload


class Unfused(NamedTuple):
    """Bytes per token of a routed layer's unfused steps (routed_unfused)."""

    forward: Any
    backward: Any
    clamp_forward: Any  # rerun with the activation
    clamp_kept: Any  # kept for backward by the clamp; not kept where the activation is recomputed
    bias_kept: Any


def routed_unfused(w: Workload, tp: Any, ep: Any, etp: Any = 1.0) -> Unfused:
    """Bytes per token one GPU's routed layer moves, and keeps, in the steps its stack runs outside fused kernels
    (kernels.routed_unfused), at the busiest rank's load, over TP as compute.pointwise_bytes' "mlp/act": the clamp on
    the rank's d_ff / etp share of the routed rows it gathered over ETP (etp x as many: the same elements), the bias
    on those rows' whole d_model-wide output (etp x), in fp32 where the dispatcher hands the router's probabilities
    over in fp32 (expert_bias_fp32: the flex dispatchers)."""
    u, x, r = w.stack.kernels.routed_unfused, w.model.experts, w.precision.recipe
    if x is None or (r is not None and r.name in u.fused_under):
        return Unfused(0.0, 0.0, 0.0, 0.0, 0.0)
    copies = expert.routed_copies(w, ep) * w.act_bytes / tp
    clamp = copies * w.layer.d_ff * (x.act_clamp is not None)  # bytes per element of the activation output
    bias = copies * w.model.d_model * x.expert_bias * np.asarray(etp, dtype=float)  # of the experts' output
    b = u.expert_bias_fp32 if w.moe_dispatcher == "flex" else u.expert_bias
    return Unfused(clamp * u.clamp.forward + bias * b.forward, clamp * u.clamp.backward + bias * b.backward,
                   clamp * u.clamp.forward, clamp * u.clamp.saved, bias * b.saved)


def rotary_bytes(w: Workload, tp: Any) -> tuple[Any, Any]:
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


def rotary_saved(w: Workload, micro_batch: Any) -> Any:
    """Bytes per token one GPU's layer keeps for the YaRN RoPE's backward beyond its tables (kernels.rotary
    scaled_per_position): tensors of the rotated width a position, shared by the micro-batch's samples and kept whole
    on every TP rank (attention runs the whole sequence's positions there), on the model's mean layer."""
    m = w.model
    yarn = m.rope_scaling is not None and m.rope_scaling.kind == "yarn"
    if m.position is not PositionKind.rotary or m.latent is not None or not yarn:
        return 0.0
    per_position = w.stack.kernels.rotary.scaled_per_position * m.rotary_fraction * w.layer.d_head * w.act_bytes
    return per_position * (1.0 - len(m.nope_layers) / m.n_layers) / np.asarray(micro_batch, dtype=float)
