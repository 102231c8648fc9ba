"""`advisor calibrate`'s failures as a user meets them, through both entry points: `advisor calibrate` (advisor.cli)
and `python -m advisor.cli_calibrate`, what torchrun starts on every rank (advisor/cli_calibrate.py's docstring).
Each is one line and exit code 2 naming the value and the fix; --debug, before or after the command, re-raises.
Before: `python -m advisor.cli_calibrate` had no --debug ("No such option"), let a ValueError through as a
traceback and printed an AdvisorError's every line; `advisor calibrate --debug` was a traceback of "No such option
'--debug'"; --sizes 1e30 killed rank 0 with `[rank0]: "` as its reason; --iters 1e21 waited 120 s to be called
hung; --from /dev/zero was "not found", a 2 GB file was read whole; --judge-from x said "sizes: cannot read 'X'".
"""

from __future__ import annotations

import contextlib
import io
import os
import time

import pytest

from _robust import assert_one_line_error, tried
from advisor.errors import AdvisorError


def _calibrate_main(args: list[str]) -> tuple[int, str]:
    """advisor.cli_calibrate.main in-process: (exit code, stderr)."""
    from advisor.cli_calibrate import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


def _one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2 and err.count("\n") == 1 and err.startswith("error") and "Traceback" not in err, (code, err)
    for needle in needles:
        assert needle in err, (needle, err)


