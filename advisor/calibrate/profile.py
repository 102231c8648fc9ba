"""Calibrate a whole profile: every link class and efficiency the measurements cover, refitted on a base
profile (no torch here).

- per link class (intra-node, inter-node) the CommFit of advisor.calibrate.links, from the all-reduce when it
  was measured (DDP gradients, the dominant collective), else the collective with the most points;
- the inter-node link from collectives over every GPU of several nodes (advisor.calibrate.network);
- ComputeEfficiency (advisor.calibrate.compute);
- per link class, the SMs NCCL's thread blocks hold beside the compute (``nccl_channels``), from a GEMM loop timed
  alone and beside an all-gather (``overlap`` rows; advisor.comm.held_sms).

Every fit reports its quality (R^2 of log time, max/mean relative error, points used) and its outliers
(relative error > OUTLIER_REL) and failed sizes: nothing is dropped silently.
Deliberately left out: fitting the datasheet peaks themselves (they come from the base profile).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import numpy as np

from advisor.calibrate.compute import fit_efficiency
from advisor.calibrate.fitting import Ledger
from advisor.calibrate.links import collective_points, fit_link, fit_low_latency, link_report
from advisor.calibrate.measurements import COLLECTIVES, CalibrationError
from advisor.calibrate.network import fit_world
from advisor.errors import AdvisorError, format_validation_error
from advisor.hardware import CommFit, Hardware, Link
from advisor.units import GB, MiB


def calibrate_profile(rows: list[dict], base: Hardware, name: str, provenance: dict,
                      judge_from_bytes: float = 4 * MiB) -> tuple[Hardware, list[str]]:
    """The base profile with every measured figure refitted; report lines for the operator.

    One CommFit per link class: the all-reduce fit when all-reduce was measured (DDP gradients, the
    dominant collective), else the collective with the most points; every collective's error under
    its own fit is reported. A link class without measurements keeps the base profile's fit, and so does
    one whose fits explain nothing (advisor.calibrate.fitting.R2_MIN): the report and the profile's ``calibration.rejected_fits``
    say so. Raises CalibrationError when nothing at all could be fitted (no profile is then worth writing),
    and names the fit when a fit fails numerically.
    """
    led = Ledger()
    links = {"intra": base.intra_node, "inter": base.inter_node}
    for cls in ("intra", "inter"):
        links[cls] = _fit_link_class(rows, base, cls, judge_from_bytes, led) or links[cls]
    world = _fit_world_rows(rows, base.model_copy(update=links_update(links)), judge_from_bytes, led)
    if world is not None:
        links["inter"] = world
    for cls, key in (("intra", "intra"), ("world", "inter")):
        links[key] = _fit_channels(rows, cls, key, links[key], led, base.domain_gpus)
    with fitting_step("the compute efficiencies"):
        eff, eff_lines = fit_efficiency(rows, base, led)
    led.lines += eff_lines
    if not eff_lines:
        led.lines.append("compute: no matmul/copy/optimizer rows; efficiencies kept from the base profile")
    if not led.fitted:
        why = "; ".join(led.skipped) or f"{len(rows)} rows, none of a kind calibration fits"
        raise CalibrationError(f"no usable measurements ({why}): nothing was fitted, so no profile is written; "
                               "rerun the sweep or give measurements that cover a link or a kernel")
    provenance = dict(provenance, fitted=led.fitted, **({"rejected_fits": led.rejected} if led.rejected else {}))
    where = f" on {provenance['host']}" if provenance.get("host") else ""
    description = f"calibrated{where} ({provenance.get('date', 'undated')}); datasheet figures from {base.name}: {base.description}"
    hw = base.model_copy(update={"name": name, "description": description, "intra_node": links["intra"], "inter_node": links["inter"],
                                 "efficiency": eff, "calibration": provenance})
    with fitting_step("the profile"):
        return Hardware.model_validate(hw.model_dump()), led.lines


@contextmanager
def fitting_step(what: str):
    """A fit that fails inside numpy or scipy becomes one CalibrationError naming it (the cause stays chained,
    for --debug)."""
    try:
        yield
    except AdvisorError:
        raise
    except Exception as exc:  # a numerical failure on odd data, not a bug to hide: named, with the way out
        msg = format_validation_error(exc) if callable(getattr(exc, "errors", None)) else (str(exc).splitlines() or [""])[0]
        raise CalibrationError(f"fitting {what} failed ({type(exc).__name__}: {msg[:300]}); check those measurements, "
                               "or rerun with --debug and report it") from exc


def _fit_link_class(rows: list[dict], base: Hardware, cls: str, judge_from_bytes: float, led: Ledger) -> Optional[Link]:
    """The link of one class ("intra", "inter") fitted to its collectives; None where it keeps the base's."""
    link = base.intra_node if cls == "intra" else base.inter_node
    # one GPU per node measures one GPU's share of its node's network (rail-optimised: its own NIC),
    # the share advisor.comm gives each GPU when a whole node communicates
    share = 1.0 if cls == "intra" else base.inter_node_share_per_gpu
    chosen, rejected = None, None
    for coll in COLLECTIVES:
        n, S, t, failed = collective_points(rows, cls, coll)
        what = f"{cls}-node {coll}"
        if len(S) == 0:
            if failed:
                led.skip(f"{what}: every size failed ({len(failed)}), the first with: {failed[0][2]}")
            continue
        with fitting_step(what):
            link_b = _widen_bandwidth(link, coll, n, S, t, led.lines, cls, share)
            fit, _ = fit_link(link_b, coll, n, S, t, judge_from_bytes=judge_from_bytes, share=share)
            fitted = link_b.model_copy(update={"fit": fit})
            rep = link_report(fitted, coll, n, S, t, failed, f"{what} (n={_ns(n)})", judge_from_bytes, share)
        led.lines += [rep.line(), *rep.detail_lines()]
        if rep.explains_nothing:
            rejected = rejected or rep
            led.lines.append(f"  {rep.what}: {rep.why_useless()}: not used")
            continue
        if chosen is None or coll == "all_reduce" or (chosen[0] != "all_reduce" and len(S) > chosen[2]):
            chosen = (coll, fitted, len(S), (n, S, t, share))
    if chosen is None:
        if rejected is not None:
            led.reject(f"{cls}_node", rejected, base.name, say=False)
            led.lines.append(f"{cls}-node link: kept from the base profile {base.name} (no fit explains its measurements)")
        else:
            world = any(r.get("kind") == "collective" and r.get("link") == "world" for r in rows)
            why = ("no intra-node measurements" if cls == "intra" else "no one-GPU-per-node rows; the world rows "
                   "are fitted below" if world else "one node: only intra-node links measured")
            led.lines.append(f"{cls}-node link: not measured ({why}); kept from the base profile")
        return None
    link = _with_low_latency(chosen[1], chosen[0], chosen[3], cls, led)
    if link is not chosen[1]:  # the lines above judge each path alone; the profile costs the faster one at every size
        n, S, t, share = chosen[3]
        led.lines.append(link_report(link, chosen[0], n, S, t, [], f"{cls}-node {chosen[0]} as written (both paths)",
                                     judge_from_bytes, share).line())
    led.fitted.append(f"{cls}_node from {chosen[0]}")
    led.lines.append(f"{cls}-node profile fit from {chosen[0]}: " + _fit_text(link.fit))
    return link


