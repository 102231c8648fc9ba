"""torch.compile as a stack applies it, watched on CPU: the stack's block (or its loss) compiled by TorchDynamo and
AOTAutograd with Inductor's decompositions and its min-cut partitioner (``torch._inductor.compile_fx`` runs the same
three before generating code), and the forward and backward graphs they hand over read for what Inductor makes of
them on a GPU:

- **saved**: the forward graph's outputs beyond the block's own, which the backward graph takes: what the
  partitioner chose to keep (it recomputes cheap element-wise results from them), and under a checkpointing policy
  what that policy left (TorchDynamo traces torch.utils.checkpoint and its selective context into the graph);
- **kernels**: extern kernels (GEMMs, attention: aten calls in Inductor's output without max-autotune, so no
  epilogue fused into them), aten fallbacks (ops on complex numbers, for which Inductor generates no code:
  _inductor/lowering.py unsupported_input_tensor) and fused kernels. Pointwise and reduction nodes join along data
  edges unless a data path runs between them through an extern or fallback kernel (that would be a cycle), two
  reductions reduce to different sizes (a norm's per-row statistics, its weight gradient's sum over the rows), or
  their loops differ other than as pointwise work on a reduction's result. A pointwise value another kernel reads is
  recomputed there, not stored (Inductor inlines pointwise IR into its readers); reductions, indexed loads and the
  values extern kernels read or the graph returns are stored. Kernels that only share an input stay apart (Inductor's
  horizontal fusion would merge some: an upper bound on the traffic);
- **traffic**: each fused kernel reads every buffer it takes from outside once (the views of one buffer it reads
  at most that buffer) and writes every stored value that leaves it, in the graph's dtypes.

Everything else is what the eager probe does (advisor.probe.core): sizes per token on three configs, attributed
to the layer's dimensions. What a GPU would show and a CPU cannot (Inductor's realisation heuristics, Triton's
kernel times) is not measured here.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

from advisor.probe.measure import VIEWS, Tensor

# what a measured tensor of a compiled block is attributed to: its per-token constants are row statistics of its
# norms (rstd), which sequence parallelism divides as it divides the norms (advisor.probe.adapter.Adapter.split)
MODULE = "compiled block norm statistics"
# kernels Inductor leaves to aten (cuBLAS, FlashAttention, cuDNN): no element-wise work is fused into them
EXTERN = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "convolution", "_scaled_mm",
          "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
          "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
          "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
          "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"}
# besides the eager probe's views: those AOTAutograd's graphs show (views of complex numbers, getitem of a tuple)
FREE = VIEWS | {"getitem", "view_as_real", "view_as_complex"}


@dataclass
class Graphs:
    """What one compiled call handed to Inductor: the forward and backward graphs and how many outputs are the
    function's own (the rest of the forward's outputs are saved for the backward)."""

    forward: Any
    backward: Any
    outputs: int


@dataclass
class Kernel:
    """One fused kernel: its ops, and the bytes it reads and writes, one Tensor per buffer."""

    ops: list[str]
    reads: list[Tensor] = field(default_factory=list)
    writes: list[Tensor] = field(default_factory=list)


def _op(n) -> str:
    if n.target is operator.getitem:
        return "getitem"
    name = getattr(getattr(n.target, "_overloadpacket", None), "__name__", None)
    if name is None:
        name = getattr(n.target, "__name__", str(n.target))
        if name in RNG_WRAPPERS:  # the aten op it runs
            return next((_op_name(a) for a in n.args if _op_name(a)), name)
    return name


def _module(n) -> str:
    """The module whose forward made a node (TorchDynamo's nn_module_stack: "L['block'].attention_norm" ->
    "attention_norm"), as the eager probe names where a tensor was made; "" for graph inputs."""
    stack = n.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    return path.split("].", 1)[1] if "]." in path else ""


def _op_name(target) -> str:
    return getattr(getattr(target, "_overloadpacket", None), "__name__", "")


def _val(n):
    import torch

    v = n.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def _numel(n) -> int:
    v = _val(n)
    numel = v.numel() if v is not None else 0
    return numel if isinstance(numel, int) else 0


def _bytes(n) -> int:
    """A value's bytes; 0 for one whose size is symbolic (the CPU generator's state, which CUDA's philox keeps in
    two integers)."""
    v = _val(n)
    return _numel(n) * v.element_size() if v is not None else 0


def _loop(n) -> tuple[int, int]:
    """A fused node's loop: the elements it runs over (its largest tensor's), and for a reduction the elements it
    reduces them to (0 for pointwise work)."""
    sizes = [_numel(x) for x in [n] + n.all_input_nodes]
    if _op(n) in REDUCTIONS:
        return max(sizes), _numel(n)
    return max(sizes), 0


def _compatible(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Two loops Inductor can run as one kernel: reductions to the same size (a norm's statistics per row, not a
    weight gradient's sum over the rows), over the same elements or one being pointwise work on what the other
    reduces to (rsqrt of a mean)."""
    (big_a, red_a), (big_b, red_b) = a, b
    if red_a and red_b and red_a != red_b:
        return False
    if big_a == big_b:
        return True
    (_, red_big), (small, red_small) = (a, b) if big_a > big_b else (b, a)
    return not red_small and small == red_big


