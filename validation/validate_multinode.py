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

from advisor.comm import bus_factor, collective_time_and_path
from advisor.hardware import Hardware
from advisor.units import MiB
from validation import datasets as ds
from validation.report import DatasetReport, Point, _hardware, _report

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
# Two sweeps of one system, collective and node count: (sweep, reference sweep, how their runs differ as their entries
# say). Where their times at a size differ by more than the goal's 15%, the sweep's point there is counted apart
# (issue 19: recorded, the model bent toward neither); beyond APART no one prediction is within 15% of both. Past the
# reference's largest size its last busbw bounds it, where it pins NCCL_ALGO, NCCL_PROTO and the channels (a fixed
# algorithm's busbw never falls with size: DIP). The reference is the sweep a third agrees with: crazyguitar's 2-node
# all-reduce is within 6% of the README's from 64 MiB; the A3 High all-reduce's busbw (67 GB/s at 256-512 MiB, one
# ring graph for both collectives: reference/nccl_tuning_model.md s.5) is cluster-toolkit's all-gather's (69-71)
SAME_SYSTEM = [
    ("aws_p5_2node_all_reduce_eks", "aws_p5_2node_all_reduce_readme",
     "NCCL 2.18.5 and aws-ofi-nccl 1.7.3, an older stack than the README's 16 GiB block"),
    ("aws_p5_efa_all_reduce_2node_crazyguitar", "aws_p5_2node_all_reduce_readme",
     "NCCL 2.27.7, aws-ofi-nccl 1.16.3 and its tuner"),
    ("dstack_a3high_2node_all_gather", "gcp_a3high_all_gather_2node_clustertoolkit_tcpx",
     "both GPUDirect-TCPX; cluster-toolkit pins NCCL_MIN/MAX_NCHANNELS=8, dstack's env is not confirmed"),
    ("dstack_a3mega_2node_all_gather", "gcp_a3mega_all_gather_2node_clustertoolkit_gke",
     "TCPXO both, dstack's with nccl-env-profile-ll128.sh"),
]
GOAL_PCT = 15.0
APART = (1.0 + GOAL_PCT / 100) / (1.0 - GOAL_PCT / 100)  # 1.35: a time 15% above one and 15% below the other
# One NCCL algorithm and protocol costs latency + bytes / bandwidth (reference/nccl_tuning_model.md s.1), whose busbw
# rises with the size: where a sweep's busbw falls as the size doubles, NCCL changed algorithm, protocol or channels
# (the p5 runs load aws-ofi-nccl's tuner plug-in), a step no smooth model follows. Falls beyond DIP are flagged: more
# than the 6% by which the two p5 2-node all-reduce sweeps of different runs differ from 64 MiB
DIP = 0.06


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


def busbw(entry: dict) -> dict[float, float]:
    """{size: nccl-tests busbw (bytes/s)} of a sweep."""
    S, t = ds.collective_sweep(entry)
    f = float(bus_factor(ds.collective_name(entry), entry["hardware"]["num_gpus"]))
    return {float(s): float(s * f / x) for s, x in zip(S, t)}


def _pinned(entry: dict) -> bool:
    """Whether the run fixed NCCL's algorithm, protocol and channels (its busbw then never falls with size)."""
    env = str((entry.get("software") or {}).get("env") or "")
    return all(k in env for k in ("NCCL_ALGO=", "NCCL_PROTO=", "NCCL_MAX_NCHANNELS="))


def apart(entries: dict) -> dict[str, dict[float, float]]:
    """SAME_SYSTEM: {sweep: {size: its time / the reference's}} from GOAL_FROM_BYTES where they differ by more than
    GOAL_PCT; past the reference's largest size, against its last busbw where it pins NCCL (a bound: slower only)."""
    out = defaultdict(dict)
    for eid, ref, _ in SAME_SYSTEM:
        mine, theirs = busbw(entries[eid]), busbw(entries[ref])
        top = max(theirs)
        for size, b in mine.items():
            if size < GOAL_FROM_BYTES:
                continue
            if size in theirs:
                r = theirs[size] / b
            elif size > top and _pinned(entries[ref]):
                r = theirs[top] / b  # at most the ratio: the reference takes at most this long
            else:
                continue
            if r > 1.0 + GOAL_PCT / 100 or (size in theirs and r < 1.0 / (1.0 + GOAL_PCT / 100)):
                out[eid][size] = r
    return dict(out)


