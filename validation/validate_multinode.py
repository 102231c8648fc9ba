"""Collectives across nodes against the comm model: every multi-node sweep of validation/data/multinode_collectives.yaml
(nccl-tests tables of all-gather, all-reduce and all-to-all on 2-36 nodes: AWS p4de and p5, GCP A3 High, Mega and
Ultra, A4, A4X and A4X Max, CoreWeave GB200 NVL72), each on the shipped profile of its system (``SYSTEMS``).

- Times: every point of every multi-node sweep is compared; the goal (issue 19) is within 15% from 64 MiB
  (``GOAL_FROM_BYTES``), where training's gradient buckets and gathered layers lie; below it the error is reported.
- Ratios: where one system has all-gather and all-reduce sweeps (``RATIO_PAIRS``), the model's all-gather /
  all-reduce time ratio at each common size from 64 MiB against the measured one: the structure of the model (a
  ring all-gather crosses the network with half a ring all-reduce's bytes; a 2-node tree all-reduce with as many
  as the all-gather) rather than one fitted rate.
- Which sweeps fitted which profile is said per profile (their fit comments) and here in ``FITTED``: the others are
  predictions, e.g. p5's all-gather and all-to-all from its all-reduce fit.
- Entries without per-size measurements (maintainers' statements, summaries) are listed with why they are not scored.

Nothing is fitted here.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Optional

import numpy as np

from advisor.comm import collective_time_and_path
from advisor.hardware import Hardware
from advisor.units import MiB
from validation import datasets as ds
from validation.validate import DatasetReport, Point, _hardware, _report

GOAL_FROM_BYTES = 64 * MiB
RATIO_TOLERANCE_PCT = 15.0

# entry id (or id prefix) -> the shipped profile of its system
SYSTEMS = {
    "a3mega_h100_2node_all_reduce_ztan": "gcp-a3-mega", "dstack_a3mega_2node_all_gather": "gcp-a3-mega",
    "gcp_a3mega_all_gather_2node_clustertoolkit_gke": "gcp-a3-mega",
    "aws_p4de_2node_all_reduce": "aws-p4de", "aws_p5_": "aws-p5",
    "coreweave_gb200_2rack_all_reduce": "gb200-nvl72", "gcp_a4x_gb200_mnnvl_all_gather": "gb200-nvl72",
    # "if the two node pools are in distinct NVLink domains the test represents cross-domain RDMA throughput, as
    # shown in the provided output" (the entry's source): two trays in two domains (DISTINCT_DOMAINS)
    "gcp_a4xmax_gb300_2node_all_gather": "gb300-nvl72",
    "dstack_a3high_2node_all_gather": "gcp-a3-high", "gcp_a3high_all_gather_2node_clustertoolkit_tcpx": "gcp-a3-high",
    "gcp_a3high_all_reduce_2node_skypilot_tcpx": "gcp-a3-high",
    "gcp_a3ultra_h200_2node_all_gather": "gcp-a3-ultra", "gcp_a3ultra_all_gather_2node_skypilot": "gcp-a3-ultra",
    # labelled A4 on its page; the same numbers appear under A3 Ultra elsewhere (the entry's note): as labelled
    "gcp_a4_b200_2node_all_gather": "gcp-a4", "gcp_a4_tas_sample_all_gather": "gcp-a4",
    "dstack_gcp_a4_2node_all_reduce": "gcp-a4",
}
DISTINCT_DOMAINS = {"gcp_a4xmax_gb300_2node_all_gather"}
# the sweeps each profile's network (or NVLink) fit was fitted to: scored like the rest, a check of the fit
FITTED = {"aws_p5_2node_all_reduce_readme", "aws_p5_efa_all_reduce_2node_crazyguitar",
          "aws_p5_efa_all_reduce_4node_crazyguitar", "aws_p5_efa_all_reduce_8node_crazyguitar",
          "a3mega_h100_2node_all_reduce_ztan", "dstack_a3mega_2node_all_gather",
          "gcp_a3mega_all_gather_2node_clustertoolkit_gke", "aws_p4de_2node_all_reduce",
          "gcp_a3high_all_gather_2node_clustertoolkit_tcpx", "gcp_a3high_all_reduce_2node_skypilot_tcpx",
          "gcp_a3ultra_h200_2node_all_gather", "gcp_a3ultra_all_gather_2node_skypilot", "dstack_gcp_a4_2node_all_reduce",
          "gcp_a4_b200_2node_all_gather", "gcp_a4_tas_sample_all_gather", "gcp_a4x_gb200_mnnvl_all_gather"}
# (all-gather entry, all-reduce entry) measured on one system and node count
RATIO_PAIRS = [(f"aws_p5_efa_all_gather_{k}node_crazyguitar", f"aws_p5_efa_all_reduce_{k}node_crazyguitar") for k in (2, 4, 8)] + [
    ("dstack_a3mega_2node_all_gather", "a3mega_h100_2node_all_reduce_ztan"),
    ("gcp_a3mega_all_gather_2node_clustertoolkit_gke", "a3mega_h100_2node_all_reduce_ztan"),
    ("gcp_a4_b200_2node_all_gather", "dstack_gcp_a4_2node_all_reduce"),
    ("gcp_a3high_all_gather_2node_clustertoolkit_tcpx", "gcp_a3high_all_reduce_2node_skypilot_tcpx"),
    ("dstack_a3high_2node_all_gather", "gcp_a3high_all_reduce_2node_skypilot_tcpx")]


def system(entry_id: str) -> Optional[str]:
    return SYSTEMS.get(entry_id) or next((p for k, p in SYSTEMS.items() if k.endswith("_") and entry_id.startswith(k)), None)


def _hw(entry_id: str) -> Hardware:
    hw = _hardware(system(entry_id))
    if entry_id in DISTINCT_DOMAINS:  # each tray its own NVLink domain
        hw = hw.model_copy(update={"nvlink_domain_gpus": None})
    return hw


def predict(entry: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sizes, measured seconds, predicted seconds, path codes) of a multi-node entry on its profile."""
    h = entry["hardware"]
    S, t = ds.collective_sweep(entry)
    p, path = collective_time_and_path(ds.collective_name(entry), h["num_gpus"], S, _hw(entry["id"]), h["gpus_per_node"])
    return S, t, np.asarray(p, dtype=float), np.asarray(path)


