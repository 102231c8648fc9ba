"""advisor probe: a stack's small models run on CPU under each checkpointing policy the stack offers, on three
configs with pairwise-distinct dimensions, and what they did turned into the measured part of a stack profile
(advisor.stack): memory.saved (bytes per token of one layer under no, full and selective recomputation, and outside
the layers, as linear forms in the layer's dimensions), kernels.host and host_outside_layers (aten ops per layer
and outside, forward and backward), kernels.elementwise (bytes per token the layer's element-wise ops move) and,
under eager attention, kernels.attention_scores.

One layer is layer 1 of a 3-layer model (its input is a layer's output and its output a layer's input, as in a
deep model); aten ops per layer are a 2-layer model's less a 1-layer model's, the rest is outside the layers
(validation/probes/host_overhead.py's differencing). What a layer keeps is what it made that is alive at the
forward's end (measure.py): what autograd saved, what a checkpoint holds, and what the model returns (a KV cache);
where that differs from what autograd saves (saved-tensor hooks), the probe says so. The logits and the loss's
buffers are left to memory.logits; tensors that do not grow with the tokens (weights read by element-wise ops,
bias gradients, scalars) to nobody, counted in the notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from advisor.probe.adapter import Adapter
from advisor.probe.measure import Step, Tensor, count_ops, run_step
from advisor.probe.solve import PER_LAYER, ProbeError, add_form, attribute, check_configs, rounded

CATEGORIES = ("split", "sequence", "whole")


@dataclass
class Forms:
    """Bytes per token by TP category, scores (bytes per head per key) and masks (bytes per s x s element)."""

    by: dict[str, dict[str, float]] = field(default_factory=lambda: {c: {} for c in CATEGORIES})
    scores: float = 0.0
    mask: float = 0.0
    per_layer_bytes_left: float = 0.0  # tensors that do not grow with the tokens, left out (first config)
    per_layer_tensors: int = 0
    what: str = ""

    def note(self) -> list[str]:
        if not self.per_layer_tensors:
            return []
        return [f"{self.what}: {self.per_layer_tensors} tensors that do not grow with the tokens (weights read by "
                f"element-wise ops, bias gradients, scalars) left out, {self.per_layer_bytes_left:.0f} B per layer on "
                f"the first config"]

    def per_layer_bytes(self) -> dict:
        out = {c: rounded(self.by[c]) for c in CATEGORIES if rounded(self.by[c])}
        if self.scores:
            out["scores"] = round(self.scores, 2)
        return out

    def merged(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for c in CATEGORIES:
            add_form(total, self.by[c], 1.0)
        return rounded(total)


@dataclass
class Probed:
    """One stack's probe: the profile entries it measured, and what it could not measure."""

    stack: str
    source: str
    host: list[dict] = field(default_factory=list)
    host_outside_layers: list[dict] = field(default_factory=list)
    elementwise: list[dict] = field(default_factory=list)
    attention_scores: list[dict] = field(default_factory=list)
    saved: list[dict] = field(default_factory=list)
    loss: list[dict] = field(default_factory=list)
    logits: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _forms(adapter: Adapter, lists: list[list[Tensor]], configs, terms, policy: str, what: str) -> Forms:
    """Aligned tensors (one list per config, same order) attributed to dimensions and summed in bytes."""
    if len({len(x) for x in lists}) != 1:
        raise ProbeError(f"{adapter.stack}: {what} differs in structure between probe configs "
                         f"({', '.join(str(len(x)) for x in lists)} tensors): the code path depends on the dimensions")
    out = Forms(what=what)
    for items in zip(*lists):
        if len({x.op for x in items}) > 1:
            raise ProbeError(f"{adapter.stack}: {what} runs other ops on other probe configs "
                             f"({', '.join(x.op for x in items)})")
        t = items[0]
        form = attribute([x.per_token for x in items], configs, terms + ("scores", "mask", "vocab"))
        for term, c in form.items():
            if term == PER_LAYER:
                out.per_layer_bytes_left += c * t.itemsize
                out.per_layer_tensors += 1
            elif term == "scores":
                out.scores += c * t.itemsize
            elif term == "mask":
                out.mask += c * t.itemsize
            elif term != "vocab":
                add_form(out.by[adapter.split(t, term, policy)], {term: c}, t.itemsize)
    return out


def _layer(adapter: Adapter, tensors: list[Tensor], attr: str = "module") -> list[Tensor]:
    return outputs([t for t in tensors if adapter.layer_of(getattr(t, attr)) == 1])


# a module's statistics (a norm's rstd: 4 bytes a token) are made beside or after its output; its output is the last
# tensor it made that is larger than this many bytes a token
STATISTICS_BYTES = 8.0