def _fit_channels(rows: list[dict], cls: str, key: str, link: Link, led: Ledger, domain_gpus: int) -> Link:
    """The link with the SMs its collectives hold beside the compute: a GEMM loop that outlasts an all-gather started
    beside it ends later than alone by the collective's time x the share of the SMs NCCL's thread blocks held
    (advisor.comm.beside), so channels = that share x the GPU's SMs (median over the sizes measured). A share outside
    (0, 1), or channels outside NCCL's 1..64, is noise, not a count: reported, the base's kept; so on CPU (no SMs).
    World rows inside one NVLink domain (an NVL72 rack's trays) ran on its NVLink, not the network: left out."""
    ours = [r for r in rows if r.get("kind") == "overlap" and r.get("link") == cls]
    mine = [r for r in ours if cls == "intra" or float(r["n_ranks"]) > domain_gpus]
    what = f"{cls}-node overlap" if cls == "intra" else "world overlap (every GPU, across NVLink domains)"
    if len(mine) < len(ours):
        led.lines.append(f"{what}: {len(ours) - len(mine)} row(s) of at most {domain_gpus} GPUs left out: they ran inside "
                         "one NVLink domain, not across the network")
    failed = [r for r in mine if r.get("status", "ok") != "ok"]
    if failed:
        led.lines.append(f"{what}: {len(failed)} size(s) failed, the first with: {failed[0].get('error', 'no error given')}")
    pts = [r for r in mine if r.get("status", "ok") == "ok" and r["compute_s"] >= r["collective_s"]]
    if not pts:
        if len(mine) > len(failed):
            led.lines.append(f"{what}: the GEMM loop never outlasted the all-gather beside it: nccl_channels kept")
        return link
    share = float(np.median([(r["time_s"] - r["compute_s"]) / r["collective_s"] for r in pts]))
    sms = next((r["sm_count"] for r in pts if r.get("sm_count")), None)
    text = (f"{what}: a GEMM loop ends {share:.1%} of the all-gather's time later beside it "
            f"({len(pts)} size{'s' if len(pts) > 1 else ''} from {min(r['size_bytes'] for r in pts) / MiB:g} MiB)")
    if not sms:
        led.lines.append(text + ": no SMs to count (not a GPU): nccl_channels kept from the base profile")
        return link
    channels = round(share * sms) if 0.0 < share < 1.0 else 0
    if not 1 <= channels <= 64:
        led.lines.append(text + f": not a share of {sms} SMs NCCL's 1..64 channels can hold (noise): nccl_channels "
                         "kept from the base profile")
        return link
    led.fitted.append(f"{key}_node.nccl_channels")
    led.lines.append(text + f": NCCL holds {channels} of {sms} SMs (nccl_channels {link.nccl_channels} -> {channels})")
    return link.model_copy(update={"nccl_channels": channels})


