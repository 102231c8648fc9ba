"""What a training stack's selective recomputation reruns (its profile's ``engine.selective``, advisor.engine): the
linear layers by name, the attention core and the layer's pointwise ops, and the sub-modules Megatron's
--recompute-modules may name instead."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, Field

from advisor.spec import Spec

# besides the layer table's linear layers, by name; "attention/k" is the key projection's share of attention/qkv, for
# a stack whose blocks run wq, wk and wv apart (advisor.recompute.selected)
RECOMPUTED = ("attention/core", "elementwise", "attention/k", "norms", "mlp/act", "attention/latent")
# every linear layer's name advisor.model.build gives a layer (tests/test_stacks.py checks the catalogue against it): a
# profile's selective policy naming anything else is a typo, refused at load rather than silently rerunning nothing
_MLP = ("gate", "up", "down", "fc", "proj")
LINEAR_NAMES = (("attention/qkv", "attention/out", "attention/q", "attention/q_a", "attention/q_b", "attention/kv_a",
                 "attention/kv_b", "mlp/router", "mlp/shared_gate")
                + tuple(f"{p}/{n}" for p in ("mlp", "mlp/experts", "mlp/shared") for n in _MLP))


def _known_ops(names: list[str]) -> list[str]:
    """A profile's op names, each a linear layer's (LINEAR_NAMES) or one of RECOMPUTED (one line otherwise)."""
    bad = [n for n in names if n not in LINEAR_NAMES and n not in RECOMPUTED]
    if bad:
        raise ValueError(f"unknown op {', '.join(map(repr, bad))}: use a linear layer's name "
                         f"({', '.join(LINEAR_NAMES)}) or one of {', '.join(RECOMPUTED)}")
    return names

def _linear_ops(names: list[str]) -> list[str]:
    """A profile's linear layers by name (LINEAR_NAMES; one line otherwise)."""
    bad = [n for n in names if n not in LINEAR_NAMES]
    if bad:
        raise ValueError(f"unknown linear {', '.join(map(repr, bad))}: use one of {', '.join(LINEAR_NAMES)}")
    return names


def recomputable(linears: tuple) -> set[str]:
    """The op names a selective policy can rerun in a layer of these linears: theirs and RECOMPUTED."""
    return {lin.name for lin in linears} | set(RECOMPUTED)


class RecomputeModule(Spec):
    """One sub-module a selective policy may rerun (Megatron's --recompute-modules): the ops rerun (names as
    ``Selective.recomputes``; "norms" is the layer's norms, "mlp/act" its MLP activation, "attention/latent" MLA's own
    element-wise kernels (the stack's kernels.latent), each costed by the bytes it moves) and the activations it stops
    keeping, in elements per token by width: d_model and MLA's latents (q and kv latent widths together; both split
    under sequence parallelism), q_dim and kv_dim (split over TP), d_ff (a dense MLP layer's width) and routed_d_ff
    (k x the routed experts' width), kept at the activation dtype."""

    recomputes: Annotated[list[str], AfterValidator(_known_ops)] = Field(default_factory=list)
    frees: dict[Literal["d_model", "q_dim", "kv_dim", "d_ff", "routed_d_ff", "latents"],
                Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]] = Field(default_factory=dict)
    needs: Optional[Literal["routed", "latent", "dense"]] = None  # the layer it applies to (else refused)
    source: Optional[str] = None


class Selective(Spec):
    """What the stack's selective recomputation reruns in backward: linear layers of the layer table by name
    (advisor.model.layer: attention/qkv, attention/out, mlp/fc, mlp/proj, mlp/gate, mlp/up, mlp/down), the
    attention core, and "elementwise" (every pointwise op of the layer's forward)."""

    recomputes: Annotated[list[str], AfterValidator(_known_ops)] = Field(min_length=1)
    # torchtitan's per-op SAC (distributed/activation_checkpoint.py SelectiveAC): the linear layers are not listed but
    # counted in forward order, and every second one rerun; the grouped GEMMs of routed experts (torch._grouped_mm,
    # not in its save list) always rerun, uncounted; so do the linears named in ``force_recompute`` (its
    # force_recompute_mm_shapes_by_fqns), uncounted
    every_second_linear: bool = False
    force_recompute: Annotated[list[str], AfterValidator(_linear_ops)] = Field(default_factory=list)
    # what an MoE layer keeps of its routed path (advisor.parallel.expert routed_saved): everything, where the policy
    # reruns none of it (Megatron's core attention), or only what the all-to-alls delivered, where it reruns the rest
    # and saves communication outputs (torchtitan's SelectiveAC)
    routed: Literal["kept", "exchanged"] = "kept"
    # what the core attention's checkpoint keeps of its inputs: q, k and v as the saved tables count them ("tensors"),
    # or ("fused_views") the value as a view of the fused qkv projection's output, which the saved view keeps whole,
    # beside the query and key where they were made anew (advisor.memory checkpointed_qkv_kept)
    core_inputs: Literal["tensors", "fused_views"] = "tensors"
    # --recompute-modules: the sub-modules it may rerun instead of its default policy (``recomputes``, keeping what the
    # profile's selective table says)
    modules: dict[str, RecomputeModule] = Field(default_factory=dict)
    source: Optional[str] = None

    def ops(self, linears: tuple, modules: Optional[tuple[str, ...]] = None) -> tuple[str, ...]:
        """What it reruns in a layer of these linears (advisor.model.layer.Linear, in forward order): with
        ``modules`` (--recompute-modules) the ops of each that the layer has, else its own policy."""
        if modules is not None:
            has = recomputable(linears)
            return tuple(dict.fromkeys(op for m in modules for op in self.modules[m].recomputes if op in has))
        if not self.every_second_linear:
            return tuple(self.recomputes)
        out, count = list(self.recomputes), 0
        for lin in linears:
            if lin.copies > 1 or lin.name in self.force_recompute:
                out.append(lin.name)
                continue
            count += 1
            if count % 2 == 0:
                out.append(lin.name)
        return tuple(dict.fromkeys(out))