def outputs(tensors: list[Tensor]) -> list[Tensor]:
    """The tensors (in the order they were made) with each module's output marked: the last tensor the module made
    of more than STATISTICS_BYTES a token (a composite norm makes fp32 copies before its output)."""
    last = {t.made_in: i for i, t in enumerate(tensors) if t.made_in and t.per_token > STATISTICS_BYTES}
    return [replace(t, output=True) if last.get(t.made_in) == i else t for i, t in enumerate(tensors)]


def _outside(adapter: Adapter, tensors: list[Tensor]) -> list[Tensor]:
    return [t for t in tensors if adapter.layer_of(t.made_in) is None and not adapter.is_head(t.made_in)]


def _steps(adapter: Adapter, family: str, mode: str, attention: str, policy: str) -> list[Step]:
    import torch

    steps = []
    for dims in adapter.configs(family):
        torch.manual_seed(0)
        case = adapter.build(family, dims, 3, mode, attention, policy)
        steps.append(run_step(case.model, case.forward, case.tokens, case.backward_context))
    return steps


def _saved_entry(adapter: Adapter, family: str, mode: str, attention: str, source: str, probed: Probed) -> None:
    configs, terms = adapter.configs(family), adapter.terms(family)
    entry: dict = {"mode": mode, "attention": attention, "mlp": adapter.families[family].mlp}
    for policy in adapter.policies:
        steps = _steps(adapter, family, mode, attention, policy)
        kept = _forms(adapter, [_layer(adapter, s.alive, "made_in") for s in steps], configs, terms, policy,
                      f"{mode} {attention} {policy} recomputation")
        entry[{"none": "layer", "full": "full_recompute", "selective": "selective"}[policy]] = kept.per_layer_bytes()
        if policy != "none":
            continue
        saved = _forms(adapter, [_layer(adapter, s.saved) for s in steps], configs, terms, policy, "saved")
        if saved.merged() != kept.merged() or saved.scores != kept.scores:
            probed.notes.append(f"{mode} {attention}: one layer keeps {kept.merged()} bytes per token alive at the "
                                f"forward's end, of which autograd saves {saved.merged()} (the rest: outputs the "
                                f"model returns, such as a KV cache)")
        outside = _forms(adapter, [_outside(adapter, s.alive) for s in steps], configs, terms, policy, "outside")
        fw, bw = ([[t for op in s.ops if op.backward is phase and adapter.layer_of(op.module) == 1 for t in op.tensors]
                   for s in steps] for phase in (False, True))
        tf, tb = (_forms(adapter, x, configs, terms, policy, f"{mode} {attention} {d} traffic")
                  for x, d in ((fw, "forward"), (bw, "backward")))
        _traffic(adapter, family, mode, attention, source, probed, tf, tb)
        probed.notes += kept.note() + outside.note() + tf.note() + tb.note()
    entry["outside_layers"] = outside.merged()
    if outside.mask:
        entry["attention_mask"] = round(outside.mask, 2)
    entry["source"] = source
    probed.saved.append(entry)


def _traffic(adapter, family, mode, attention, source, probed: Probed, fw: Forms, bw: Forms) -> None:
    mlp = adapter.families[family].mlp
    if attention == "eager":
        probed.attention_scores.append({"mode": mode, "mlp": mlp, "forward": round(fw.scores, 2),
                                        "backward": round(bw.scores, 2), "source": source})
        return
    fwd, bwd = (f.per_layer_bytes() for f in (fw, bw))
    fwd.pop("scores", None), bwd.pop("scores", None)
    probed.elementwise.append({"mode": mode, "mlp": mlp, "forward": fwd, "backward": bwd, "source": source})


def _compiled_entry(adapter: Adapter, family: str, mode: str, attention: str, source: str, probed: Probed) -> None:
    """The stack's torch.compile of one block (advisor.probe.compiled): what it saves under each policy, the bytes
    its fused kernels move and the kernels it launches, as compiled entries beside the eager ones."""
    import torch

    from advisor.probe import compiled

    configs, terms, mlp = adapter.configs(family), adapter.terms(family), adapter.families[family].mlp
    src = f"{adapter.source(family, compiled=True)}: the block's graphs as Inductor gets them (advisor.probe.compiled)"
    entry = {"mode": mode, "attention": attention, "mlp": mlp, "compile": "compiled"}
    for policy in adapter.policies:
        runs = []
        for dims in configs:
            torch.manual_seed(0)
            fn, args = adapter.compiled_block(family, dims, mode, attention, policy)
            runs.append((compiled.compile_graphs(fn, args), dims.tokens, args[:1]))
        kept = _forms(adapter, [outputs(compiled.saved(g, n, x)) for g, n, x in runs], configs, terms, policy,
                      f"compiled {mode} {attention} {policy} saves")
        entry[{"none": "layer", "full": "full_recompute", "selective": "selective"}[policy]] = kept.per_layer_bytes()
        if policy != "none":
            continue
        # (bytes moved, kernels launched) of each config's forward and backward, read once
        flows = [(compiled.traffic(g.forward, n), compiled.traffic(g.backward, n)) for g, n, _ in runs]
        tf, tb = (_forms(adapter, [f[i][0] for f in flows], configs, terms, policy,
                         f"compiled {mode} {attention} {d} traffic") for i, d in ((0, "forward"), (1, "backward")))
        probed.elementwise.append({"mode": mode, "mlp": mlp, "compile": "compiled", "forward": tf.per_layer_bytes(),
                                   "backward": tb.per_layer_bytes(), "source": src})
        (_, fw_launches), (_, bw_launches) = flows[0]
        probed.host.append({"mode": mode, "attention": attention, "mlp": mlp, "compile": "compiled",
                            "forward_ops": fw_launches, "backward_ops": bw_launches, "source": src})
        probed.notes += tf.note() + tb.note()
    eager = next(e for e in probed.saved if e["mode"] == mode and e["attention"] == attention)
    entry["outside_layers"] = eager["outside_layers"]  # the embedding and the final norm run eager
    probed.saved.append(entry | {"source": src})