def _with_low_latency(link: Link, coll: str, points: tuple, cls: str, led: Ledger) -> Link:
    """The link with its low-latency path fitted to the small sizes, where there are enough and it explains them."""
    with fitting_step(f"{cls}-node {coll} below 1 MiB"):
        ll = fit_low_latency(link, coll, *points)
    if ll is None:
        return link
    led.lines.append(f"{cls}-node {ll[1].line()}: start-up {ll[0].fit.ll_latency_us:.1f} us, "
                     f"rate {ll[0].fit.ll_bandwidth_ratio:.3f} of the link")
    if ll[1].explains_nothing:
        led.lines.append(f"  {cls}-node low-latency path: {ll[1].why_useless()}: not used")
        return link
    return ll[0]


def _ns(n: np.ndarray) -> str:
    return ",".join(str(int(k)) for k in np.unique(n))


def _fit_text(f: CommFit) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in f.model_dump(exclude_none=True).items())


def links_update(links: dict) -> dict:
    return {"intra_node": links["intra"], "inter_node": links["inter"]}


def _fit_world_rows(rows: list[dict], base: Hardware, judge_from_bytes: float, led: Ledger) -> Optional[Link]:
    """The inter-node link fitted to "world" rows (every GPU of several nodes) through advisor.comm's
    multi-node paths, all-reduce preferred; None when there are none or none explains its sweep. Reports each
    collective's fit, and how the chosen fit predicts the other collectives measured (issue 19: one collective's
    fit should predict the others: all-gather and reduce-scatter on the same NICs, all-to-all on each GPU's own)."""
    chosen, rejected, points = None, None, {}
    for coll in COLLECTIVES:
        pts = [(float(r["n_ranks"]), float(r["per_node"]), float(r["size_bytes"]), float(r["time_s"])) for r in rows
               if r.get("kind") == "collective" and r.get("link") == "world" and r.get("collective") == coll
               and r.get("status", "ok") == "ok"]
        if not pts:
            continue
        n, g, S, t = points[coll] = tuple(np.array(v) for v in zip(*pts))
        try:
            with fitting_step(f"world {coll}"):
                link, rep = fit_world(base, coll, n, g, S, t, judge_from_bytes)
        except CalibrationError as exc:
            led.skip(f"world {coll}: {exc}")
            continue
        led.lines += [rep.line(), *rep.detail_lines()]
        if rep.explains_nothing:
            rejected = rejected or rep
            led.lines.append(f"  {rep.what}: {rep.why_useless()}: not used")
        elif chosen is None or coll == "all_reduce":
            chosen = (coll, link)
    if chosen is None:
        if rejected is not None:
            led.reject("inter_node (world)", rejected, "the one-GPU-per-node fit or the base profile", say=False)
        return None
    led.fitted.append(f"inter_node from world {chosen[0]}")
    led.lines.append(f"inter-node profile fit from world {chosen[0]} (replaces the one-GPU-per-node fit): " + _fit_text(chosen[1].fit))
    led.lines += cross_check(base.model_copy(update={"inter_node": chosen[1]}), chosen[0], points, judge_from_bytes)
    return chosen[1]


