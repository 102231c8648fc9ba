"""`advisor calibrate`: measure this machine (or refit saved measurements) and write a hardware profile.

    advisor calibrate --nproc 8 --out mynode.yaml                 # 8 local workers (nccl on GPUs, gloo on CPU)
    torchrun --nnodes 2 --nproc-per-node 8 ... -m advisor.cli_calibrate --out two.yaml   # many nodes
    advisor calibrate --from results.jsonl --out mynode.yaml      # refit, no rerun
    advisor calibrate --from reference/a100-nccl/ --base dgx-a100 --out a100.yaml

The profile is the --base profile (datasheet figures) with the fitted link and efficiency values; on a
CPU/gloo run those values describe the CPU and its gloo transport, not the base's GPU. The raw
measurements stay in a results JSONL beside the profile (``--out`` with .jsonl), appended as measured;
a rerun with the same --out resumes the sweep where it stopped. One calibration at a time per --out (a lock
file beside it); local workers are bounded by the machine's cores and die with this command
(advisor.calibrate.launch). A profile is written only where something was fitted, and without the fits that
explain nothing (R^2 <= 0: the base profile's values stay, and the profile's calibration says so).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import sys
from pathlib import Path

import click

from advisor.errors import AdvisorError

TORCH_HINT = "torch is not installed: pip install 'advisor[calibrate]' (install the torch build for your machine first)"


def _own_name(name, out_path) -> str:
    """The profile's name: --name, else the --out file's stem, with -calibrated added where that is a built-in's (a file
    under a built-in's name that differs from it is refused where it is loaded: advisor.profiles)."""
    from advisor.hardware import HARDWARE

    if name is not None and (HARDWARE.shipped(name) is not None or name in HARDWARE.reserved):
        raise AdvisorError(f"--name {name}: a built-in hardware profile's name; give the measured profile its own")
    stem = out_path.stem
    own = name or (f"{stem}-calibrated" if HARDWARE.shipped(stem) is not None else stem)
    if not 1 <= len(own) <= 100 or not own.isprintable():  # advisor.spec.ProfileName, checked before any measuring
        raise AdvisorError(f"profile name {own[:40]!r}{'...' if len(own) > 40 else ''}: 1 to 100 printable characters; "
                           "give --name, or an --out file with a shorter stem")
    return own


@click.command("calibrate")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="profile YAML to write")
@click.option("--from", "from_", type=click.Path(), multiple=True,
              help="refit from saved measurements: results JSONL, nccl-tests CSV(s) or a folder (repeatable)")
@click.option("--base", default="dgx-a100", show_default=True, help="shipped profile giving the datasheet figures")
@click.option("--name", default=None, help="profile name (default: the --out file's stem)")
@click.option("--nproc", type=int, default=0, help="local workers to start (default: GPUs, or 2 on CPU)")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True)
@click.option("--sizes", default="1K:1G", show_default=True, help="message sizes: START:END doubling, or a list")
@click.option("--iters", type=int, default=10, show_default=True)
@click.option("--warmup", type=int, default=3, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="seconds without progress before a rank is declared hung")
@click.option("--compute/--no-compute", default=True, help="also measure matmul, copy and optimizer rates, and a GEMM loop beside an all-gather (the SMs NCCL "
              "holds)")
@click.option("--judge-from", default="4M", show_default=True, help="size from which the fit is judged by its worst point")
@click.option("--host", "host_only", is_flag=True,
              help="measure only the host side (CPU Adam rate, pinned host<->device copy, memory, cores) over --base")
def calibrate(out, from_, base, name, nproc, backend, sizes, iters, warmup, timeout_s, compute, judge_from, host_only):
    """Measure this machine's collectives and kernels and write a hardware profile for --hw."""
    from advisor import calibrate as cal
    from advisor.calibrate.launch import check_nproc
    from advisor.calibrate.output import lock_output
    from advisor.hardware import load_hardware

    given = _given_options()
    sweep = [flag for name, flag in given.items() if name not in ("out", "base", "name", "host_only")]
    if host_only and sweep:  # a sweep's options would be ignored: say so
        raise AdvisorError(f"--host measures the host side only (CPU Adam, pinned copies, memory, cores): drop "
                           f"{', '.join(sweep)}, or drop --host for the collectives")
    measuring = [given[o] for o in ("nproc", "backend", "sizes", "iters", "warmup", "timeout_s", "compute") if o in given]
    if from_ and measuring:  # a refit measures nothing
        raise AdvisorError(f"--from refits saved measurements, it runs no sweep: drop {', '.join(measuring)}, or drop "
                           "--from to measure")
    if "nproc" in given and nproc < 2:  # 0 is the default's placeholder, not a count to ask for
        raise AdvisorError(f"--nproc {nproc}: collectives need at least 2 ranks (leave --nproc out: the GPUs, or 2 on CPU)")
    out_path = cal.refuse_shipped(out)
    base_hw = load_hardware(base)
    name = _own_name(name, out_path)  # before a sweep: a built-in's name on a measured profile would not load back
    if host_only:
        with lock_output(out_path):
            _calibrate_host(out_path, base, base_hw, name)
        return
    # every option is checked before a sweep that can take minutes
    judge_bytes = cal.parse_sizes(judge_from, "--judge-from")[0]
    from_ = list(from_) or None
    if from_ is None:
        _check_sweep(sizes, iters, warmup, timeout_s, base, base_hw)
        if nproc and not _under_torchrun():  # 0: the default, known once torch has counted the GPUs
            _check_at_least_two(nproc)
            check_nproc(nproc)
    # one calibration per --out (rank 0 of a torchrun job holds it: the other ranks write nothing)
    with lock_output(out_path) if not _follower() else contextlib.nullcontext():
        _calibrate(out_path, from_, base, base_hw, name, judge_bytes,
                   (nproc, backend, sizes, iters, warmup, timeout_s, compute))