def _compiled_loss(adapter: Adapter, family: str, mode: str, probed: Probed) -> None:
    """The stack's compiled loss, per logit: bytes its kernels move forward and backward, what it keeps for the
    backward (held) and that plus what its backward writes (peak). Per-row buffers (a few bytes per token, against
    2 x vocab for the logits) are left out, as the eager loss tables leave them."""
    import torch

    from advisor.probe import compiled

    per: list[tuple[float, ...]] = []
    for dims in adapter.configs(family):
        torch.manual_seed(0)
        fn, args = adapter.compiled_loss(dims, mode)
        n = dims.tokens * dims.vocab
        g = compiled.compile_graphs(fn, args)
        (fk, _), (bk, _) = compiled.kernels(g.forward, n), compiled.kernels(g.backward, n)

        def logit_sized(ts):  # exactly one element a logit or more: not a per-row statistic
            return sum(t.per_token for t in ts if t.per_token >= 1)

        held = logit_sized(compiled.saved(g, n, args[:1]))
        per.append((sum(logit_sized(k.reads + k.writes) for k in fk), sum(logit_sized(k.reads + k.writes) for k in bk),
                    held, held + sum(logit_sized(k.writes) for k in bk)))
    if len(set(per)) != 1:
        raise ProbeError(f"{adapter.stack}: the compiled loss moves other bytes per logit on other configs: {per}")
    fw, bw, held, peak = per[0]
    src = f"{adapter.source(family, compiled=True)}: the loss's graphs (advisor.probe.compiled)"
    probed.loss.append({"mode": mode, "compile": "compiled", "forward": fw, "backward": bw, "source": src})
    probed.logits.append({"mode": mode, "compile": "compiled", "held": held, "peak": peak, "source": src})


def _host(adapter: Adapter, family: str, attention: str, source: str, probed: Probed) -> None:
    import torch

    dims = adapter.configs(family)[0]
    counts = {}
    for n in (1, 2):
        torch.manual_seed(0)
        case = adapter.build(family, dims, n, adapter.host_mode, attention, "none", emulate=adapter.host_emulated)
        counts[n] = count_ops(case.model, case.forward)
    fw, bw = counts[2][0] - counts[1][0], counts[2][1] - counts[1][1]
    mlp = adapter.families[family].mlp
    probed.host.append({"attention": attention, "mlp": mlp, "forward_ops": fw, "backward_ops": bw, "source": source})
    # eager attention builds its mask outside the layers (GPT-2: 49 ops forward, 26 under SDPA): an entry per kernel
    # where both are probed, as the first entry that matches is taken (advisor.stack.Entry)
    which = {"attention": attention} if len(adapter.attentions) > 1 else {}
    probed.host_outside_layers.append({**which, "mlp": mlp, "forward_ops": counts[1][0] - fw,
                                       "backward_ops": counts[1][1] - bw, "source": source})


def probe(adapter: Adapter, family: str | None = None) -> Probed:
    """Run the adapter's probe for one model family (default: the stack's) over its modes and attention kernels."""
    family = family or adapter.default_family
    if family not in adapter.families:
        raise ProbeError(f"stack {adapter.stack} has no probe for model family {family!r}; it has "
                         f"{', '.join(sorted(adapter.families))}")
    check_configs(adapter.configs(family), adapter.terms(family))
    source = adapter.source(family)
    probed = Probed(adapter.stack, source)
    compiles = bool(adapter.compile_note) and family in (adapter.compiled_families or adapter.families)
    try:
        for attention in adapter.attentions:
            _host(adapter, family, attention, source, probed)
            for mode in adapter.modes:
                _saved_entry(adapter, family, mode, attention, source, probed)
                if compiles and attention == "sdpa":  # the element-wise tables are SDPA's
                    _compiled_entry(adapter, family, mode, attention, source, probed)
        for mode in adapter.modes if compiles else ():
            _compiled_loss(adapter, family, mode, probed)
    finally:
        adapter.close()
    probed.notes = sorted(set(probed.notes))
    return probed
