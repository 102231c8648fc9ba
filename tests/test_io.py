"""advisor.io.write_atomic: only a new name or a regular file is written, atomically, keeping its mode; what is
not a regular file is refused with one line and left as it was; ``-`` is stdout; an unwritable place is one
line, not a traceback (issue 18, "Security and data safety")."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from _robust import assert_one_line_error, run_main
from advisor.errors import AdvisorError
from advisor.io import write_atomic

ROOT = os.geteuid() == 0
EXPORT = ["export", "--model", "gpt2", "--hw", "dgx-a100", "--gpus", "8", "--format", "deepspeed"]
PLAN = ["plan", "--model", "gpt2", "--hw", "dgx-a100", "--gpus", "8", "--export", "torchrun"]


def _refused(path: Path, *needles: str, text: str = "new\n") -> str:
    """write_atomic refuses ``path`` with one line naming it and each needle."""
    with pytest.raises(AdvisorError) as err:
        write_atomic(path, text)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def _no_temp_left(directory: Path) -> None:
    assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


# -- what is written ---------------------------------------------------------------------------------------
def test_new_file_gets_the_umask_mode_not_mkstemps_0600(tmp_path):
    old = os.umask(0o027)  # a umask other than the usual 022, so the mode cannot be right by accident
    try:
        path = write_atomic(tmp_path / "new.json", "{}\n")
    finally:
        os.umask(old)
    assert path.read_text() == "{}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    _no_temp_left(tmp_path)


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o755, 0o664])
def test_existing_file_keeps_its_mode(tmp_path, mode):
    path = tmp_path / "cfg.yaml"
    path.write_text("old\n")
    path.chmod(mode)
    inode = path.stat().st_ino
    write_atomic(path, "new\n")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == mode
    assert path.stat().st_ino != inode  # replaced through a temporary file, not rewritten in place
    _no_temp_left(tmp_path)


@pytest.mark.skipif(not ROOT, reason="only root can give a file to another owner")
def test_root_keeps_the_existing_owner(tmp_path):
    path = tmp_path / "theirs.json"
    path.write_text("old\n")
    os.chown(path, 1234, 5678)
    write_atomic(path, "new\n")
    assert (path.stat().st_uid, path.stat().st_gid) == (1234, 5678)


def test_text_is_written_as_utf8(tmp_path):
    path = write_atomic(tmp_path / "notes.sh", "# µ-batch → 4\n")
    assert path.read_bytes() == "# µ-batch → 4\n".encode("utf-8")


def test_longest_name_still_gets_a_temporary_file(tmp_path):
    name = "é" * 127  # 254 bytes in UTF-8: a valid name whose temporary sibling must be shortened
    assert write_atomic(tmp_path / name, "ok\n").read_text() == "ok\n"
    _no_temp_left(tmp_path)


def test_dash_is_stdout(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert write_atomic("-", "to stdout\n") == Path("-")
    assert capsys.readouterr().out == "to stdout\n"
    assert list(tmp_path.iterdir()) == []  # no file named "-"


# -- what is refused, and left as it was ----------------------------------------------------------------------
def test_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    _refused(fifo, "FIFO")  # opening a FIFO for writing would block; it is never opened
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    _no_temp_left(tmp_path)


def test_refuses_a_character_device(tmp_path):
    """As `--out /dev/null` run as root did: the device must stay a device. A copy of /dev/null's node
    (major 1, minor 3) is made in tmp_path, so a regression replaces the copy, not the machine's /dev/null
    (a test on /dev/null itself, run against the old writer, did replace it with a 0600 regular file)."""
    if not ROOT:
        pytest.skip("making a device node needs root")
    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("this container may not make device nodes")
    _refused(dev, "character device")
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    _no_temp_left(tmp_path)


def test_refuses_a_socket():
    with tempfile.TemporaryDirectory(prefix="io") as d:  # short: AF_UNIX paths are limited to 108 bytes
        path = Path(d) / "s"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
            _refused(path, "socket")
            assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_refuses_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    _refused(tmp_path / "d", "directory")


@pytest.mark.parametrize("target_exists", [True, False])
def test_refuses_a_symlink_and_names_its_target(tmp_path, target_exists):
    target = tmp_path / "real.json"
    if target_exists:
        target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    _refused(link, "symbolic link", str(target))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert (target.read_text() == "old\n") if target_exists else not target.exists()
    _no_temp_left(tmp_path)


def test_refuses_a_hard_linked_file(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("old\n")
    os.link(a, b)
    _refused(a, "1 other hard link")
    assert a.read_text() == b.read_text() == "old\n" and a.stat().st_ino == b.stat().st_ino


def test_refuses_a_missing_or_non_directory_parent(tmp_path):
    _refused(tmp_path / "missing" / "x.json", "does not exist")
    (tmp_path / "file").write_text("")
    with pytest.raises(AdvisorError, match="Not a directory|is not a directory"):
        write_atomic(tmp_path / "file" / "x.json", "new\n")


# -- places that cannot be written: one line, nothing left behind ---------------------------------------------
@pytest.mark.parametrize("path", ["/proc/advisor-test-new.json", "/proc/version"])
def test_proc_is_one_line(path):
    if not Path("/proc/version").is_file():
        pytest.skip("no /proc")
    _refused(Path(path), "cannot write", "choose another path")


def test_read_only_directory(tmp_path):
    if ROOT:
        pytest.skip("root writes into a read-only directory; /proc covers root")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        _refused(d / "x.json", "Permission denied", "choose a path you may write to")
    finally:
        d.chmod(0o700)


@pytest.fixture
def tiny_fs(tmp_path):
    """A 16 KiB tmpfs (root only, where the container allows mounts): a real full or read-only file system."""
    mounted = []

    def mount(*options: str) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        opts = ",".join(("size=16k", *options))
        run = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True)
        if run.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {run.stderr.decode().strip()}")
        mounted.append(where)
        return where

    if not ROOT or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


def test_full_disk_is_one_line_and_keeps_the_old_file(tiny_fs):
    fs = tiny_fs()
    path = fs / "ds.json"
    path.write_text("old\n")
    _refused(path, "No space left on device", "free space", text="x" * 64 * 1024)  # four times the file system
    assert path.read_text() == "old\n"
    _no_temp_left(fs)


def test_read_only_file_system_is_one_line(tiny_fs):
    fs = tiny_fs("ro")
    _refused(fs / "ds.json", "Read-only file system", "read-only: choose another path")


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_failure_after_the_write_keeps_the_old_file(tmp_path, monkeypatch, where):
    """An error from the fsync (ENOSPC can surface there) or the rename: the old text stays, no temporary file."""
    path = tmp_path / "ds.json"
    path.write_text("old\n")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, where, full)
    with pytest.raises(AdvisorError) as err:
        write_atomic(path, "new\n")
    monkeypatch.undo()
    assert "No space left on device" in str(err.value) and "free space" in str(err.value)
    assert path.read_text() == "old\n"
    _no_temp_left(tmp_path)


# -- through the CLI: `advisor export --out` and `advisor plan --export --out` --------------------------------
def test_cli_export_out_dash_is_stdout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main([*EXPORT, "--out", "-"])
    assert code == 0, err
    assert '"train_batch_size"' in out and "wrote" not in err
    assert list(tmp_path.iterdir()) == []


def test_cli_plan_export_out_dash_is_stdout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main([*PLAN, "--out", "-"])
    assert code == 0, err
    assert "torchrun --nnodes 1" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [EXPORT, PLAN])
def test_cli_refuses_a_fifo_and_a_symlink(tmp_path, args):
    fifo, link = tmp_path / "pipe", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(tmp_path / "elsewhere.json")
    assert_one_line_error([*args, "--out", str(fifo)], str(fifo), "FIFO")
    assert_one_line_error([*args, "--out", str(link)], str(link), "symbolic link")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()


@pytest.mark.parametrize("args", [EXPORT, PLAN])
def test_cli_unwritable_out_is_one_line_exit_2(args):
    if not Path("/proc/version").is_file():
        pytest.skip("no /proc")
    assert_one_line_error([*args, "--out", "/proc/advisor-test.json"], "cannot write", "/proc/advisor-test.json")


def test_exponent_numbers_load_as_yaml_1_2_reads_them():
    """PyYAML (YAML 1.1) leaves 80e9 and 1.5e9 as strings, which a number field would refuse as quoted: load_yaml
    reads them as numbers, as YAML 1.2 and JSON do; a quoted one stays a string, and the 1.1 forms are unchanged."""
    from advisor.io import load_yaml

    assert yaml.safe_load("a: 1.5e9")["a"] == "1.5e9"  # the behaviour worked around
    got = load_yaml('a: 80e9\nb: 1.5e9\nc: "80e9"\nd: 8\ne: 1e-3\nf: .5E+2\ng: 1.0e+3\nh: 1e\ni: 0x10\n'
                    'j: 010\nk: 1:20\nl: 1_000\nm: 0o17\nn: -7\n')
    # YAML 1.1's octal 010 (8) and sexagesimal 1:20 (80) are not what a profile's author means: 10, and a string
    assert got == {"a": 8e10, "b": 1.5e9, "c": "80e9", "d": 8, "e": 1e-3, "f": 50.0, "g": 1000.0, "h": "1e", "i": 16,
                   "j": 10, "k": "1:20", "l": 1000, "m": 15, "n": -7}
    assert yaml.safe_load("j: 010\nk: 1:20") == {"j": 8, "k": 80}  # what PyYAML alone reads
    assert isinstance(got["d"], int) and isinstance(got["a"], float)