def test_the_torchrun_entry_point_answers_as_advisor_does(tmp_path, monkeypatch):
    """The same one-line refusal from both entry points; only the first line of a longer message; a ValueError from
    inside the command one line that points at --debug; --debug re-raises."""
    import advisor.cli_calibrate as cli

    tried("calibrate", 4)
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    args = ["--from", str(src), "--out", str(tmp_path / "o.yaml")]
    _one_line(*_calibrate_main(args), f"error: {src}: no measurements to fit")
    assert_one_line_error(["calibrate", *args], f"error: {src}: no measurements to fit")

    def two_lines(*a, **k):
        raise AdvisorError("first line\nsecond line")

    monkeypatch.setattr(cli, "_calibrate", two_lines)
    code, err = _calibrate_main(args)
    assert (code, err) == (2, "error: first line\n")

    def a_bug(*a, **k):
        raise ValueError("bad value\nmore")

    monkeypatch.setattr(cli, "_calibrate", a_bug)
    code, err = _calibrate_main(args)
    assert (code, err) == (2, "error: ValueError: bad value (rerun with --debug for the traceback)\n")
    with pytest.raises(ValueError, match="bad value"):
        _calibrate_main(["--debug", *args])


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_after_the_command_shows_the_traceback(where, tmp_path):
    """`advisor calibrate --debug ...` was click's "No such option: --debug" raised as a traceback (exit 1)."""
    from advisor.cli import main

    tried("calibrate")
    args = ["calibrate", "--from", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o.yaml")]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    with pytest.raises(AdvisorError, match="nope.jsonl' not found"):
        main(args)


def test_a_torchrun_follower_names_its_rank(tmp_path, monkeypatch):
    """Under torchrun every rank checks the options: rank 1's refusal says it is rank 1's, not rank 0's repeated."""
    tried("calibrate")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, err = _calibrate_main(["--backend", "gloo", "--sizes", "1X", "--out", str(tmp_path / "o.yaml")])
    assert (code, err) == (2, "error (rank 1 of 2): --sizes '1X': cannot read '1X'; use e.g. 1K:1G, 4M, or 1K,64K,1M "
                              "(bytes, K/M/G binary)\n")


BAD_SWEEPS = [
    # a size no GPU of the base holds: dgx-a100's A100 80GB (hardware_profiles/dgx-a100.yaml)
    (["--sizes", "1e30"], ["--sizes 1e30: 1e+30 bytes is more than a dgx-a100 GPU holds (80 GiB)"]),
    (["--sizes", "inf"], ["--sizes 'inf': cannot read 'inf'"]),
    (["--sizes", "1K:1T"], ["--sizes '1K:1T': cannot read '1T'", "K/M/G"]),
    # 1e21 calls of >= 1e-7 s (advisor.calibrate.measurements.MIN_TIME_S) outlast the 120 s --timeout
    (["--iters", "1000000000000000000000"], ["--iters 1000000000000000000000 / --warmup 3", "--timeout 120 s"]),
    (["--judge-from", "1e999"], ["--judge-from '1e999': cannot read '1e999'"]),
]


@pytest.mark.parametrize("opts,needles", BAD_SWEEPS, ids=[" ".join(o) for o, _ in BAD_SWEEPS])
def test_bad_sweep_numbers_are_refused_before_any_worker(opts, needles, tmp_path, monkeypatch):
    import advisor.calibrate.launch as launch

    tried("calibrate")
    monkeypatch.setattr(launch, "_WORKER", "import sys; sys.exit(97)")
    t = time.perf_counter()
    err = assert_one_line_error(["calibrate", "--out", str(tmp_path / "o.yaml"), "--nproc", "2", *opts], *needles)
    assert "exit 97" not in err and time.perf_counter() - t < 30


@pytest.mark.parametrize("backend", ["gloo", "auto"])
def test_gloo_sizes_are_checked_against_host_memory(backend, tmp_path, monkeypatch):
    """--sizes were checked against the base's GPU (80 GiB for dgx-a100) only: on a CPU-only gloo sweep the buffers are
    CPU tensors (advisor.calibrate.microbench run_worker), each local rank holding one of the size, so --sizes 1K:64G
    with 2 ranks started workers on a 23 GiB machine. Now host memory (os.sysconf, advisor.calibrate.host) bounds
    ranks x size before any worker starts; auto is gloo where no GPU is visible."""
    pytest.importorskip("torch")
    import torch

    import advisor.calibrate.host as host
    import advisor.calibrate.launch as launch
    from advisor.cli_calibrate import _check_host_sizes

    tried("calibrate")
    monkeypatch.setattr(launch, "_WORKER", "import sys; sys.exit(97)")
    monkeypatch.setattr(host, "host_memory_GiB", lambda: 1.5)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # 2 x 1 GiB > 1.5 GiB, though an A100 80GB holds it; 1.5 GiB / 2 ranks: 512 MiB each at most
    assert_one_line_error(["calibrate", "--out", str(tmp_path / "o.yaml"), "--nproc", "2", "--backend", backend,
                           "--sizes", "1K:1G"], "--sizes 1K:1G: 2 gloo ranks each hold a 1.07e+09-byte buffer in this "
                           "machine's memory (1.5 GiB); end the sizes at 512M or below, e.g. 1K:512M")
    _check_host_sizes("1K:512M", 2)  # 1 GiB of the 1.5: runs
    with pytest.raises(AdvisorError, match="end the sizes at 256M or below"):
        _check_host_sizes("4M,1G", 4)


def test_measurement_files_that_are_no_files_or_too_large(tmp_path):
    """read_results goes through advisor.io.read_text: only regular files, at most 16 MiB (advisor/io.py:23)."""
    tried("calibrate", 4)
    out = str(tmp_path / "o.yaml")
    assert_one_line_error(["calibrate", "--from", "/dev/zero", "--out", out], "/dev/zero: a character device, not a file")
    os.mkfifo(tmp_path / "pipe.jsonl")
    assert_one_line_error(["calibrate", "--from", str(tmp_path / "pipe.jsonl"), "--out", out], "a FIFO (named pipe)")
    for name in ("big.jsonl", "all_reduce_2gpu.csv"):
        with open(tmp_path / name, "wb") as fh:
            fh.truncate(2 * 2**30)  # sparse: 2 GiB said, nothing on disk
        assert_one_line_error(["calibrate", "--from", str(tmp_path / name), "--out", out],
                              f"{name}: 2 GiB, more than the 16 MiB", "at most a few hundred KB")


def test_out_that_cannot_be_a_profile_path(tmp_path):
    tried("calibrate", 2)
    src = tmp_path / "r.jsonl"
    src.write_text("")
    assert_one_line_error(["calibrate", "--from", str(src), "--out", ""], "'': --out must end in .yaml",
                          "give e.g. --out mynode.yaml")
    assert_one_line_error(["calibrate", "--from", str(src), "--out", str(src / "o.yaml")],
                          f"{src} is not a folder (a file is in the way)")


def test_a_dead_workers_reason_is_its_exception_not_what_torch_appends(tmp_path):
    """A TypeError raised in torch's C++ ends its log with "Exception raised from ...", frames and a lone quote: the
    reason given was `[rank0]: "`."""
    from advisor.calibrate.launch import _last_line

    log = io.StringIO('[rank0]: Traceback (most recent call last):\n[rank0]:   File "x.py", line 85\n'
                      "[rank0]: TypeError: ones(): argument 'size' failed to unpack the object at pos 1 with error "
                      '"Overflow when unpacking long long\n[rank0]: Exception raised from THPUtils_unpackLong at '
                      "python_numbers.h:79 (most recent call first):\n[rank0]: <omitting python frames>\n"
                      "[rank0]: frame #16: _start + 0x21\n[rank0]: \"\n")
    assert _last_line(log).startswith("TypeError: ones(): argument 'size' failed to unpack")
    assert _last_line(io.StringIO("one\nlast words\n")) == "last words"


def test_out_that_is_a_symbolic_link_is_refused_not_written_through(tmp_path):
    """--out naming a symbolic link is refused, as every --out is (advisor.atomic write_atomic): refuse_shipped resolved
    the path, so the profile was written over the link's target (a link planted at a shared --out redirects a run)."""
    from pathlib import Path

    from click.testing import CliRunner

    from advisor.cli_calibrate import calibrate

    src = tmp_path / "csv"
    src.mkdir()
    a100 = Path("/work/shared/reference/a100-nccl")  # as tests/test_calibrate.py reads it
    for k in (2, 4, 8):
        lines = (a100 / f"all_reduce_{k}gpu.csv").read_text().splitlines()
        (src / f"all_reduce_{k}gpu.csv").write_text("\n".join([lines[0]] + lines[1::32]) + "\n")
    target = tmp_path / "victim.yaml"
    target.write_text("keep: me\n")
    link = tmp_path / "link.yaml"
    os.symlink(target, link)
    res = CliRunner().invoke(calibrate, ["--from", str(src), "--out", str(link)])
    assert isinstance(res.exception, AdvisorError) and "is a symbolic link (to " in str(res.exception)
    assert target.read_text() == "keep: me\n" and link.is_symlink()