def _merged(a, b) -> tuple[int, int]:
    return max(a[0], b[0]), a[1] or b[1]


def compile_graphs(fn: Callable, args: tuple) -> Graphs:
    """``fn(*args)`` compiled as torch.compile(fullgraph=True) compiles it, up to the graphs Inductor would get;
    its first output's sum run backward through them."""
    import torch
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    got: dict = {}

    def keep(name):
        def compiler(gm, example_inputs):
            got[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())
    out = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)(*args)
    first = out[0] if isinstance(out, (tuple, list)) else out
    first.float().sum().backward()
    torch._dynamo.reset()
    return Graphs(got["forward"], got["backward"], len(out) if isinstance(out, (tuple, list)) else 1)


def saved(g: Graphs, tokens: int, inputs: tuple = ()) -> list[Tensor]:
    """The buffers the forward's outputs to the backward keep alive (a saved view keeps its whole buffer), bytes per
    token; parameters and buffers (graph inputs other than ``inputs``, the activations) left out, as the eager
    probe leaves weights out."""
    nodes = list(g.forward.graph.nodes)
    kind, base = _kinds(nodes)
    out_node = nodes[-1]
    shapes = {(tuple(t.shape), t.dtype) for t in inputs}
    seen, kept = set(), []
    for n in out_node.args[0][g.outputs:]:
        b = base.get(n, n)
        if _val(b) is None or b in seen or not _bytes(b):
            continue
        seen.add(b)
        if b.op == "placeholder" and (tuple(_val(b).shape), _val(b).dtype) not in shapes:
            continue
        made = _module(b)
        kept.append(Tensor(_bytes(b) / tokens, 1, made or MODULE, _op(b) if b.op != "placeholder" else "input", made,
                           compiled=True))
    return kept


# reductions: Inductor stores a reduction's result wherever another kernel reads it
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "prod", "argmax", "argmin", "any", "all",
              "logsumexp", "cumsum"}
# indexed loads (a label's logit): a reader recomputing one would load the few elements it picks, not its whole
# input; counted as stored (their outputs are a few bytes a row)
INDEXED = {"gather", "index", "index_select"}
# higher-order ops that run one aten op with the RNG state saved or restored (AOTAutograd wraps the attention's
# kernel in them under checkpointing): the op they run is what launches
RNG_WRAPPERS = {"run_and_save_rng_state", "run_with_rng_state"}


def _kinds(nodes) -> tuple[dict, dict]:
    """What each node is (input: a graph input or an extern kernel's output; extern; fallback: an op on complex
    numbers, for which Inductor generates no code and calls aten; view; fused) and the buffer it lives in."""
    kind, base = {}, {}
    for n in nodes:
        name, v = _op(n), _val(n)
        if n.op in ("placeholder", "get_attr"):
            kind[n], base[n] = "input", n
        elif n.op == "output":
            kind[n] = "output"
        elif name in EXTERN:
            kind[n], base[n] = "extern", n
        elif name == "getitem" and kind.get(n.args[0]) in ("extern", "fallback"):
            kind[n], base[n] = "input", n
        elif name in FREE:
            ins = n.all_input_nodes
            kind[n], base[n] = "view", (base[ins[0]] if ins else n)
        elif any(t is not None and t.is_complex() for t in [v] + [_val(p) for p in n.all_input_nodes]):
            kind[n], base[n] = "fallback", n  # lowering.py unsupported_input_tensor: "complex" -> aten fallback
        else:
            kind[n], base[n] = "fused", n
    return kind, base


