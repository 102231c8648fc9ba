"""Bytes per token of one layer as linear forms in its dimensions (advisor.stack's tables): a form's coefficients, the
three parts tensor parallelism divides differently (``split`` over the TP ranks, ``sequence`` only under sequence
parallelism, ``whole`` never) and their value on a layer (advisor.model.layer.DecoderLayer)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from advisor.model.layer import DecoderLayer
from advisor.spec import Spec

# besides: o_dim, the attention output's width (heads x the value width: q_dim but under MLA), and MLA's widths
# (advisor.model.layer.DecoderLayer.latent_widths: 0 in a layer without it)
Dim = Literal["d_model", "d_ff", "q_dim", "kv_dim", "heads", "d_head", "constant", "o_dim", "q_rope", "kv_up", "latents",
              "kv_latent", "kv_down"]
# a coefficient of a layer dimension (bytes per token per unit of it): at least 0, and at most a million bytes, beyond
# any tensor a layer keeps (a GPT-3 layer keeps ~34 bytes per token of d_model: Korthikanti et al. 2022, Table 2)
Form = dict[Dim, Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]]


class PerLayerBytes(Spec):
    """Bytes per token of one layer, by how tensor parallelism divides them (module docstring)."""

    split: Form = Field(default_factory=dict)
    sequence: Form = Field(default_factory=dict)
    whole: Form = Field(default_factory=dict)
    scores: float = Field(default=0.0, ge=0, le=1e6)

    def replacing_heads(self, other: "PerLayerBytes") -> "PerLayerBytes":
        """These bytes without their q_dim and kv_dim terms, plus ``other``'s (Kernels.latent)."""
        def add(a: Form, b: Form) -> Form:
            out = {d: v for d, v in a.items() if d not in ("q_dim", "kv_dim")}
            return {**out, **{d: out.get(d, 0.0) + v for d, v in b.items()}}
        return PerLayerBytes(split=add(self.split, other.split), sequence=add(self.sequence, other.sequence),
                             whole=add(self.whole, other.whole), scores=self.scores + other.scores)


def form_value(form: Form, layer: DecoderLayer) -> float:
    """A linear form evaluated on a layer's dimensions."""
    dims = {"d_model": layer.d_model, "d_ff": layer.d_ff, "q_dim": layer.q_dim, "kv_dim": layer.kv_dim,
            "heads": layer.n_heads, "d_head": layer.d_head, "constant": 1, "o_dim": layer.n_heads * layer.v_head,
            **layer.latent_widths()}
    return float(sum(coef * dims[d] for d, coef in form.items()))


@dataclass(frozen=True)
class LayerBytes:
    """Bytes per token of one layer, evaluated, by how tensor parallelism divides them; ``kv`` (saved tables only:
    ``of(..., kv_groups=True)``) is the ``split`` part's kv_dim terms, which a TP rank holds whole KV heads of: kv_dim
    over min(tp, kv heads) (megatron-core 0.19.2 transformer/attention.py:353-367: num_query_groups_per_partition 1
    where num_query_groups < tp, each rank keeping one whole group's k and v; advisor.parallel.tensor replicates the KV
    heads so for every stack)."""

    split: float
    sequence: float
    whole: float
    scores: float  # per head per key
    kv: float = 0.0
    kv_heads: float = np.inf

    @classmethod
    def of(cls, b: PerLayerBytes, layer: DecoderLayer, kv_groups: bool = False) -> "LayerBytes":
        if not kv_groups:
            return cls(form_value(b.split, layer), form_value(b.sequence, layer), form_value(b.whole, layer), b.scores)
        kv = form_value({"kv_dim": b.split["kv_dim"]} if "kv_dim" in b.split else {}, layer)
        rest = {d: v for d, v in b.split.items() if d != "kv_dim"}
        return cls(form_value(rest, layer), form_value(b.sequence, layer), form_value(b.whole, layer), b.scores, kv,
                   layer.kv_heads)

    def without_scores(self) -> "LayerBytes":
        return replace(self, scores=0.0)

    def per_gpu(self, tp: Any, sp: Any, scores_per_token: float = 0.0) -> Any:
        """Bytes per token on one TP rank; ``scores_per_token`` is heads x keys (0 where no scores are kept)."""
        tp = np.asarray(tp, dtype=float)
        out = (self.split + self.scores * scores_per_token) / tp
        out = out + (self.kv / np.minimum(tp, self.kv_heads) if self.kv else 0.0)
        out = out + (self.sequence / np.where(sp, tp, 1.0) if self.sequence else 0.0)
        return out + self.whole


NO_BYTES = LayerBytes(0.0, 0.0, 0.0, 0.0)
