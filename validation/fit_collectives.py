"""Fit a profile's inter-node link to a published multi-node collective sweep.

    python -m validation.fit_collectives aws_p4d_2node_16gpu_efa_allreduce --hw aws-p4d [--from-bytes 1M]

reads the entry of validation/data/published_collectives.yaml (nccl-tests output: time per size) and
prints a fit as YAML to paste into the profile, with its report:
- several nodes: the profile's inter_node CommFit through advisor.comm.collective_time
  (advisor.calibrate.network.fit_world); the shipped aws-p4d inter-node fit comes from the command above;
- one node: the low-latency path of its intra_node link from the sizes below 1 MiB
  (advisor.calibrate.links.fit_low_latency), e.g. nvidia_dgxc_dgxh100_8gpu_allreduce --hw dgx-h100.
"""

from __future__ import annotations

import argparse

import numpy as np
import yaml

from advisor.calibrate import fit_low_latency, fit_world, parse_sizes
from advisor.hardware import load_hardware
from validation.datasets import collective_sweep, load_published_collectives


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("entry", help="id of a published_collectives.yaml entry with several nodes")
    ap.add_argument("--hw", required=True, help="the profile whose inter-node link is fitted")
    ap.add_argument("--from-bytes", default="1M", help="smallest size fitted and judged (default 1M)")
    a = ap.parse_args(argv)
    entries = {e["id"]: e for e in load_published_collectives()}
    if a.entry not in entries:
        raise SystemExit(f"no entry {a.entry!r} in published_collectives.yaml")
    e, hw = entries[a.entry], load_hardware(a.hw)
    h = e["hardware"]
    S, t = collective_sweep(e)
    if (h.get("num_nodes") or 1) == 1:
        got = fit_low_latency(hw.intra_node, e["collective"], np.full_like(S, float(h["num_gpus"])), S, t)
        if got is None:
            raise SystemExit(f"{a.entry}: fewer than 4 sizes below 1 MiB; nothing to fit")
        print(got[1].line())
        print(yaml.safe_dump({"fit": {k: getattr(got[0].fit, k) for k in ("ll_latency_us", "ll_bandwidth_ratio")}},
                             sort_keys=False).rstrip())
        return
    smallest = parse_sizes(a.from_bytes)[0]
    S, t = S[S >= smallest], t[S >= smallest]
    n = np.full_like(S, float(h["num_gpus"]))
    g = np.full_like(S, float(h["gpus_per_node"]))
    link, rep = fit_world(hw, e["collective"], n, g, S, t, judge_from_bytes=smallest)
    print(rep.line())
    keys = ("algorithm", "latency_us", "latency_per_hop_us", "bandwidth_efficiency", "half_size_MiB", "half_size_exponent")
    print(yaml.safe_dump({"fit": {k: getattr(link.fit, k) for k in keys}}, sort_keys=False).rstrip())


if __name__ == "__main__":
    main()
