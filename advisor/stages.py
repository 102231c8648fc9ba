"""The pipeline line of an estimate: how the plan lays its layers over the pipeline ranks, which rank's step
advisor.step.evaluate took (the slower of the first and the last, where it costs both) and which rank's memory (the
fuller: the last holds the head, its logits and any MTP depths)."""

from __future__ import annotations

import numpy as np

from advisor import step
from advisor.candidates import Candidates, Mesh
from advisor.parallel import pipeline
from advisor.units import GiB
from advisor.workload import Workload


def stage_note(w: Workload, c: Candidates) -> str:
    """How the plan (row 0 of ``c``) lays its layers over the pipeline ranks, and which rank's step and which rank's
    memory ``evaluate`` took ("" without a pipeline)."""
    if int(c.pp[0]) <= 1:
        return ""
    c = step._sharded_only(w, c)  # the plan as evaluate costs it, in the workload it costs it in
    alt, fsdp = step._fsdp_rows(w, c)
    w = alt if bool(fsdp[0]) else w
    mesh, model = Mesh.of(c, w.hw.gpus_per_node, w.hw.domain_gpus), w.model
    one = lambda x: float(np.asarray(x).reshape(-1)[0])  # noqa: E731
    v = f" ({int(mesh.v[0])} chunks a rank)" if int(mesh.v[0]) > 1 else ""
    head = f"{model.n_layers} layers on {int(c.pp[0])} ranks{v}"
    if not pipeline.two_ranks(model, c, step._layout(w), w.mtp_layers)[0]:
        layers = one(pipeline.stage_layers(model, c, mesh, 0.0, 0.0, None, w.mtp_layers)[0])
        both = "rank 0 holds both ends" if int(c.schedule[0]) in (pipeline.ZB_V, pipeline.DUALPIPE_V) else "a bound"
        return f"pipeline: {head}; costed as a rank of {layers:g} layers with the embedding and the head ({both})"
    first, last = step._first_and_last(w, c)
    t_first, t_last = one(first.time.total), one(last.time.total)
    # the memory verdict is the fuller rank's (advisor.step._staged): peak plus overhead, as the capacity check adds them
    m_first, m_last = (one(e.memory.peak + e.overhead.total) / GiB for e in (first, last))
    (n_first, _, embedding), (n_last, _, _) = (pipeline.stage_layers(model, c, mesh, 0.0, 0.0, r, w.mtp_layers) for r in ("first", "last"))
    # the rank costed beside the last: the first with the embedding, or a middle one where the first holds fewer
    busy = "the first rank" if one(embedding) else "a middle rank"
    who = "the last rank's" if t_last > t_first else busy + "'s"
    return (f"pipeline: {head}; {busy} {one(n_first):g} layers" + (" and the embedding" if one(embedding) else "")
            + f" ({t_first:.4g} s a step), the last {one(n_last) - w.mtp_layers:g}" + (f", {w.mtp_layers} MTP" if w.mtp_layers
            else "") + f" and the head ({t_last:.4g} s): the step is {who}; memory {m_first:.2f} GiB on {busy}, "
            f"{m_last:.2f} GiB on the last: the memory shown is " + ("the last rank's" if m_last > m_first else busy + "'s"))