def dips(entries: dict) -> dict[str, dict[float, float]]:
    """{sweep: {size: its busbw / the busbw at half the size}} from GOAL_FROM_BYTES where it falls by more than DIP."""
    out = defaultdict(dict)
    for eid, e in entries.items():
        if _unscored(e) is None:
            b = busbw(e)
            for size, x in b.items():
                if size >= GOAL_FROM_BYTES and size / 2 in b and x < (1.0 - DIP) * b[size / 2]:
                    out[eid][size] = x / b[size / 2]
    return dict(out)


def _agree(entries: dict, eid: str, ref: str) -> float:
    """The largest difference in %, from GOAL_FROM_BYTES, between two sweeps' times at their common sizes."""
    mine, theirs = busbw(entries[eid]), busbw(entries[ref])
    return max(100.0 * abs(theirs[s] / b - 1.0) for s, b in mine.items() if s >= GOAL_FROM_BYTES and s in theirs)


def cause(eid: str, size: float, apart_: dict, dips_: dict) -> str:
    """Why a point may miss that no model can mend: 'apart' (another sweep of the system disagrees), 'dip' (the
    sweep's own busbw falls there), else 'model'."""
    return "apart" if size in apart_.get(eid, {}) else "dip" if size in dips_.get(eid, {}) else "model"


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


def _misses(entries: dict, big: list[Point], ratios: list[Point]) -> tuple[dict, list[str]]:
    """Each miss from 64 MiB (time, and all-gather / all-reduce ratio) by cause(): counts and the notes that say why."""
    apart_, dips_ = apart(entries), dips(entries)
    by = defaultdict(list)
    for p in big:
        eid, size, _ = p.label.rsplit(" ", 2)
        if abs(p.error_pct) > GOAL_PCT:
            by[cause(eid, float(size), apart_, dips_)].append(f"{eid} {float(size) / MiB:g} MiB {p.error_pct:+.0f}%")
    for r in ratios:
        ag, rest = r.label.split(" / ")
        ar, mib, _ = rest.rsplit(" ", 2)
        if abs(r.error_pct) > RATIO_TOLERANCE_PCT:
            both = {cause(x, float(mib) * MiB, apart_, dips_) for x in (ag, ar)}
            by["ratio " + next((c for c in ("apart", "dip") if c in both), "model")].append(f"{r.label} {r.error_pct:+.0f}%")
    extra = {f"misses_from_64MiB_{c}": len(by[c]) for c in ("apart", "dip", "model")}
    extra.update({f"ag_ar_ratio_misses_{c}": len(by["ratio " + c]) for c in ("apart", "dip", "model")})
    notes = ["two sweeps of one system from 64 MiB (* beyond x1.35: no one prediction within 15% of both): "
             + "; ".join(f"{eid} vs {ref} ({why}): " + (", ".join(
                 f"{'' if size in busbw(entries[ref]) else '>='}x{r:.2f}{'*' if max(r, 1 / r) > APART else ''} at "
                 f"{size / MiB:g} MiB" for size, r in sorted(apart_[eid].items()))
                 if eid in apart_ else f"within {_agree(entries, eid, ref):.0f}%") for eid, ref, why in SAME_SYSTEM),
             "busbw falls as the size doubles (NCCL changed algorithm, protocol or channels; no smooth model follows): "
             + "; ".join(f"{eid} at {size / MiB:g} MiB x{r:.2f}" for eid, d in sorted(dips_.items()) for size, r in sorted(d.items())),
             "misses from 64 MiB by cause: " + "; ".join(f"{c} {len(v)}: " + ", ".join(v) for c, v in sorted(by.items()))]
    return extra, notes


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
    more, why_notes = _misses(entries, big, ratios)
    extra.update(more)
    notes[3:3] = why_notes
    rep = _report("multinode", "nccl-tests across nodes: p4de, p5 (2/4/8 nodes, AG/AR/all-to-all), GCP A3 High/Mega/Ultra, "
                  "A4, A4X, A4X Max, CoreWeave GB200 (multinode_collectives.yaml)", "collective time (s)",
                  sum(len(e.get("measurements") or []) for e in entries.values()), points, Counter(), extra=extra,
                  notes=notes)
    return rep.model_copy(update={"secondary": {"AG/AR time ratio": ratios}})
