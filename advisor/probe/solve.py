"""Which layer dimension a measured tensor is made of: per-token sizes observed on a few configs, solved for the
linear forms a stack profile keeps (advisor.stack: coefficients of d_model, d_ff, q_dim, kv_dim, heads, d_head and
a constant, per token).

A tensor's size per token (its elements over the b x s tokens of the batch) is measured on three or more configs
whose dimensions are pairwise distinct and vary independently, so one term (c x dim) fits a tensor on every config
only if that is what it is made of; a fused tensor (the q, k and v of one GEMM: q_dim + 2 kv_dim) fits two terms,
solved on two configs and checked on the rest. Besides the profile's dimensions a tensor may be the s x s attention
scores (heads x s elements per token), a row of an s x s mask (s per token), a logit row (vocab), or smaller than
one element per token (a per-layer tensor: a bias gradient, a scalar), which the per-token forms leave out.

Pure Python; no torch. Used by advisor.probe.measure's results and unit-tested on toy numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from advisor.errors import AdvisorError

# the profile's dimensions, in the order that wins where a model family makes two of them equal (GPT-2: q_dim =
# kv_dim = d_model), then the terms outside the profile's per-layer forms
FORM_TERMS = ("d_model", "d_ff", "q_dim", "kv_dim", "heads", "d_head", "constant")
OTHER_TERMS = ("scores", "mask", "vocab")
TERMS = FORM_TERMS + OTHER_TERMS
PER_LAYER = "per_layer"  # less than one element per token on every config: not a per-token quantity
TOL = 1e-6  # sizes are whole numbers of elements: a fit is exact or wrong


class ProbeError(AdvisorError):
    """A probe that cannot run or whose measurement cannot be attributed; one line."""


@dataclass(frozen=True)
class Dims:
    """One probe config: the layer's dimensions and the batch (b sequences of s tokens)."""

    d_model: int
    d_ff: int
    heads: int
    kv_heads: int
    d_head: int
    vocab: int
    s: int
    b: int = 2

    @property
    def tokens(self) -> int:
        return self.b * self.s

    def values(self) -> dict[str, float]:
        return {"d_model": self.d_model, "d_ff": self.d_ff, "q_dim": self.heads * self.d_head,
                "kv_dim": self.kv_heads * self.d_head, "heads": self.heads, "d_head": self.d_head, "constant": 1,
                "scores": self.heads * self.s, "mask": self.s, "vocab": self.vocab}


# Three configs with pairwise-distinct dimensions that vary independently (checked by check_configs); where the
# family ties q_dim to d_model (d_head = d_model / heads), TIED_CONFIGS keep every other dimension independent.
FREE_CONFIGS = (Dims(96, 176, 6, 2, 20, 136, 64), Dims(112, 240, 4, 2, 36, 152, 48), Dims(90, 208, 10, 5, 12, 168, 80))
TIED_CONFIGS = (Dims(96, 176, 6, 2, 16, 136, 64), Dims(112, 240, 4, 2, 28, 152, 48), Dims(88, 208, 8, 4, 11, 168, 80))


def check_configs(configs: tuple[Dims, ...], terms: tuple[str, ...]) -> None:
    """Each config's terms are pairwise distinct and no two terms are proportional across the configs, so a
    one-term fit names one term."""
    if len(configs) < 3:
        raise ProbeError(f"the probe needs three configs or more to solve fused tensors, got {len(configs)}")
    vals = {t: np.array([c.values()[t] for c in configs], dtype=float) for t in terms}
    for c in configs:
        v = [c.values()[t] for t in terms if t != "constant"]
        if len(set(v)) != len(v):
            raise ProbeError(f"probe config {c} has two equal dimensions among {terms}: attribution would be ambiguous")
    for a, b in combinations(terms, 2):
        r = vals[a] / vals[b]
        if np.allclose(r, r[0], rtol=TOL):
            raise ProbeError(f"probe configs keep {a} proportional to {b}: vary them independently")


def _nice(c: float) -> bool:
    """A coefficient a tensor can have: a multiple of 1/8 (shapes are whole multiples of a dimension, or a
    dimension shared by the b = 2 sequences of a batch)."""
    return c > TOL and abs(c * 8 - round(c * 8)) < 1e-6 * max(1.0, c)


def attribute(sizes: list[float], configs: tuple[Dims, ...], terms: tuple[str, ...] = TERMS) -> dict[str, float]:
    """The linear form {term: elements per token per unit of the term} that reproduces ``sizes`` (elements per
    token, one per config) on every config: one term if one fits, else two; {PER_LAYER: elements per layer on the
    first config} where the tensor does not grow with the tokens; a ProbeError where nothing fits."""
    e = np.asarray(sizes, dtype=float)
    if np.all(e == 0):
        return {}
    vals = {t: np.array([c.values()[t] for c in configs], dtype=float) for t in terms}
    fit = _fit(e, vals)
    if fit is not None:
        return fit
    # a per-layer tensor (a weight read by an element-wise op, a bias gradient, a scalar): its size over the tokens
    # is one dimension or a product of two
    tokens = np.array([c.tokens for c in configs], dtype=float)
    dims = [t for t in terms if t in FORM_TERMS]
    per_layer = {**vals, **{f"{a}*{b}": vals[a] * vals[b] for a, b in combinations(dims, 2)}}
    if np.all(e < 1.0) or _fit(e * tokens, per_layer, pairs=False) is not None:
        return {PER_LAYER: float(e[0] * tokens[0])}
    raise ProbeError(f"a tensor of {', '.join(f'{x:g}' for x in e)} elements per token on the probe configs is no "
                     f"sum of one or two of {', '.join(terms)}")


def _fit(e: np.ndarray, vals: dict[str, np.ndarray], pairs: bool = True) -> dict[str, float] | None:
    """The first one-term fit of ``e`` over ``vals`` (in their order), else the first two-term fit."""
    for t, v in vals.items():
        c = e[0] / v[0]
        if _nice(c) and np.allclose(c * v, e, rtol=TOL, atol=TOL):
            return {t: float(c)}
    for a, b in combinations(vals, 2) if pairs else ():
        m = np.stack([vals[a], vals[b]], axis=1)
        try:
            coef = np.linalg.solve(m[:2], e[:2])
        except np.linalg.LinAlgError:
            continue
        if _nice(coef[0]) and _nice(coef[1]) and np.allclose(m @ coef, e, rtol=TOL, atol=TOL):
            return {a: float(coef[0]), b: float(coef[1])}
    return None


def add_form(total: dict[str, float], form: dict[str, float], scale: float) -> None:
    """total += form x scale (bytes per element), in place."""
    for t, c in form.items():
        total[t] = total.get(t, 0.0) + c * scale


def rounded(form: dict[str, float], digits: int = 2) -> dict[str, float]:
    """A form with its coefficients rounded and its zero terms dropped, in FORM_TERMS order."""
    out = {t: round(form[t], digits) for t in TERMS if abs(form.get(t, 0.0)) > 1e-9}
    return {t: (int(v) if float(v).is_integer() else v) for t, v in out.items()}
