"""Pipeline parallelism: the layers split into pp stages, micro-batches flowing through them.

- Stages: each holds ceil(L / pp) layers; the busiest also holds the word embedding (the first stage) or the
  LM head (the last), V x h parameters, and the learned positions.
- Schedules (Narayanan et al. 2021, arXiv 2104.04473, s.2.2): GPipe runs every forward, then every backward;
  1F1B alternates once the pipeline is full; interleaved 1F1B gives each rank v chunks of L / (pp v) layers.
  The bubble is (pp - 1) / v times the time of one micro-batch on a stage. Fill and drain pass through the
  other stages, which hold layers only: the last stage's logits and loss are paid once per micro-batch, not
  (pp - 1) / v more times (a pipeline with stage times t_i takes sum(t_i) + (m - 1) max(t_i); the paper's
  (p - 1) / m bubble assumes equal t_i).
- Send/recv: each micro-batch sends its activation forward and its gradient back at every stage boundary, v
  times under interleaving. Megatron's scatter/gather optimisation (s.4.1; --scatter-gather-tensors-in-
  pipeline, on by default; the stack's ``pipeline_scatter_gather``): each TP rank sends 1/tp of the activation
  over its own link and the receiving stage all-gathers it on the intra-node link. Under sequence parallelism
  the activation is already split. A boundary leaves NVLink once a stage fills an NVLink domain (a node, or a rack).
- In flight (Korthikanti et al. 2022, s.4.2.3): GPipe keeps all m micro-batches of its L/p layers, 1F1B
  min(p, m), interleaved 1F1B p micro-batches times (1 + (p - 1) / (p v)); the first stage holds the most.

Only ZeRO-1 combines with a pipeline (seed 001: ZeRO-2/3 would reduce-scatter and gather per micro-batch;
DeepSpeed's pipeline engine refuses them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor import comm
from advisor.candidates import Candidates, Mesh
from advisor.comm import Collective
from advisor.layout import Schedule
from advisor.model import ModelSpec
from advisor.workload import Workload


def violations(c: Candidates, model: ModelSpec) -> dict[str, Any]:
    interleaved = c.schedule == Schedule.interleaved.code
    layers = model.n_layers
    return {
        "pp > number of layers": c.pp > layers,
        "ZeRO-2/3 with pipeline parallelism (only ZeRO-1 combines with PP)": (c.pp > 1) & (c.zero >= 2),
        "interleaved schedule needs pp > 1 and layers divisible by pp x virtual stages": interleaved & (
            (c.pp == 1) | ((layers % np.maximum(c.pp * c.virtual_stages, 1)) != 0) | (c.virtual_stages < 2)),
        "interleaved schedule needs the micro-batch count divisible by pp": interleaved & (c.pp > 1) & ((c.grad_accum % c.pp) != 0),
    }


def layers_per_stage(model: ModelSpec, pp: Any) -> Any:
    return np.ceil(model.n_layers / pp)


def params_outside_layers(model: ModelSpec, pp: Any) -> Any:
    """Parameters of the busiest stage outside its layers: all of them without a pipeline, else one V x h
    table (the first stage's embedding or the last's LM head) and the learned positions."""
    return np.where(pp > 1, model.vocab * model.d_model + model.position_params, model.embedding_params)


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


def bubble_fraction(mesh: Mesh) -> Any:
    """The pipeline bubble in micro-batches of one stage: (pp - 1) / v."""
    return np.where(mesh.pp > 1, (mesh.pp - 1.0) / mesh.v, 0.0)


def in_flight_layers(n_layers: int, pp: Any, v: Any, schedule: Any, grad_accum: Any) -> Any:
    """Layer-micro-batches of activations the busiest (first) pipeline stage holds at its peak."""
    pp = np.asarray(pp, dtype=float)
    m = np.asarray(grad_accum, dtype=float)
    v = np.asarray(v, dtype=float)
    per_stage = n_layers / pp
    gpipe = per_stage * m
    one_f = per_stage * np.minimum(pp, m)
    inter = per_stage * np.minimum(pp, m) * (1.0 + (pp - 1.0) / (pp * np.maximum(v, 1.0)))
    out = np.where(schedule == Schedule.gpipe.code, gpipe, np.where(schedule == Schedule.interleaved.code, inter, one_f))
    return np.where(pp <= 1, float(n_layers), out)
