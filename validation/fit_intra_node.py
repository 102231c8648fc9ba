"""Fit a profile's intra-node link to published one-node all-reduce measurements.

    python -m validation.fit_intra_node --hw dgx-h200 mleng_h200_8gpu_allreduce_bench_nvls \\
        mleng_h200_4gpu_allreduce_8GiB mleng_h200_5gpu_allreduce_8GiB ... [--from-bytes 0]

reads the entries of validation/data/published_collectives.yaml or multinode_collectives.yaml (one node each, or
one NVLink domain of several nodes where the profile has one; one collective; a sweep over
sizes at one GPU count and single points at other GPU counts can be mixed), fits the profile's intra_node
CommFit to all of them with advisor.calibrate.links.fit_link (the fitter ``advisor calibrate`` uses: log-time
least squares, then a minimax polish on the judged sizes), and prints the fit as YAML to paste into the
profile, its report and the error at every point. The shipped dgx-h200 and aws-p6-b200 intra-node fits come
from this command (the entries are listed in their comments).

- The per-hop and group terms (latency_per_hop_us, group_penalty, floor_per_hop_us) are free because more than
  one GPU count is measured; where the other counts are measured at one large size only, they identify the
  group penalty (bandwidth against n), not how a start-up splits into a constant and a per-hop part.
- The fit starts from a neutral CommFit (NEUTRAL), not from the profile's: the result depends on the data and
  the link rate alone, so the command reproduces a shipped fit whatever the profile holds.
- Every size from ``--from-bytes`` is judged (default 0: all of them). There is no low-latency path (``ll_*``
  = 0), so the bulk terms (start-up, floor) carry the small sizes: Stas Bekman's all_reduce_bench.py sweeps,
  timed through torch.distributed, are flat at 38-53 us from 32 KiB to 1 MiB on 8 H200s or B200s, a per-call
  floor rather than a low-latency protocol. For nccl-tests data with a low-latency regime, fit the
  bulk from 1 MiB and then the low-latency path with validation.fit_collectives.
- The link rate is the profile's (a datasheet figure) and is not changed: a measured busbw above it (NVLink
  SHARP all-reduces) cannot be reached by an efficiency <= 1, and the report says by how much it is exceeded.
  (``advisor calibrate --from`` instead raises the link rate to the measured peak.)
"""

from __future__ import annotations

import argparse

import numpy as np
import yaml

from advisor.calibrate import fit_link, fit_report, parse_sizes
from advisor.comm import bus_factor, link_time
from advisor.hardware import CommFit, load_hardware
from advisor.units import GB, MiB
from validation.datasets import collective_name, collective_sweep, load_multinode_collectives, load_published_collectives

# the CommFit keys fitted and printed where not 0 (the others stay at their defaults: no low-latency path)
FIT_KEYS = ("latency_us", "latency_per_hop_us", "bandwidth_efficiency", "group_penalty", "half_size_MiB",
            "half_size_exponent", "loop_MiB_per_rank", "loop_quantization", "simple_fill_MiB_per_rank",
            "ll128_bandwidth_ratio", "floor_us", "floor_per_hop_us")


# where fit_link's first start lies (its other starts are computed from the data): no size ramp, no protocols,
# no low-latency path
NEUTRAL = CommFit(latency_us=0.0, bandwidth_efficiency=1.0)


def points(ids: list[str], domain_gpus: int = 0) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(collective, n, size, time) of the named entries, concatenated: each in one node, or in one NVLink domain of
    ``domain_gpus`` GPUs."""
    entries = {e["id"]: e for e in load_published_collectives() + load_multinode_collectives()}
    missing = [i for i in ids if i not in entries]
    if missing:
        raise SystemExit(f"no entry {missing[0]!r} in published_collectives.yaml")
    colls = {collective_name(entries[i]) for i in ids}
    if len(colls) != 1:
        raise SystemExit(f"the entries mix collectives ({', '.join(sorted(colls))}): fit one at a time")
    if any((entries[i]["hardware"].get("num_nodes") or 1) != 1 and entries[i]["hardware"]["num_gpus"] > domain_gpus
           for i in ids):
        raise SystemExit("an entry spans several nodes: fit the network with validation.fit_collectives")
    n, S, t = [], [], []
    for i in ids:
        s, tt = collective_sweep(entries[i])
        n.append(np.full_like(s, float(entries[i]["hardware"]["num_gpus"])))
        S.append(s)
        t.append(tt)
    return colls.pop(), np.concatenate(n), np.concatenate(S), np.concatenate(t)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("entries", nargs="+", help="ids of one-node published_collectives.yaml entries")
    ap.add_argument("--hw", required=True, help="the profile whose intra-node link is fitted")
    ap.add_argument("--from-bytes", default="0", help="smallest size judged (default 0: every size)")
    a = ap.parse_args(argv)
    coll, n, S, t = points(a.entries, load_hardware(a.hw).domain_gpus)
    # the profile's link rate, and a neutral fit to start from (the result does not depend on the profile's fit)
    link = load_hardware(a.hw).intra_node.model_copy(update={"fit": NEUTRAL})
    judge = parse_sizes(a.from_bytes)[0] if a.from_bytes not in ("0", "") else 0.0
    fit, _ = fit_link(link, coll, n, S, t, judge_from_bytes=judge)
    link = link.model_copy(update={"fit": fit})
    pred = link_time(coll, n, S, link)
    ns = ",".join(str(int(k)) for k in np.unique(n))
    print(fit_report(pred, n, S, t, [], f"intra-node {coll} (n={ns})", judge).line())
    busbw = bus_factor(coll, n) * S / t
    if busbw.max() > link.bandwidth_bytes_per_s:
        print(f"measured busbw up to {busbw.max() / GB:.1f} GB/s exceeds the link's {link.bandwidth_bytes_per_s / GB:g} "
              "GB/s (in-switch reductions, NVLink SHARP): no efficiency <= 1 reaches it; the link rate is kept")
    for k, s, tt, p in zip(n, S, t, pred):
        print(f"  n={int(k)} {s / MiB:>10g} MiB  measured {tt * 1e6:10.1f} us  model {p * 1e6:10.1f} us  "
              f"{100 * (p / tt - 1):+6.1f}%")
    # zero terms are CommFit's defaults (latency_us has none); a loop size without quantization costs nothing
    keep = {k: getattr(fit, k) for k in FIT_KEYS if getattr(fit, k) != 0 or k in ("latency_us", "bandwidth_efficiency")}
    if not fit.loop_quantization:
        keep.pop("loop_MiB_per_rank", None)
    print(yaml.safe_dump({"fit": keep}, sort_keys=False).rstrip())


if __name__ == "__main__":
    main()
