"""One training step of a small model on CPU, watched three ways (torch, imported lazily):

- what autograd saves for backward: ``torch.autograd.graph.saved_tensors_hooks``, storages deduplicated, parameters
  and tensors made only from parameters (autocast's weight casts) left out, each attributed to the module that
  saved it;
- what is alive at the end of the forward (the loss computed): every storage an aten op created during the forward,
  attributed to the module that created it, kept where it is still alive then. This is what checkpointing keeps
  (a checkpointed block's inputs, selective checkpointing's cache), which saved-tensor hooks do not see;
- every aten op the forward and the backward issue (a TorchDispatchMode), with the module running it
  (torch.distributed._tools.mod_tracker.ModTracker, forward and backward) and the bytes of its tensors.

Sizes are kept per tensor as elements per token (advisor.probe.solve attributes them to dimensions). What cannot
be seen on CPU (kernel times, NCCL) is not measured here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# ops that move no data (views, allocations, metadata) and the kernels costed apart (GEMMs, attention, embedding,
# the loss): the element-wise traffic leaves them out, as validation/probes/traffic_probe.py does
VIEWS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "slice", "select", "split", "split_with_sizes",
         "unsqueeze", "squeeze", "alias", "detach", "as_strided", "reshape", "unbind", "chunk", "narrow", "lift_fresh",
         "_reshape_alias", "diagonal", "expand_as", "view_as", "empty", "empty_like", "empty_strided", "new_empty",
         "new_empty_strided", "zeros", "ones", "arange", "scalar_tensor", "_to_copy_noop", "set_", "resize_",
         "view_as_real", "view_as_complex", "_unsafe_split", "unflatten", "flatten", "_local_scalar_dense",
         "is_same_size", "_conj", "conj"}
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
         "_scaled_dot_product_efficient_attention_backward", "scaled_dot_product_attention",
         "_scaled_dot_product_attention_math", "embedding", "embedding_dense_backward", "nll_loss_forward",
         "nll_loss_backward", "_log_softmax", "_log_softmax_backward_data", "nll_loss2d_forward", "nll_loss2d_backward"}


@dataclass
class Tensor:
    """One tensor: elements per token, bytes per element, where it was made or saved, and by which op."""

    per_token: float
    itemsize: int
    module: str
    op: str = ""
    made_in: str = ""  # the module whose op created it (saved tensors)
    compiled: bool = False  # saved by torch.compile's partitioner (advisor.probe.compiled), not by eager autograd
    output: bool = False  # the last sizeable tensor its module made: the module's output (advisor.probe.core.outputs)


@dataclass
class Op:
    name: str
    module: str
    backward: bool
    tensors: list[Tensor]  # the bytes it moves (inputs, and outputs unless in place); empty where it moves none
    counted: bool  # element-wise work (not a view, GEMM, attention kernel, or a cast of a weight or its gradient)


@dataclass
class Step:
    """What one forward and backward did."""

    tokens: int
    saved: list[Tensor] = field(default_factory=list)
    alive: list[Tensor] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)


def _tensors(x: Any) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


def _key(t) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


class _LiveKeys:
    """Storage keys (_key) of tensors still alive. A key alone outlives its tensor: the allocator hands a freed
    address to the next tensor of the same size, which would then count as the freed one (a weight's cast taken for
    an activation made the probe's counts depend on where the allocator put things)."""

    def __init__(self, tensors=()):
        self._refs: dict = {}
        for t in tensors:
            self.add(t)

    def add(self, t) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        self._refs[_key(t)] = StorageWeakRef(t.untyped_storage())

    def __contains__(self, k) -> bool:
        ref = self._refs.get(k)
        return ref is not None and not ref.expired()


def _innermost(tracker) -> str:
    """The deepest module running (ModTracker's parents hold every enclosing module's name)."""
    names = [p for p in tracker.parents if p != "Global"]
    return max(names, key=lambda n: n.count(".")) if names else ""


def _weight_grad_cast(node) -> bool:
    """A backward node whose only inputs' gradients go to parameters: the backward of autocast's weight cast."""
    nexts = [f for f, _ in node.next_functions if f is not None] if node is not None else []
    return bool(nexts) and all(f.name().endswith("AccumulateGrad") for f in nexts)


def _watcher(step: Step, tracker, from_weights: "_LiveKeys", made: list, producer: dict, nodes: dict):
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            ins, outs = _tensors(args) + _tensors(kwargs or {}), _tensors(out)
            module, bw = _innermost(tracker), tracker.is_bw
            node = torch._C._current_autograd_node() if bw else None
            if not bw:  # the autograd node this op made (numbered before the op runs) ran in this module
                nodes.setdefault(torch._C._autograd._get_sequence_nr() - 1, module)
            elif node is not None:  # ModTracker's backward scopes overlap across residual connections: the node's
                module = nodes.get(node._sequence_nr(), module)  # forward module is the precise attribution
            weight_only = bool(ins) and all(_key(t) in from_weights for t in ins)
            if weight_only and not bw:
                for t in outs:
                    from_weights.add(t)
            counted = name not in VIEWS and name not in GEMMS and not weight_only and not _weight_grad_cast(node)
            moved = ins if name.endswith("_") else ins + outs
            step.ops.append(Op(name, module, bw, [Tensor(t.numel() / step.tokens, t.element_size(), module, name)
                                                  for t in moved] if counted else [], counted))
            if not bw:
                seen = {_key(t) for t in ins}
                for t in outs:
                    k = _key(t)
                    if k not in from_weights and k not in seen:
                        seen.add(k)
                        producer[k] = (module, name)
                        made.append((StorageWeakRef(t.untyped_storage()), k[1], module, name))
            return out

    return Watch()


def run_step(model, forward: Callable[[], Any], tokens: int, backward_context: Callable[[], Any] | None = None) -> Step:
    """Run ``forward()`` (the model's forward and its loss, in the stack's precision) and the loss's backward on
    ``model``, watching both (module docstring)."""
    import contextlib
    import gc

    import torch
    from torch.distributed._tools.mod_tracker import ModTracker

    step = Step(tokens)
    from_weights = _LiveKeys(list(model.parameters()) + list(model.buffers()))
    made: list = []
    producer: dict = {}
    saved: dict = {}

    def pack(t):
        k = _key(t)
        if k not in from_weights and k not in saved and t.untyped_storage().nbytes() > 0:
            made_in, op = producer.get(k, ("", ""))
            saved[k] = Tensor(k[1] / tokens, 1, _innermost(tracker), op, made_in)
        return t

    with ModTracker() as tracker:
        watch = _watcher(step, tracker, from_weights, made, producer, {})
        # A tensor only a reference cycle holds is freed whenever the collector next runs, which depends on what the
        # process allocated before (megatron-core's checkpointed layers counted 1 or 2 tensors by test order): no
        # collection during the forward, then one of the youngest generation, which holds every object it made, so
        # that what is alive at its end is what the model holds
        enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), watch:
                loss = forward()
            gc.collect(0)
        finally:
            if enabled:
                gc.enable()
        step.saved = list(saved.values())
        alive = {ref.cdata: Tensor(nbytes / tokens, 1, module, op, module)
                 for ref, nbytes, module, op in reversed(made) if not ref.expired()}
        step.alive = list(reversed(alive.values()))
        with watch, (backward_context() if backward_context else contextlib.nullcontext()):
            _backward(loss)
    return step


def _backward(loss) -> None:
    """The autograd engine called directly: torch.autograd.backward would pass through (and pop) a torch-function
    mode around it, which a recomputed forward needs (validation/probes/activation_probe.py does the same)."""
    import torch

    torch.autograd.graph._engine_run_backward((loss,), (torch.ones_like(loss),), False, False, (),
                                              allow_unreachable=True, accumulate_grad=True)


def count_ops(model, forward: Callable[[], Any]) -> tuple[int, int]:
    """Every aten op one forward (with its loss) and its backward issue, views included (the host issues them all):
    the count validation/probes/host_overhead.py takes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    with Count() as f:
        loss = forward()
    with Count() as b:
        _backward(loss)
    return f.n, b.n