def _check_sweep(sizes: str, iters: int, warmup: int, timeout_s: float, base: str, base_hw) -> None:
    """The sweep's numbers, refused in one line before any worker starts."""
    from advisor.calibrate.measurements import MIN_TIME_S, parse_sizes

    parsed = parse_sizes(sizes)
    if min(parsed) <= 0:
        raise AdvisorError(f"--sizes {sizes!r}: sizes must be positive, e.g. 1K:1G")
    if max(parsed) > base_hw.gpu.memory_bytes:  # every rank holds at least one buffer of the size
        raise AdvisorError(f"--sizes {sizes}: {max(parsed):.3g} bytes is more than a {base} GPU holds "
                           f"({base_hw.gpu.memory_GiB:g} GiB); end the sizes below it, e.g. 1K:1G")
    if iters < 1 or warmup < 0:
        raise AdvisorError(f"--iters {iters} / --warmup {warmup}: need at least 1 timed iteration and no negative warm-up")
    if not (timeout_s > 0 and timeout_s < 1e6):
        raise AdvisorError(f"--timeout {timeout_s}: give the seconds without progress before a rank counts as hung (> 0)")
    if (iters + warmup) * MIN_TIME_S > timeout_s:  # one measurement beats only when all its calls end (launch.py)
        raise AdvisorError(f"--iters {iters} / --warmup {warmup}: at {MIN_TIME_S:g} s a call, less than any collective "
                           f"takes, one size outlasts --timeout {timeout_s:g} s and counts as hung; give fewer --iters "
                           "(10, the default, is enough)")


def _check_host_sizes(sizes: str, ranks: int) -> None:
    """A gloo sweep on CPU: --sizes against host memory (_check_sweep checked them against the base's GPU), as every
    local rank holds at least one buffer of the size (microbench.time_collective's x) in this machine's RAM."""
    from advisor.calibrate.host import host_memory_GiB
    from advisor.calibrate.measurements import parse_sizes
    from advisor.units import GiB

    largest, memory = max(parse_sizes(sizes)), host_memory_GiB()
    if ranks * largest > memory * GiB:
        fit = 1 << int(memory * GiB // ranks).bit_length() - 1  # the largest power of 2 that every rank holds
        end = next(f"{fit >> e}{u}" for u, e in (("G", 30), ("M", 20), ("K", 10), ("", 0)) if fit >= 1 << e)
        raise AdvisorError(f"--sizes {sizes}: {ranks} gloo ranks each hold a {largest:.3g}-byte buffer in this "
                           f"machine's memory ({memory:.1f} GiB); end the sizes at {end} or below, e.g. 1K:{end}")


def _calibrate(out_path: Path, from_, base: str, base_hw, name, judge_bytes: float, sweep: tuple) -> None:
    from advisor import calibrate as cal

    sources = [Path(p) for p in from_] if from_ else [out_path.with_suffix(".jsonl")]
    named = ", ".join(map(str, sources))
    info = {"base": base, "date": datetime.date.today().isoformat(), "host": platform.node()}
    if from_ is None:
        info.update(_measure(sources[0], *sweep))
        if info.pop("follower", False):
            return  # a torchrun rank other than 0: rank 0 fits and writes
    else:
        info["refit_from"] = named
    rows = [row for src in sources for row in cal.read_results(src)]
    if not rows:
        raise AdvisorError(f"{named}: no measurements to fit")
    info["results"] = named
    if cal.on_cpu_note(info):
        click.echo(cal.on_cpu_note(info), err=True)
    try:
        hw, lines = cal.calibrate_profile(rows, base_hw, name or out_path.stem, info, judge_bytes)
    except cal.CalibrationError as exc:
        raise cal.CalibrationError(f"{named}: {exc}") from exc
    header = (f"# Written by `advisor calibrate` on {info['date']} from {info['results']} (base profile {base}).\n"
              "# Datasheet figures come from the base; fitted (where measured): intra_node.fit, inter_node.fit, efficiency,\n"
              "# and the links' nccl_channels (calibration.fitted lists what this run fitted).\n")
    _write(hw, out_path, header, lines)


def _calibrate_host(out_path: Path, base: str, base_hw, name) -> None:
    """`--host`: the base profile with its host side measured here (advisor.calibrate.host)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise AdvisorError(TORCH_HINT) from None
    from advisor.calibrate.host import measure
    from advisor.hardware import Host

    fields, lines = measure(base_hw.host, base_hw.gpus_per_node)
    info = {"base": base, "date": datetime.date.today().isoformat(), "host": platform.node(), "measured": "host side"}
    hw = base_hw.model_copy(update={"name": name or out_path.stem, "host": Host(**fields), "calibration": info})
    header = (f"# Written by `advisor calibrate --host` on {info['date']} (base profile {base}): the host side measured "
              "here, the rest the base's.\n")
    _write(hw, out_path, header, lines)


def _write(hw, out_path: Path, header: str, lines: list[str]) -> None:
    """The calibrated profile written under its header, what the calibration says, and where the profile lies."""
    from advisor import calibrate as cal

    path = cal.write_profile(hw, out_path, header)
    for line in lines:
        click.echo(line)
    click.echo(f"wrote {path} (use it with --hw {path})")


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _follower() -> bool:
    return _under_torchrun() and os.environ["RANK"] != "0"


def _given_options() -> dict[str, str]:
    """The options given on the command line (not left at their defaults): parameter name -> the flag as spelt."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return {p.name: (p.secondary_opts or p.opts)[0] if ctx.params.get(p.name) is False else p.opts[0]
            for p in ctx.command.params if ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE}


