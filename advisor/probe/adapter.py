"""What a stack's probe adapter says: which library it builds from, which model families and precisions the stack
trains, which checkpointing policies it offers, how to build a small model of a family in that precision with a
policy applied, and how tensor parallelism divides each measured tensor (advisor.stack's rule, which cannot be
measured at TP = 1).

An adapter imports its library (and torch) only inside ``build``; this module imports neither.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from advisor.probe.measure import Tensor
from advisor.probe.solve import FREE_CONFIGS, TIED_CONFIGS, Dims, ProbeError

POLICIES = ("none", "full", "selective")


@dataclass
class Case:
    """A built model: ``forward()`` runs its forward and loss in the stack's precision and returns the loss;
    ``backward_context`` (if any) is entered around the backward (CUDA emulation for recomputed forwards)."""

    model: Any
    forward: Callable[[], Any]
    tokens: int
    backward_context: Optional[Callable[[], Any]] = None


@dataclass(frozen=True)
class Family:
    """A model family the adapter builds: its MLP and whether its attention ties q_dim to d_model."""

    module: str  # the module probed, as the source names it
    mlp: str  # gelu | swiglu
    tied_q: bool = False  # d_head = d_model / heads (GPT-2, MPT): q_dim is d_model
    tied_kv: bool = False  # no grouped-query attention: kv_dim is q_dim


class Adapter:
    """Base of the per-stack adapters (advisor/probe/adapters/)."""

    stack = ""  # the stack profile it measures (stack_profiles/<stack>.yaml)
    library = ""  # the pip distribution whose code is built
    pip = ""  # how to install it
    families: dict[str, Family] = {}
    default_family = ""
    modes: tuple[str, ...] = ("mixed",)  # advisor.training.Mode values the stack trains in
    attentions: tuple[str, ...] = ("sdpa",)
    policies: tuple[str, ...] = ("none", "full")
    host_mode = "mixed"  # the mode whose aten ops are counted for kernels.host
    host_emulated = True  # count the host's ops with the CUDA emulation on (hf-trainer's shipped counts had it off)
    layer_pattern = r"\.layers\.(\d+)(?:\.|$)"
    head_modules: tuple[str, ...] = ("lm_head", "output")  # outside the layers, but the logits' and loss's
    row_parallel: tuple[str, ...] = ()  # linear layers whose output is a partial sum under TP (row parallel)
    split_note = ("tensor-parallel split not measurable at TP = 1: d_model-sized tensors (residual stream, norms) "
                  "are `sequence`, a row-parallel linear's output `whole`, column-parallel outputs and heads `split` "
                  "(advisor/stack.py)")
    emulation = ""  # what the probe changes to see on CPU what CUDA would do
    compile_note = ""  # how the stack applies torch.compile (empty: the probe does not compile; advisor.probe.compiled)
    compiled_families: tuple[str, ...] = ()  # the families probed compiled (empty: every family)

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.library)
        except importlib.metadata.PackageNotFoundError:
            raise ProbeError(f"stack {self.stack} is probed on {self.library}, which is not installed: "
                             f"{self.pip}") from None

    def configs(self, family: str) -> tuple[Dims, ...]:
        f = self.families[family]
        base = TIED_CONFIGS if f.tied_q else FREE_CONFIGS
        if f.tied_kv:
            base = tuple(Dims(d.d_model, d.d_ff, d.heads, d.heads, d.d_head, d.vocab, d.s, d.b) for d in base)
        return base

    def terms(self, family: str) -> tuple[str, ...]:
        """The dimensions the family's configs vary independently (solve.check_configs)."""
        f = self.families[family]
        skip = ({"q_dim"} if f.tied_q else set()) | ({"kv_dim"} if f.tied_kv else set())
        return tuple(t for t in ("d_model", "d_ff", "q_dim", "kv_dim", "heads", "d_head", "constant") if t not in skip)

    def close(self) -> None:
        """Undo what building the stack's code set up in this process (a process group, environment): nothing here."""

    def build(self, family: str, dims: Dims, n_layers: int, mode: str, attention: str, policy: str,
              emulate: bool = True) -> Case:
        raise NotImplementedError

    def compiled_block(self, family: str, dims: Dims, mode: str, attention: str, policy: str) -> tuple[Callable, tuple]:
        """One block as the stack compiles it, under a checkpointing policy: the function torch.compile is given and
        its arguments (the activations first, each one requiring grad)."""
        raise ProbeError(f"stack {self.stack}: the probe does not compile its blocks")

    def compiled_loss(self, dims: Dims, mode: str) -> tuple[Callable, tuple]:
        """The loss as the stack compiles it in a precision mode: the function and its arguments (logits [b, s, vocab]
        requiring grad first, in the dtype the mode's LM head makes them)."""
        raise ProbeError(f"stack {self.stack}: the probe does not compile its loss")

    def layer_of(self, module: str) -> Optional[int]:
        m = re.search(self.layer_pattern, module)
        return int(m.group(1)) if m else None

    def is_head(self, module: str) -> bool:
        """The LM head and loss (and the root module, where a model computes its loss): left to memory.logits."""
        parts = module.split(".")
        return len(parts) <= 1 or any(h in parts for h in self.head_modules)

    def split(self, tensor: Tensor, term: str, policy: str) -> str:
        """split | sequence | whole for one term of one tensor of the layer (advisor.stack's rule)."""
        last = tensor.made_in.split(".")[-1] if tensor.made_in else ""
        if term == "d_model":
            # eager autograd (and per-op checkpointing) keep a row-parallel GEMM's own output, the partial sum before
            # its reduction; torch.compile's partitioner never recomputes a collective, so it keeps the reduced shard
            partial = last in self.row_parallel and tensor.op in ("mm", "addmm", "linear", "bmm") and not tensor.compiled
            return "whole" if partial else "sequence"
        if term == "constant":
            return "sequence" if "norm" in tensor.module.split(".")[-1].lower() else "whole"
        return "split"

    def source(self, family: str, compiled: bool = False) -> str:
        """Where a probe's numbers come from; compiled, without the eager emulation (the graphs are Inductor's)."""
        if compiled:
            return f"advisor probe: {self.library} {self.version()} {self.families[family].module}, CPU; {self.compile_note}"
        return f"advisor probe: {self.library} {self.version()} {self.families[family].module}, CPU{self.emulation}"
