"""Pipeline parallelism: the layers split into pp stages, micro-batches flowing through them.

- Stages: the even split gives each rank ceil(L / pp) layers, and the busiest is costed as also holding the
  word embedding (the first stage) and the LM head (the last), V x h parameters, and the learned positions. Where
  pp (x v) does not divide L, Megatron's layouts leave the last rank fewer (``last_stage_layers``): the first rank
  (its layers and the embedding) and the last (its layers and the head) are then each costed whole, their layers'
  collectives in, and the slower sets the step (``two_ranks``; advisor.step). Stacks that balance the split their
  own way (torchtitan: the extra layers first; DeepSpeed's PipelineModule: by parameters; nanotron: by cost) keep the
  bound of the busiest rank holding ceil(L / pp) layers, the head and the embedding. The
  uneven split (``PipelineSplit.edges``) counts the embedding and the loss as one layer each (Megatron-Core
  0.16.1 transformer_block.py get_num_layers_to_build: (L + 2) / pp units per rank, one layer fewer on the
  first and on the last rank; torchtitan 0.3.0 pipeline_parallel.py generate_llm_fqn_per_model_part with
  input_weight = output_weight = 1; Llama 3 405B's 126 layers on 16 stages, Dubey et al. 2024 s.3.3.2): the
  busiest rank is then a middle one (u = (L + 2) / pp layers) or the last (u - 1 layers and the head),
  whichever takes longer; for memory, the first (u - 1 layers and the embedding) or a middle one.
- Schedules (Narayanan et al. 2021, arXiv 2104.04473, s.2.2): GPipe runs every forward, then every backward;
  1F1B alternates once the pipeline is full; interleaved 1F1B gives each rank v chunks of L / (pp v) layers, or,
  where pp x v does not divide L and the stack places layers by a layout (engine.pipeline_splits ``layout``:
  Megatron's --pipeline-model-parallel-layout), chunks of ceil(L / (pp v)) with the rest in the last, as
  Megatron-Bridge's DeepSeek-V3 and Kimi-K2 recipes write it (``layout_fills``: no chunk left empty).
  The bubble is (pp - 1) / v times the time of one micro-batch on a stage; with uneven stages, fill and drain
  pass through the other stages' layers: (L / layers_busiest - 1) / v times the busiest stage's layers (a
  pipeline of stage times t_i and m micro-batches takes sum(t_i) + (m - 1) max(t_i): ``schedule_time``).
  Fill and drain pass through the other stages, which hold layers only: the last stage's logits and loss are paid once per micro-batch, not
  (pp - 1) / v more times (a pipeline with stage times t_i takes sum(t_i) + (m - 1) max(t_i); the paper's
  (p - 1) / m bubble assumes equal t_i).
- Zero-bubble schedules split each backward into B (input gradients) and W (weight gradients) and fill the
  bubble with W; with F the forward, B = W = half the backward (the two GEMMs of a linear layer's backward
  do equal work) plus the recomputation in B:
  ZB-H1 (Qi et al. 2023, arXiv 2401.10241, s.3.1 and Table 2): bubble (p - 1)(F + B - W), peak memory as 1F1B.
  ZB-V (ibid. s.6, ScheduleZBVZeroBubble): two chunks per rank in a V, each of F, B, W halved; the paper gives it
  ZB-H2's bubble, (p - 1)(F + B - 2W), 0 where F = B = W, which no schedule reaches (rank p - 1 starts (p - 1) F of
  a chunk late with a rank's whole work to do). Costed as torch 2.13 runs it: its action lists replayed, each rank in
  order, each action waiting on the one it needs (advisor.parallel.v_replay): (p - 1)(F + B - W) of a chunk where
  F = B = W, more where the passes differ; peak memory as 1F1B.
  DualPipeV (DeepSeek-V3 report, Liu et al. 2024, arXiv 2412.19437, Table 2; torch ScheduleDualPipeV, the
  "cut-in-half" DualPipe on pp ranks with 2 chunks each, i.e. DualPipe with PP = 2 pp): the report's bubble,
  (PP/2 - 1)(F&B + B - 3W) of chunk times, overlaps each pair of a forward and a backward; torch runs the pair one
  after the other and sends after both (no stack here registers an overlapping OVERLAP_F_B function), and its
  action lists replayed likewise (advisor.parallel.v_replay) idle 2 (p - 1) F of a chunk where F = B = W;
  activations of pp + 1 micro-batches of a rank (Table 2's PP + 1), parameters once (the V's halves).
  DualPipeV needs at least 2 x pp micro-batches (torch's ScheduleDualPipeV: as many as stages). ZB-V runs on fewer:
  torch's ScheduleZBVZeroBubble blanks the actions of the micro-batches it lacks, which the replay runs as torch does.
- Send/recv: each micro-batch sends its activation forward and its gradient back at every stage boundary, v
  times under interleaving. Megatron's scatter/gather optimisation (s.4.1; --scatter-gather-tensors-in-
  pipeline, on by default; the stack's ``pipeline_scatter_gather``): each TP rank sends 1/tp of the activation
  over its own link and the receiving stage all-gathers it on the intra-node link. Under sequence parallelism
  the activation is already split. A boundary leaves NVLink once a stage fills an NVLink domain (a node, or a rack).
- Tied embeddings: the first stage's embedding and the last's head are then one V x h table held twice, and each
  step the two end stages all-reduce its gradient (``tied_sync_time``; megatron-core 0.16.1 distributed/
  finalize_model_grads.py _allreduce_embedding_grads over the embedding group, after the data-parallel reduction;
  DeepSpeed's pipeline schedule ReduceTiedGrads, before it; nanotron's sync_tied_weights_gradients): exposed
  either way, every TP and data-parallel rank beside its counterpart. A V schedule's rank 0 holds both ends:
  nothing to sync, and untied, both tables (``params_outside_layers``). torchtitan 0.2 builds each stage from a deep
  copy of the model, so each end keeps its own copy untied (no sync; distributed/pipeline_parallel.py
  pipeline_module_split), and a V schedule's rank 0 both copies; 0.3 refuses the plan.
- In flight (Korthikanti et al. 2022, s.4.2.3): GPipe keeps all m micro-batches of its L/p layers, 1F1B
  min(p, m), interleaved 1F1B p micro-batches times (1 + (p - 1) / (p v)), never more than m; the first stage holds
  the most, and the last, costed apart, its own chunks as Megatron schedules them (advisor.parallel.in_flight).

Only ZeRO-1 combines with a pipeline (seed 001: ZeRO-2/3 would reduce-scatter and gather per micro-batch;
DeepSpeed's pipeline engine refuses them).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from advisor import comm
from advisor.candidates import Candidates, Mesh, members_per_node
from advisor.comm import Collective
from advisor.layout import PipelineSplit, Schedule
from advisor.model import ModelSpec
from advisor.parallel import v_replay
from advisor.workload import Workload


ZB_H1, ZB_V, DUALPIPE_V = Schedule.zb_h1.code, Schedule.zb_v.code, Schedule.dualpipe_v.code
EDGES = PipelineSplit.edges.code


def violations(c: Candidates, model: ModelSpec) -> dict[str, Any]:
    interleaved = c.schedule == Schedule.interleaved.code
    two = (c.schedule == ZB_V) | (c.schedule == DUALPIPE_V)
    layers = model.n_layers
    edges = (c.pp_split == EDGES) & (c.pp > 1)
    chunks = np.where(interleaved, c.virtual_stages, v_chunks(c.schedule))
    units = layers + np.where(edges, 2, 0)  # the embedding and the loss count as layers in the uneven split
    # layout-level reasons first: the search checks them once per layout and counts its rows under them
    return {
        "pp > number of layers": c.pp > layers,
        "uneven split needs pp > 1, layers that pp does not divide, and layers + 2 divisible by pp": (
            c.pp_split == EDGES) & ((c.pp == 1) | (((layers + 2) % c.pp) != 0) | ((layers % c.pp) == 0)),
        "ZeRO-2/3 with pipeline parallelism (only --zero 1 combines with PP; where a stack runs FSDP under a pipeline, "
        "that is its --zero 1)": (c.pp > 1) & (c.zero >= 2),
        "interleaved schedule needs pp > 1, 2 or more virtual stages and a layer in every chunk": interleaved & (
            (c.pp == 1) | (c.virtual_stages < 2) | (~edges & ~layout_fills(layers, c.pp * c.virtual_stages))),
        "interleaved schedule needs the micro-batch count divisible by pp": interleaved & (c.pp > 1) & ((c.grad_accum % c.pp) != 0),
        "ZB-V and DualPipeV need pp > 1 and layers divisible by 2 x pp": two & ((c.pp == 1) | ((units % (2 * c.pp)) != 0)),
        # torch 2.13's ScheduleDualPipeV raises under 2 x pp (pipelining/schedules.py:3439-3443); ScheduleZBVZeroBubble
        # trims its warm-up instead (:3385-3394), costed by bubble_time
        "DualPipeV needs 2 x pp micro-batches (torch's ScheduleDualPipeV: as many as stages)": (
            (c.schedule == DUALPIPE_V) & (c.pp > 1) & (c.grad_accum < 2 * c.pp)),
        "uneven split needs layers + 2 (embedding, loss) divisible by pp x chunks": (c.pp_split == EDGES) & (c.pp > 1) & (
            (units % np.maximum(c.pp * chunks, 1)) != 0),
    }


def v_chunks(schedule: Any) -> Any:
    """Model chunks (pipeline stages) a rank holds on a schedule not interleaved: two on the V schedules, else one."""
    return np.where(np.isin(schedule, (ZB_V, DUALPIPE_V)), 2, 1)


def too_few_micro_batches(plan: Any, micro_batch: int, grad_accum: int, stack: str) -> str:
    """constraints.stage_micro_batches' reason with the plan's figures and the smallest fix."""
    stages = plan.pp * int(v_chunks(plan.schedule.code))
    return (f"{stack}'s {plan.schedule.value} schedule runs {grad_accum} micro-batch{'es' if grad_accum > 1 else ''} "
            f"a step on {stages} pipeline stages (pp={plan.pp}), where torch.distributed.pipelining needs at least "
            f"{stages}: set --grad-accum {stages} or more (--global-batch {micro_batch * plan.dp * stages}), "
            "or lower --pp")


def layout_fills(n_layers: int, chunks: Any) -> Any:
    """Whether chunks of ceil(L / chunks) layers, the rest in the last, leave no chunk empty (the layout Megatron-Bridge
    writes where pp x v does not divide L; every chunk of an even division)."""
    chunks = np.maximum(np.asarray(chunks, dtype=float), 1.0)
    return (chunks - 1.0) * np.ceil(n_layers / chunks) < n_layers


def layers_per_stage(model: ModelSpec, pp: Any, v: Any = 1.0) -> Any:
    """Layers of the busiest rank under the even split: v chunks of ceil(L / (pp v)) (v = 1: ceil(L / pp))."""
    return np.ceil(model.n_layers / (pp * v)) * v


def params_outside_layers(model: ModelSpec, pp: Any, schedule: Any = None, copies: bool = False) -> Any:
    """Parameters of the busiest stage outside its layers: all of them without a pipeline or on a V schedule's rank
    0 (``schedule``: the plans' schedule codes; ``copies``: the stack keeps a tied table as two untied copies, one
    a stage, which that rank then holds both of), else one V x h table (the first stage's embedding or the last's LM
    head) and the learned positions."""
    v_shape = np.isin(schedule, (ZB_V, DUALPIPE_V)) if schedule is not None else False
    both = model.embedding_params + (model.vocab * model.d_model if copies and model.tied_embeddings else 0)
    return np.where((pp > 1) & ~v_shape, model.vocab * model.d_model + model.position_params, both)


def tied_sync_time(w: Workload, c: Candidates, mesh: Mesh, reduce_bytes: Any) -> Any:
    """Seconds of a step's all-reduce of a tied V x h table's gradient (its TP share, ``reduce_bytes`` a parameter)
    between the first and the last stage (module docstring), which sit (pp - 1) stages of tp x dp ranks apart."""
    on, size, per_node = tied_sync(w, c, mesh, reduce_bytes)
    return comm.collective_time(Collective.all_reduce, 2.0, size, w.hw, per_node, where=on)


def tied_sync(w: Workload, c: Candidates, mesh: Mesh, reduce_bytes: Any) -> tuple[Any, Any, Any]:
    """(where the end stages sync a tied table's gradient, or the embedding copy's MTP depths look up on the last stage
    (megatron-core 0.19.2 distributed/finalize_model_grads.py:146, advisor.mtp), its bytes, the pair's GPUs per node)."""
    shared = w.model.tied_embeddings or w.mtp_layers > 0
    tied = shared and w.stack.engine.tied_pipeline == "all_reduce" and not w.finetune.adapters
    on = (mesh.pp > 1) & ~np.isin(c.schedule, (ZB_V, DUALPIPE_V)) & tied
    # one node where the whole pipeline fits in it; else in nodes (pp - 1) x tp x dp ranks apart
    apart, g = np.maximum(mesh.pp - 1.0, 1.0) * mesh.tp * mesh.dp, w.hw.gpus_per_node
    per_node = np.where(mesh.pp * mesh.tp * mesh.dp <= g, 2.0, members_per_node(g, np.maximum(apart, g), 2.0))
    return on, w.model.vocab * w.model.d_model / mesh.tp * np.asarray(reduce_bytes, dtype=float), per_node


def uneven(c: Candidates) -> Any:
    """Where the layers are split unevenly (the embedding and the loss counted as layers)."""
    return (np.asarray(c.pp_split) == EDGES) & (np.asarray(c.pp) > 1)


def stage_layers(model: ModelSpec, c: Candidates, mesh: Mesh, layer_s: Any, head_s: Any,
                 rank: Optional[str] = None, mtp: int = 0) -> tuple[Any, Any, Any]:
    """``_stage_layers``, with the ``mtp`` multi-token prediction layers on the rank holding the head (advisor.mtp:
    megatron-core builds every depth on the last stage, multi_token_prediction.py mtp_on_this_rank)."""
    layers, head, embedding = _stage_layers(model, c, mesh, layer_s, head_s, rank)
    return (layers + mtp * np.asarray(head, dtype=float) if mtp else layers), head, embedding


def _stage_layers(model: ModelSpec, c: Candidates, mesh: Mesh, layer_s: Any, head_s: Any,
                  rank: Optional[str] = None) -> tuple[Any, Any, Any]:
    """(layers of the busiest rank, 1.0 where its time also holds the head, 1.0 where it holds the word embedding),
    from one layer's and the head's seconds per micro-batch. Even split: ceil(L / pp) layers, the head and the
    embedding (a bound: no rank holds both but a V schedule's first, or the only one), or, where the split leaves
    the last rank fewer (``two_ranks``), the ``rank`` asked: the "first" (those layers and the embedding) or the
    "last" (``last_stage_layers`` and the head), each costed whole by the step and the slower taken. Uneven: a middle
    rank's u = (L + 2) / pp layers, or the last rank's u - 1 and the head, whichever is longer (module docstring)."""
    even = layers_per_stage(model, mesh.pp, mesh.v)
    edges, units = uneven(c), (model.n_layers + 2.0) / mesh.pp
    if rank == "first":  # the uneven split's middle rank (its first, with the embedding, where pp is 2); the even
        # split's first, or a middle one where --decoder-first-pipeline-num-layers leaves the first fewer
        first = np.asarray(mesh.pp) <= 2
        f, _, fits = _first_last(float(model.n_layers), np.asarray(mesh.pp, dtype=float))
        middle = np.where(edges, ~first, fits & (f < np.ceil(model.n_layers / mesh.pp)) & (np.asarray(mesh.v) <= 1))
        return np.where(edges, units - np.where(first, 1.0, 0.0), even), 0.0, np.where(middle, 0.0, 1.0)
    if rank == "last":
        return np.where(edges, units - 1.0, last_stage_layers(model.n_layers, mesh.pp, mesh.v)), 1.0, 0.0
    if not np.any(edges):
        return even, 1.0, 1.0
    last_busier = (units - 1.0) * layer_s + head_s > units * layer_s
    head = np.where(edges & ~last_busier, 0.0, 1.0)
    return np.where(edges, units - head, even), head, head  # the middle rank neither, the last as the even split


def two_ranks(model: ModelSpec, c: Candidates, layout: bool = True, mtp: int = 0) -> Any:
    """Where the even split leaves the last pipeline rank fewer layers than the first (pp x v does not divide L; a V
    schedule's rank 0 holds both ends, and pp x 2 divides L there) as Megatron lays them out (``layout``: the stack
    runs Megatron's layouts), and under the uneven split (a middle rank's u layers, the last's u - 1 and the head):
    which of the two is the busiest depends on the head and on each layer's collectives, so the step costs both
    (advisor.step); and wherever the last rank holds ``mtp`` > 0 multi-token prediction layers beside the head."""
    pp, v = np.asarray(c.pp, dtype=float), np.where(c.schedule == Schedule.interleaved.code, c.virtual_stages, 1)
    v_shape = (c.schedule == ZB_V) | (c.schedule == DUALPIPE_V)
    short = last_stage_layers(model.n_layers, pp, v) < layers_per_stage(model, pp, v)
    # where the stack balances the even split its own way, the bound (module docstring); the uneven split is one
    return (pp > 1) & ~v_shape & (uneven(c) | ((short | (mtp > 0)) & layout))


def last_stage_layers(n_layers: int, pp: Any, v: Any = 1.0) -> Any:
    """Layers of the last pipeline rank under the even split where pp x v does not divide L, as Megatron is given it
    (advisor.export.megatron): interleaved, v chunks of c = ceil(L / (pp v)), the last chunk holding the rest
    (``layout_fills``); without interleaving, ceil(L / pp) on the middle ranks and the rest over the first and the
    last, the last no larger (--decoder-first/last-pipeline-num-layers) where that fits, else ceil(L / pp) on the
    first ranks and one fewer on the rest."""
    pp, v, n = np.asarray(pp, dtype=float), np.maximum(np.asarray(v, dtype=float), 1.0), float(n_layers)
    c = np.ceil(n / (pp * v))
    interleaved = v * c - (pp * v * c - n)
    _, last, fits = _first_last(n, pp)
    one = np.where(fits, last, np.ceil(n / pp) - 1.0)
    return np.where(n % (pp * v) == 0, n / pp, np.where(v > 1, interleaved, one))


def _first_last(n: float, pp: Any) -> tuple[Any, Any, Any]:
    """(first, last, whether they fit): the first and last ranks' layers with ceil(L / pp) on each middle one, the
    last no larger than the first, the first no larger than the middle (megatron-core 0.16.1 transformer_config.py:
    --decoder-first/last-pipeline-num-layers, as advisor.export.megatron writes them)."""
    per = np.ceil(n / pp)
    rest = n - per * (pp - 2.0)
    first, last = np.where(pp == 2, per, rest - np.floor(rest / 2.0)), np.where(pp == 2, n - per, np.floor(rest / 2.0))
    return first, last, (last >= 1) & (last <= first) & (first <= per)


def memory_layers(model: ModelSpec, c: Candidates, mesh: Mesh, mtp: int = 0) -> Any:
    """Layers whose weights count on the busiest rank by memory: the even split's ceil(L / pp); the uneven
    split's u - 1 common to the first and the middle ranks (``outside_params_uneven`` adds the larger of the
    first's embedding and a middle rank's u-th layer); without a pipeline, the ``mtp`` multi-token prediction layers too."""
    edges = uneven(c)
    even = layers_per_stage(model, mesh.pp, mesh.v) + np.where(np.asarray(mesh.pp) <= 1, float(mtp), 0.0)
    return np.where(edges, (model.n_layers + 2.0) / mesh.pp - 1.0, even) if np.any(edges) else even


def stage_counts(n_layers: int, pp: int, split: str = "even") -> list[int]:
    """The layers of each pipeline rank, as Megatron builds them (a hand count for tests and the explanation)."""
    if split == "edges":
        u = (n_layers + 2) // pp
        return [u - 1] + [u] * (pp - 2) + [u - 1] if pp > 1 else [n_layers]
    per = -(-n_layers // pp)
    return [min(per, max(n_layers - per * i, 0)) for i in range(pp)]


def schedule_time(stage_s: list[float], m: int) -> tuple[float, float]:
    """(step, bubble) of a 1F1B/GPipe pipeline of stage times ``stage_s`` (forward + backward of one micro-batch)
    over m micro-batches: the first micro-batch passes every stage, the rest follow at the slowest stage's pace,
    step = sum(t_i) + (m - 1) max(t_i); the bubble is the step beyond the work of the average stage, m x mean(t_i),
    so it holds both the fill and drain and the stages' imbalance."""
    total, slowest = float(sum(stage_s)), float(max(stage_s))
    step = total + (m - 1) * slowest
    return step, step - m * total / len(stage_s)


def p2p_time(w: Workload, c: Candidates, mesh: Mesh, act_bytes: Any) -> Any:
    """Seconds of stage-to-stage sends and receives per micro-batch (module docstring)."""
    on = mesh.pp > 1
    sp = np.asarray(c.sp, dtype=bool)
    scatter = w.stack.engine.pipeline_scatter_gather & (mesh.tp > 1)
    size = act_bytes / np.where(scatter | sp, mesh.tp, 1.0)
    regather = comm.collective_time(Collective.all_gather, mesh.tp, act_bytes, w.hw, mesh.tp_per_node,
                                    where=on & scatter & ~sp)
    out = np.zeros(np.shape(on))
    if on.any():
        size, crosses = np.broadcast_to(size, np.shape(on))[on], np.broadcast_to(mesh.stage_crosses_domains, np.shape(on))[on]
        out[on] = 2.0 * mesh.v[on] * (comm.p2p_time(size, w.hw, crosses) + regather[on])
    return out


def fill(gpu_s: Any, host_s: Any, p2p_s: Any, first_cast_s: Any) -> tuple[Any, Any]:
    """(one micro-batch through the busiest rank's layers, the longer of its GPU work and the host's issuing, plus its
    send/recv; what the step's first micro-batch adds to it, the one the pipeline's fill passes: ``first_cast_s``, its
    weight casts beyond a micro-batch's share, on the GPU side, which a host-bound body's time does not hide)."""
    body = np.maximum(gpu_s, host_s) + p2p_s
    return body, np.maximum(gpu_s + first_cast_s, host_s) + p2p_s - body


def bubble_time(model: ModelSpec, c: Candidates, mesh: Mesh, layers: Any, body_s: Any, fwd_s: Any, bwd_s: Any,
                recompute_s: Any, first_cast_s: Any = 0.0) -> Any:
    """Seconds of bubble per step. ``body_s``: one micro-batch through the busiest rank's layers (with their
    collectives and send/recv); ``fwd_s``, ``bwd_s``, ``recompute_s``: its layers' compute, which the zero-bubble
    schedules split into F, B = recompute + backward / 2 and W = backward / 2 (module docstring); ``first_cast_s``: what
    the first micro-batch's forward adds to the body there where the weights are quantised once a step and the body
    holds a micro-batch's share of it (Transformer Engine's is_first_microbatch: every stage the fill passes casts in
    full before it sends the first micro-batch on, however many follow)."""
    # fill and drain pass through the other ranks' layers, L - layers of them: pp - 1 busiest stages where pp divides
    # the layers, fewer where the other ranks hold fewer (the uneven split's ends, a short last rank)
    others = model.n_layers / np.maximum(layers, 1.0) - 1.0
    classic = np.where(mesh.pp > 1, others / mesh.v, 0.0) * (body_s + first_cast_s)
    sched = np.asarray(c.schedule)
    zb = (sched == ZB_H1) | (sched == ZB_V) | (sched == DUALPIPE_V)
    if not np.any(zb & (mesh.pp > 1)):
        return classic
    on = np.nonzero(np.broadcast_to(zb & (mesh.pp > 1), np.shape(classic)))[0]  # only the zero-bubble rows

    def at(x: Any) -> Any:
        return np.broadcast_to(x, np.shape(classic))[on]

    work = np.maximum(at(fwd_s) + at(bwd_s) + at(recompute_s), 1e-30)
    scale = at(body_s) / work  # the body's collectives and send/recv stretch F, B and W alike
    f, b, w_ = at(fwd_s) * scale + at(first_cast_s), (at(recompute_s) + 0.5 * at(bwd_s)) * scale, 0.5 * at(bwd_s) * scale
    pp, s_on = at(mesh.pp), at(sched)
    h1 = (pp - 1.0) * np.maximum(f + b - w_, 0.0)  # ZB-H1: (p - 1)(F + B - W)
    v = _v_replayed(pp, at(c.grad_accum), s_on, f - at(first_cast_s), b, w_, at(first_cast_s))
    out = np.array(classic, dtype=float, copy=True)
    out[on] = np.where(s_on == ZB_H1, h1, v)
    return out


def _v_replayed(pp: Any, m: Any, sched: Any, f: Any, b: Any, w_: Any, first: Any) -> Any:
    """ZB-V's and DualPipeV's idle as torch runs them, replayed from their action lists (advisor.parallel.v_replay)
    with a chunk's F, B, W and first cast, half the rank's. Beyond 2 x pp micro-batches the steady state adds none
    (the replay idles alike for every count from 2 pp on: tests/test_v_replay.py), so 2 pp stands for more."""
    out = np.zeros(np.shape(f))
    n_eff = np.minimum(m, 2 * pp).astype(int)
    v = (sched == ZB_V) | (sched == DUALPIPE_V)
    for p, n, s in {(int(p), int(n), int(s)) for p, n, s in zip(pp[v], n_eff[v], sched[v])}:
        rows = v & (pp == p) & (n_eff == n) & (sched == s)
        out[rows] = v_replay.idle(p, n, f[rows] / 2.0, b[rows] / 2.0, w_[rows] / 2.0, first[rows] / 2.0,
                                  v_replay.ZBV if s == ZB_V else v_replay.DUALPIPEV)
    return out
