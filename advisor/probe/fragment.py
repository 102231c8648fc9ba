"""A probe's result as the YAML fragment of a stack profile (kernels.host, host_outside_layers, elementwise,
attention_scores; memory.saved), each entry with its source, checked against advisor.stack's schema before it is
written; and the comparison of a probe with a shipped profile, on the layers of real models."""

from __future__ import annotations

import yaml

from advisor.model.layer import DecoderLayer
from advisor.probe.core import Probed
from advisor.stack import HeadOps, HostOps, LayerBytes, Logits, PerElement, PerLayerBytes, Saved, Stack, Traffic

# Host CPU time per op is not measured by the probe (it is this machine's, not a training node's): the fragment
# carries the shipped profile's figure (validation/probes/host_overhead.py, quiet runs) beside the probed op counts.


def fragment(probed: Probed, shipped: Stack | None = None) -> dict:
    """The measured part of a stack profile, validated entry by entry with advisor.stack's models."""
    host = []
    for h in probed.host:
        us = _shipped_us(shipped, h["attention"], h["mlp"])
        host.append(HostOps(**h, cpu_us_per_op=us).model_dump(exclude_none=True, exclude_defaults=False))
    kernels = {"host": host,
               "host_outside_layers": [HeadOps(**h).model_dump(exclude_none=True) for h in probed.host_outside_layers],
               "elementwise": [Traffic(**e).model_dump(exclude_none=True, exclude_defaults=True) | {"mode": e["mode"]}
                               for e in probed.elementwise]}
    if probed.attention_scores:
        kernels["attention_scores"] = [PerElement(**e).model_dump(exclude_none=True) for e in probed.attention_scores]
    if probed.loss:
        kernels["loss"] = [PerElement(**e).model_dump(exclude_none=True, exclude_defaults=True) for e in probed.loss]
    saved = [Saved(**s).model_dump(exclude_none=True, exclude_defaults=True) | {"mode": s["mode"]} for s in probed.saved]
    memory = {"saved": saved}
    if probed.logits:
        memory["logits"] = [Logits(**e).model_dump(exclude_none=True, exclude_defaults=True) for e in probed.logits]
    return {"kernels": kernels, "memory": memory}


def _shipped_us(shipped: Stack | None, attention: str, mlp: str) -> float:
    if shipped is not None:
        for h in shipped.kernels.host:
            if h.matches("mixed", attention, mlp) or h.matches("fp32", attention, mlp):
                return h.cpu_us_per_op
    return 0.0


def to_yaml(probed: Probed, shipped: Stack | None = None, split_note: str = "") -> str:
    """The fragment with the probe's notes as comments at its head."""
    lines = [f"# advisor probe --stack {probed.stack}: the measured part of a stack profile", f"# {probed.source}"]
    if split_note:
        lines.append(f"# {split_note}")
    lines += ["# cpu_us_per_op: not probed (the host's time per op is this CPU's): the shipped profile's figure"]
    lines += [f"# note: {n}" for n in probed.notes]
    body = yaml.safe_dump(_ordered(fragment(probed, shipped)), sort_keys=False, width=120, default_flow_style=None)
    return "\n".join(lines) + "\n" + body


def _ordered(frag: dict) -> dict:
    """Entries with their keys in the profiles' order: what they apply to first, the source last."""
    first = ("mode", "attention", "mlp", "compile")

    def order(e: dict) -> dict:
        if e.get("compile") == "eager":  # the default: a table is eager's unless it says otherwise
            e = {k: v for k, v in e.items() if k != "compile"}
        keys = [k for k in first if e.get(k, "any") != "any"] + [k for k in e if k not in first and k != "source"]
        return {k: _ints(e[k]) for k in keys + ["source"] if k in e}

    return {sec: {k: [order(e) for e in v] for k, v in body.items()} for sec, body in frag.items()}


def _ints(v):
    """Whole coefficients written as integers, as the shipped profiles have them."""
    if isinstance(v, dict):
        return {k: _ints(x) for k, x in v.items()}
    return int(v) if isinstance(v, float) and v.is_integer() else v


def saved_per_token(entry: dict, layer: DecoderLayer, which: str = "layer") -> float:
    """Bytes per token of one layer on one GPU at TP = 1 (every category counts), scores left out."""
    b = entry.get(which)
    if b is None:
        return 0.0
    v = LayerBytes.of(PerLayerBytes(**b), layer)
    return v.split + v.sequence + v.whole
