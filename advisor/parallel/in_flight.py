"""The activations a pipeline rank holds in flight: layer-micro-batches of saved activations at its peak under each
schedule (GPipe every micro-batch, 1F1B and the zero-bubble schedules pp of them, interleaved as megatron-core's
schedule table runs it, DualPipeV pp + 1), for the first rank (the busiest under an even split) and the last (its
own chunks, the MTP depths and the loss). advisor.memory and advisor.step multiply them by a layer's activations."""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.layout import PipelineSplit, Schedule

EDGES = PipelineSplit.edges.code
DUALPIPE_V = Schedule.dualpipe_v.code


def in_flight_layers(n_layers: int, pp: Any, v: Any, schedule: Any, grad_accum: Any, split: Any = None, mtp: int = 0) -> Any:
    """Layer-micro-batches of activations the busiest (first) pipeline stage holds at its peak. Under the uneven
    split the first rank holds u - 1 layers and the second u layers one micro-batch fewer: the larger of
    u - 1 and u (pp - 1) / pp stands for a stage. Without a pipeline, the ``mtp`` multi-token prediction layers too."""
    pp = np.asarray(pp, dtype=float)
    m = np.asarray(grad_accum, dtype=float)
    v = np.asarray(v, dtype=float)
    # the first rank's layers: L / pp, or v chunks of ceil(L / (pp v)) where an interleaved layout rounds them up
    per_stage = np.where(schedule == Schedule.interleaved.code, np.ceil(n_layers / (pp * np.maximum(v, 1.0))) * v,
                         n_layers / pp)
    if split is not None and np.any(np.asarray(split) == EDGES):
        units = (n_layers + 2.0) / pp
        per_stage = np.where((np.asarray(split) == EDGES) & (pp > 1),
                             np.maximum(units - 1.0, units * (pp - 1.0) / pp), per_stage)
    gpipe = per_stage * m
    one_f = per_stage * np.minimum(pp, m)
    # interleaved: rank 0 warms up 2 (pp - 1) + (v - 1) pp chunk-micro-batches and runs one more forward before its
    # first backward (schedules.py:937-938), pp v + pp - 1 chunks of L / (pp v) layers; all m v of them where m = pp
    # leaves every micro-batch in its warm-up (:949-951): never more than m micro-batches of its layers
    inter = per_stage * np.minimum(np.minimum(pp, m) * (1.0 + (pp - 1.0) / (pp * np.maximum(v, 1.0))), m)
    # ZB-H1 and ZB-V keep 1F1B's peak (Qi et al. 2023 s.3.1, s.6); DualPipeV pp + 1 micro-batches (DeepSeek-V3 Table 2)
    dual = per_stage * np.minimum(pp + 1.0, m)
    out = np.where(schedule == Schedule.gpipe.code, gpipe, np.where(schedule == Schedule.interleaved.code, inter, one_f))
    out = np.where(schedule == DUALPIPE_V, dual, out)
    return np.where(pp <= 1, float(n_layers + mtp), out)


def in_flight_last(layers: Any, pp: Any, v: Any, schedule: Any, grad_accum: Any, chunk: Any = None) -> tuple[Any, Any]:
    """(layer-micro-batches of activations the last pipeline rank holds at its peak, those beside its loss), from its
    ``layers`` (the MTP depths in, all in its last chunk) and ``chunk``, the layers of each of its other chunks (None:
    layers / v, all alike): 1F1B (and ZB-H1) one micro-batch; GPipe every one; interleaved, megatron-core 0.19.2
    pipeline_parallel/schedules.py: rank pp - 1 warms up (v - 1) pp chunk-micro-batches (:937-938), in groups of
    microbatch_group_size_per_vp_stage = pp (model_parallel_config.py:567-568) a chunk (get_schedule_table, :962-990),
    and runs backwards in the reverse chunk order (get_model_chunk_id, :1217-1222): at each of its losses it holds pp
    micro-batches of each of its first v - 1 chunks and one of its last; past the first pp, the steady state also
    holds pp of those and one of its first chunk in place of the last's, the larger where its last chunk (the rest of
    a layout, the uneven split's loss unit, the MTP depths) differs from the others."""
    pp, m, v = np.asarray(pp, dtype=float), np.asarray(grad_accum, dtype=float), np.maximum(np.asarray(v, dtype=float), 1.0)
    chunk = layers / v if chunk is None else chunk
    last = layers - (v - 1.0) * chunk
    at_loss = pp * (v - 1.0) * chunk + last
    inter = pp * (v - 1.0) * chunk + np.where(m > pp, np.maximum(last, chunk), last)
    gpipe, interleaved = schedule == Schedule.gpipe.code, schedule == Schedule.interleaved.code
    held = np.where(gpipe, layers * m, np.where(interleaved, inter, layers))
    return held, np.where(gpipe, layers * m, np.where(interleaved, at_loss, layers))