def cross_check(hw: Hardware, fitted_from: str, points: dict, judge_from_bytes: float) -> list[str]:
    """One line per other collective measured across nodes: how the fit from ``fitted_from`` predicts it."""
    from advisor.calibrate.fitting import fit_report
    from advisor.comm import collective_time

    out = []
    for coll, (n, g, S, t) in points.items():
        if coll != fitted_from:
            rep = fit_report(collective_time(coll, n, S, hw, g), n, S, t, [],
                             f"  world {coll} predicted by the {fitted_from} fit", judge_from_bytes)
            out.append(rep.line())
    return out


# A link's busbw beyond its datasheet rate comes from reducing in the switch (NVLS, SHARP): each byte crosses the link
# once instead of a ring's 2(n-1)/n times (nccl-tests doc/PERFORMANCE.md, the all-reduce bus factor), so busbw stays
# below 2x the rate; a sweep beyond that is another system's (a wrong --base) or a unit slip, never this link.
IN_SWITCH_GAIN_MAX = 2.0


def _widen_bandwidth(link: Link, coll: str, n, S, t, lines: list[str], cls: str, share: float = 1.0) -> Link:
    """A measured busbw above the link's datasheet rate (NVLS, SHARP) cannot be an efficiency <= 1:
    the link's rate is raised to the measured peak, and the report says so."""
    from advisor.comm import bus_factor

    peak = float(np.max(bus_factor(coll, n) * S / t)) / share
    rate = link.bandwidth_bytes_per_s
    if peak <= 0.98 * rate:
        return link
    if peak > IN_SWITCH_GAIN_MAX * rate:
        raise CalibrationError(f"{cls}-node {coll}: measured busbw {peak / GB:.1f} GB/s is more than {IN_SWITCH_GAIN_MAX:g}x "
                               f"the base profile's {rate / GB:.1f} GB/s link, which no switch's reduction reaches: give "
                               "--base the system measured, or check the rows' size_bytes and time_s (seconds)")
    new = round(peak / 0.98 / GB, 1)
    per_gpu = f" ({peak * share / GB:.1f} GB/s from one GPU of {1 / share:g})" if share < 1 else ""
    lines.append(f"{cls}-node {coll}: measured busbw {peak / GB:.1f} GB/s{per_gpu} exceeds the base link's "
                 f"{rate / GB:.1f} GB/s; link bandwidth set to {new} GB/s")
    return link.model_copy(update={"bandwidth_GBps": new, "bandwidth_Gbps": None})