def _check_at_least_two(nproc: int) -> None:
    if nproc < 2:
        raise AdvisorError(f"--nproc {nproc}: collectives need at least 2 ranks")


def _measure(results: Path, nproc, backend, sizes, iters, warmup, timeout_s, compute) -> dict:
    """Run the sweep (local workers, or this rank under torchrun); provenance for the profile."""
    from advisor import calibrate as cal

    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError:
        raise AdvisorError(TORCH_HINT) from None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        backend = "nccl" if gpus else "gloo"
    if backend == "nccl" and not gpus:
        raise AdvisorError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo on CPU")
    under_torchrun = _under_torchrun()
    nproc = int(os.environ["WORLD_SIZE"]) if under_torchrun else (nproc or gpus or 2)
    _check_at_least_two(nproc)
    if backend == "nccl" and not under_torchrun and nproc > gpus:
        raise AdvisorError(f"--nproc {nproc} with nccl but only {gpus} GPUs visible")
    if backend == "gloo":  # gloo's buffers are CPU tensors (microbench.run_worker): this machine's ranks share its RAM
        _check_host_sizes(sizes, int(os.environ.get("LOCAL_WORLD_SIZE", nproc)) if under_torchrun else nproc)
    # rank 0 alone writes the results and reads them to resume (advisor.calibrate.run_worker broadcasts what it read):
    # under torchrun the other ranks leave the file alone, which on a shared filesystem is rank 0's own
    leader = not _follower()
    if leader and cal.repair_torn_tail(results):
        click.echo(f"note: {results}: cut a torn last line (a run stopped mid-write) before resuming", err=True)
    earlier = cal.read_results(results) if leader and results.is_file() else []
    # measured already, as the sweep names them: a collective by its name, an overlap measurement as "overlap"
    done = [(r["link"], r["collective"] if r.get("kind") == "collective" else "overlap", r["n_ranks"], r["size_bytes"])
            for r in earlier if r.get("status") == "ok" and r.get("kind") in ("collective", "overlap")]
    cfg = cal.BenchConfig(sizes=cal.parse_sizes(sizes), warmup=warmup, iters=iters, backend=backend, out=str(results),
                          compute=compute and not any(r.get("kind") == "matmul" for r in earlier), overlap=compute,
                          timeout_s=timeout_s, skip=done)
    if done:
        click.echo(f"resuming: {len(done)} measurements already in {results}", err=True)
    try:
        if under_torchrun:
            cal.run_worker(cfg)
            if int(os.environ["RANK"]) != 0:
                return {"follower": True}
        else:
            cal.launch_local(cfg, nproc)
    except KeyboardInterrupt:
        raise AdvisorError(f"interrupted: measurements so far are in {results}; rerun to resume, "
                           f"or refit them with --from {results}") from None
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None
    info = {"backend": backend, "nproc": nproc, "torch": torch.__version__, "sizes": sizes, "iters": iters}
    if nccl:
        info["nccl"] = nccl
    local = int(os.environ.get("LOCAL_WORLD_SIZE", nproc))
    info["nodes"] = max(1, nproc // local)
    if info["nodes"] == 1:
        info["note"] = "one node: only the intra-node link was measured; inter_node kept from the base profile"
    return info


def main(argv=None) -> None:
    """`python -m advisor.cli_calibrate ...` (what torchrun starts on every rank): the same command, with `advisor`'s
    one-line errors (exit code 2) and its --debug for the traceback (advisor.cli_errors). Under torchrun a rank other
    than 0 names itself, so that the same refusal from every rank reads as theirs, not as one repeated."""
    from advisor.cli_errors import run, take_debug

    args, debug = take_debug(list(sys.argv[1:] if argv is None else argv), calibrate)
    label = f" (rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']})" if _follower() else ""
    run(calibrate, args, "advisor calibrate", debug, label)

if __name__ == "__main__":
    main()
