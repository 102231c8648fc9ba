"""Fit a profile's inter-node link to a published multi-node collective sweep.

    python -m validation.fit_collectives aws_p4d_2node_16gpu_efa_allreduce --hw aws-p4d [--from-bytes 1M]

reads the entry of validation/data/published_collectives.yaml or multinode_collectives.yaml (nccl-tests output:
time per size) and prints a fit as YAML to paste into the profile, with its report:
- several nodes: the profile's inter_node CommFit through advisor.comm.collective_time
  (advisor.calibrate.network.fit_world); the shipped aws-p4d inter-node fit comes from the command above; several
  entries of one collective (e.g. 2, 4 and 8 nodes) are fitted together;
- one node: the low-latency path of its intra_node link from the sizes below 1 MiB
  (advisor.calibrate.links.fit_low_latency), e.g. nvidia_dgxc_dgxh100_8gpu_allreduce --hw dgx-h100.
"""

from __future__ import annotations

import argparse

import numpy as np
import yaml

from advisor.calibrate import fit_low_latency, fit_world, parse_sizes
from advisor.hardware import load_hardware
from validation.datasets import collective_name, collective_sweep, load_multinode_collectives, load_published_collectives


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("entry", nargs="+", help="ids of entries (several nodes: fitted together; one node: the first)")
    ap.add_argument("--hw", required=True, help="the profile whose inter-node link is fitted")
    ap.add_argument("--from-bytes", default="1M", help="smallest size fitted and judged (default 1M)")
    ap.add_argument("--algorithm", choices=("ring", "tree"), default=None,
                    help="hold fit.algorithm (ring: NCCL's ring alone; tree: ring or tree) instead of choosing it")
    ap.add_argument("--judge-from", default=None, help="smallest size judged (default: --from-bytes); smaller sizes "
                    "weigh 0.3 in the fit")
    a = ap.parse_args(argv)
    entries = {e["id"]: e for e in load_published_collectives() + load_multinode_collectives()}
    missing = [x for x in a.entry if x not in entries]
    if missing:
        raise SystemExit(f"no entry {missing[0]!r} in published_collectives.yaml or multinode_collectives.yaml")
    hw = load_hardware(a.hw)
    e = entries[a.entry[0]]
    h = e["hardware"]
    if (h.get("num_nodes") or 1) == 1:
        S, t = collective_sweep(e)
        got = fit_low_latency(hw.intra_node, e["collective"], np.full_like(S, float(h["num_gpus"])), S, t)
        if got is None:
            raise SystemExit(f"{a.entry[0]}: fewer than 4 sizes below 1 MiB; nothing to fit")
        print(got[1].line())
        print(yaml.safe_dump({"fit": {k: getattr(got[0].fit, k) for k in ("ll_latency_us", "ll_bandwidth_ratio")}},
                             sort_keys=False).rstrip())
        return
    smallest = parse_sizes(a.from_bytes)[0]
    cols, names = ([], [], [], []), []
    for x in a.entry:
        S, t = collective_sweep(entries[x])
        keep = S >= smallest
        hx = entries[x]["hardware"]
        for col, v in zip(cols, (np.full(keep.sum(), float(hx["num_gpus"])), np.full(keep.sum(), float(hx["gpus_per_node"])),
                                 S[keep], t[keep])):
            col.append(v)
        names += [collective_name(entries[x])] * int(keep.sum())
    n, g, S, t = (np.concatenate(c) for c in cols)
    judge = parse_sizes(a.judge_from)[0] if a.judge_from else smallest
    link, rep = fit_world(hw, np.array(names, dtype=object), n, g, S, t, judge_from_bytes=judge,
                          algorithms=(a.algorithm,) if a.algorithm else ("ring", "tree"))
    print(rep.line())
    keys = ("algorithm", "latency_us", "latency_per_hop_us", "bandwidth_efficiency", "half_size_MiB", "half_size_exponent",
            "tree_half_size_MiB")
    print(yaml.safe_dump({"fit": {k: getattr(link.fit, k) for k in keys}}, sort_keys=False).rstrip())


if __name__ == "__main__":
    main()