def _groups(nodes, kind) -> list[list]:
    """Fused and view nodes joined along data edges where Inductor may fuse them (module docstring)."""
    barrier = {n: 1 << i for i, n in enumerate(n for n in nodes if kind[n] in ("extern", "fallback"))}
    up, down = {}, {}
    for n in nodes:  # the extern kernels upstream and downstream of each node, as bit sets
        up[n] = 0
        for p in n.all_input_nodes:
            up[n] |= up[p] | barrier.get(p, 0)
    for n in reversed(nodes):
        down[n] = 0
        for u in n.users:
            down[n] |= down[u] | barrier.get(u, 0)
    group = {n: n for n in nodes}
    loop = {n: _loop(n) for n in nodes if kind[n] == "fused"}

    def root(n):
        while group[n] is not n:
            group[n] = group[group[n]]
            n = group[n]
        return n

    def fuse(a, b) -> None:
        ra, rb = root(a), root(b)
        if ra is rb or (up[ra] | up[rb]) & (down[ra] | down[rb]):
            return
        la, lb = loop.get(ra), loop.get(rb)
        if la and lb and not _compatible(la, lb):
            return
        group[ra] = rb
        up[rb], down[rb] = up[ra] | up[rb], down[ra] | down[rb]
        if la or lb:
            loop[rb] = _merged(la, lb) if la and lb else (la or lb)

    for n in nodes:
        if kind[n] in ("fused", "view"):
            for p in n.all_input_nodes:
                if kind[p] in ("fused", "view"):
                    fuse(p, n)
    members: dict = {}
    for n in nodes:
        if kind[n] in ("fused", "view"):
            members.setdefault(root(n), []).append(n)
    return [g for g in members.values() if any(kind[m] == "fused" for m in g)]


def _stored(nodes, kind) -> set:
    """The fused nodes whose value Inductor stores: reductions (and indexed loads), and values an extern or fallback
    kernel or the graph's output takes (through views). Any other pointwise value another kernel reads is recomputed
    there from what it is made of (Inductor inlines pointwise IR into its readers: lowering's TensorBox, realized on
    reuse only when expensive)."""
    return {n for n in nodes if kind[n] == "fused" and (_op(n) in REDUCTIONS | INDEXED or any(
        kind[u] in ("extern", "fallback", "output") for u in _takers(n, kind)))}


def _takers(n, kind):
    """The nodes that read a value, through views of it."""
    for u in n.users:
        yield from (_takers(u, kind) if kind[u] == "view" else (u,))


def kernels(gm, tokens: int) -> tuple[list[Kernel], int]:
    """The graph's fused and fallback kernels (module docstring), and its number of extern kernels."""
    nodes = list(gm.graph.nodes)
    kind, base = _kinds(nodes)
    stored = _stored(nodes, kind)

    def sources(p, seen):  # the stored buffers a value not stored is recomputed from
        if p in seen:
            return
        seen.add(p)
        if kind[p] == "fused" and p not in stored:
            for q in p.all_input_nodes:
                yield from sources(q, seen)
        elif kind[p] == "view" and kind.get(base[p]) == "fused" and base[p] not in stored:
            yield from sources(base[p], seen)
        else:
            yield p

    groups = _groups(nodes, kind) + [[n] for n in nodes if kind[n] == "fallback"]
    reads = []
    for g in groups:
        inside, took = set(g), {}
        for m in g:
            for p in m.all_input_nodes:
                if p not in inside:
                    for q in sources(p, set()):
                        took.setdefault(base[q], set()).add(q)
        reads.append(took)
    # a stored value another kernel reads (through what that kernel recomputes) is written where it is made
    read_elsewhere = {q for took in reads for seen in took.values() for q in seen}
    out = []
    for g, took in zip(groups, reads):
        inside = set(g)
        writes = {m: {m} for m in g if (m in stored or kind[m] == "fallback")
                  and (m in read_elsewhere or any(u not in inside for u in _takers(m, kind)))}
        if not writes:
            continue  # every value recomputed where it is read: no kernel of its own
        k = Kernel([_op(m) for m in g if kind[m] != "view"])
        for buffers, into in ((took, k.reads), (writes, k.writes)):
            for b, seen in buffers.items():
                moved = sum(_bytes(v) for v in seen)
                moved = min(moved, _bytes(b)) if _bytes(b) else moved
                into.append(Tensor(moved / tokens, 1, MODULE, k.ops[0]))
        out.append(k)
    return out, sum(1 for n in nodes if kind[n] == "extern")


def traffic(gm, tokens: int) -> tuple[list[Tensor], int]:
    """Every buffer the graph's fused kernels read or write (bytes per token, in kernel order), and the number of
    kernels it launches (fused and extern)."""
    ks, extern = kernels(gm, tokens)
    return [t for k in ks for t in k.reads + k.writes], len(ks) + extern
