"""Where a calibration writes: the profile YAML (atomically, never over a shipped profile), and the lock that
keeps two calibrations from sharing one --out.

The lock is ``<profile stem>.lock`` beside the profile, held (flock) for the whole run and removed at its end; the
kernel releases it however the process ends, so a killed run never blocks the next one. A second run with
the same --out is refused in one line naming the first one's pid. Without flock (not POSIX) runs are not locked.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from advisor.calibrate.measurements import CalibrationError
from advisor.hardware import Hardware
from advisor.io import write_atomic


def refuse_shipped(path: str | Path) -> Path:
    """Calibration never overwrites a shipped profile (hardware_profiles/)."""
    from advisor.hardware import profile_dirs

    # the path as given, made absolute but not resolved: a symbolic link at --out is refused by write_atomic (its
    # target named), never written through; the shipped folders are compared on the resolved path
    p = Path(os.path.abspath(Path(path).expanduser()))
    for d in profile_dirs():
        if p.resolve().parent == d.resolve() or p.parent.resolve() == d.resolve():
            raise CalibrationError(f"{path}: refusing to overwrite a shipped profile directory; choose another --out path")
    if p.suffix not in (".yaml", ".yml"):
        raise CalibrationError(f"{str(path) or repr('')}: --out must end in .yaml (the profile; results go beside it as "
                               ".jsonl): give e.g. --out mynode.yaml")
    return p


def make_folder(path: Path) -> None:
    """The folder of --out, created if missing; a one-line error where it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where the folder would be (or on the way to it)
        raise CalibrationError(f"--out {path}: {path.parent} is not a folder (a file is in the way); choose another "
                               "--out") from None
    except OSError as exc:
        raise CalibrationError(f"--out {path}: cannot create the folder {path.parent} ({exc.strerror or exc}); "
                               "choose a writable folder") from None


@contextmanager
def lock_output(path: str | Path) -> Iterator[Path]:
    """Hold the lock of the profile at ``path`` (its folder created) while the block runs; yields the lock file.

    Opening the lock file is also the first write into --out's folder, so an unwritable --out is refused here,
    before a sweep that can take minutes."""
    p = Path(path)
    make_folder(p)
    lock = p.with_suffix(".lock")  # node.yaml and node.yml share node.jsonl: one lock for both
    try:
        import fcntl
    except ImportError:  # no flock on this OS: calibrations are not locked
        yield lock
        return
    fd = _acquire(p, lock, fcntl)
    try:
        yield lock
    finally:
        try:
            os.unlink(lock)  # while still held: a run waiting on this file finds it gone and takes a new one
        except OSError:
            pass
        os.close(fd)


def _acquire(p: Path, lock: Path, fcntl) -> int:
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CalibrationError(f"--out {p}: cannot write in {p.parent} ({exc.strerror or exc}); "
                                   "choose a writable folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            who = f"pid {holder}, " if holder.isdigit() else ""
            raise CalibrationError(f"--out {p} is in use by another calibration ({who}lock {lock}); wait for it to "
                                   "finish or choose another --out") from None
        try:  # its last holder may have removed the file between our open and flock: lock the one at the path
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def write_profile(hw: Hardware, path: str | Path, header: str = "") -> Path:
    """The profile as YAML at ``path`` (its folder created), checked to load back before it is written."""
    from advisor.hardware import hardware_from_yaml, hardware_to_yaml

    p = refuse_shipped(path)
    text = header + hardware_to_yaml(hw)
    hardware_from_yaml(text, origin=str(p))  # what we write must load back
    make_folder(p)
    try:
        write_atomic(p, text)
    except OSError as exc:
        raise CalibrationError(f"--out {p}: cannot write it ({exc.strerror or exc}); choose a writable folder "
                               "(the measurements are kept: refit them with --from)") from None
    return p