def _unscored(e: dict) -> Optional[str]:
    """Why an entry has no scored point (None: it has)."""
    if not e.get("measurements"):
        return "no per-size measurements (a statement or summary)"
    if (e["hardware"].get("num_nodes") or 1) == 1:
        return "one node"
    if system(e["id"]) is None:
        return "no profile of its system"
    return None


def ratio_points(entries: dict) -> list[Point]:
    """Model vs measured all-gather / all-reduce time at each common size from GOAL_FROM_BYTES."""
    out = []
    def by_size(entry_id: str) -> dict:
        S, t, p, _ = predict(entries[entry_id])
        return {float(s): (float(a), float(b)) for s, a, b in zip(S, t, p)}

    for ag_id, ar_id in RATIO_PAIRS:
        ag, ar = by_size(ag_id), by_size(ar_id)
        for size in sorted(set(ag) & set(ar)):
            if size >= GOAL_FROM_BYTES:
                (t_ag, p_ag), (t_ar, p_ar) = ag[size], ar[size]
                out.append(Point(label=f"{ag_id} / {ar_id} {int(size) // MiB} MiB", kind=f"{system(ag_id)} AG/AR",
                                 predicted=p_ag / p_ar, measured=t_ag / t_ar))
    return out


def validate_multinode() -> DatasetReport:
    entries = {e["id"]: e for e in ds.load_multinode_collectives()}
    points, small, skipped, paths = [], defaultdict(list), Counter(), Counter()
    for eid, e in entries.items():
        why = _unscored(e)
        if why:
            skipped[why] += 1
            continue
        S, t, p, path = predict(e)
        role = "fitted" if eid in FITTED else "predicted"
        for size, m, q, a in zip(S, t, p, path):
            pt = Point(label=f"{eid} {int(size)} B", kind=f"{system(eid)} {ds.collective_name(e)} ({role})",
                       predicted=float(q), measured=float(m))
            points.append(pt)
            paths[int(a)] += 1
            if size < GOAL_FROM_BYTES:
                small[role].append(abs(pt.error_pct))
    big = [p for p in points if int(p.label.rsplit(" ", 2)[-2]) >= GOAL_FROM_BYTES]
    ratios = ratio_points(entries)
    ratio_err = [abs(r.error_pct) for r in ratios]
    within = sum(abs(p.error_pct) <= 15.0 for p in big)
    extra = {"points_from_64MiB": len(big), "max_ape_from_64MiB_pct": max(abs(p.error_pct) for p in big),
             "within_15pct_from_64MiB": within, "ag_ar_ratio_points": len(ratios),
             "ag_ar_ratio_max_error_pct": max(ratio_err), "ag_ar_ratio_within_15pct": sum(e <= RATIO_TOLERANCE_PCT for e in ratio_err)}
    worst = sorted(big, key=lambda p: -abs(p.error_pct))[:6]
    notes = [f"{within} of {len(big)} points from 64 MiB within 15%; worst: "
             + ", ".join(f"{p.label.rsplit(' ', 2)[0]} at {int(p.label.rsplit(' ', 2)[-2]) // MiB:g} MiB {p.error_pct:+.0f}%" for p in worst),
             "below 64 MiB (not in the goal) median error: " + ", ".join(f"{k} {np.median(v):.0f}%" for k, v in sorted(small.items())),
             f"all-gather / all-reduce time ratios: {sum(e <= RATIO_TOLERANCE_PCT for e in ratio_err)} of {len(ratios)} "
             f"within 15% of the measured ratio (max {max(ratio_err):.0f}%)",
             "not scored: " + "; ".join(f"{n} entries, {why}" for why, n in sorted(skipped.items())),
             "'fitted' sweeps are those the profiles' network fits were fitted to (a check of the fit); the others are "
             "predictions (p5's all-gather and all-to-all from its all-reduce fit, the GB300 cross-rack all-gather from "
             "typical values)"]
    rep = _report("multinode", "nccl-tests across nodes: p4de, p5 (2/4/8 nodes, AG/AR/all-to-all), GCP A3 High/Mega/Ultra, "
                  "A4, A4X, A4X Max, CoreWeave GB200 (multinode_collectives.yaml)", "collective time (s)",
                  sum(len(e.get("measurements") or []) for e in entries.values()), points, Counter(), extra=extra,
                  notes=notes)
    return rep.model_copy(update={"secondary": {"AG/AR time ratio": ratios}})
