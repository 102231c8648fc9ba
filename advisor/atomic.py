"""Atomic writes: a crash never leaves a half-written file, and only a new name or an existing regular file is
written (advisor.io reads what a user names)."""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Optional

from advisor.errors import AdvisorError

# What a path that is not a regular file is, for the refusal (os.lstat: the name itself, links not followed).
_NOT_A_FILE = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))
# The fix to name for an OSError while writing; any other errno: choose another path.
_WRITE_FIXES = {errno.ENOSPC: "free space on that file system or choose another path",
                errno.EDQUOT: "free space within your quota or choose another path",
                errno.EROFS: "the file system is read-only: choose another path",
                errno.EACCES: "choose a path you may write to", errno.EPERM: "choose a path you may write to"}
STDOUT = "-"  # --out - : the text goes to standard output (a file named "-" is ./-)


def writable(path: str | os.PathLike) -> tuple[Path, Optional[os.stat_result], Path]:
    """(the target, its stat where it exists, its directory) of a path write_atomic may write, else the one-line
    AdvisorError it would raise: checked before a long run (advisor probe) as well as before the write."""
    if not os.fspath(path).strip():  # Path("") is ".": the error would name the working directory
        raise AdvisorError("cannot write to an empty file name: give --out a file name (or - for stdout)")
    if os.fspath(path).endswith(("/", os.sep)):  # Path() drops the slash: "x/" would write a file named x
        raise AdvisorError(f"cannot write {_shown(path)}: a path ending in / names a directory; give a file name")
    target = Path(path)
    existing = _replaceable(target)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist; create it first"
        raise AdvisorError(f"cannot write {_shown(target)}: directory {_shown(parent)} {what}")
    return target, existing, parent


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: a temporary file in the same directory, fsync, os.replace.

    ``-`` writes to standard output instead. Otherwise only a new name or an existing regular file is
    written, and a reader sees the old text or the new, never a mix. An existing file keeps its
    permission bits (rwx for user, group, others) and, where the OS lets us, its owner; a new file gets
    0o666 less the umask, as ``open()`` would give it. Refused with one line naming the path and what it
    is, before anything is written:

    - a directory, a character or block device, a FIFO, a socket (os.replace would swap the node for a
      regular file: ``--out /dev/null`` run as root would replace the device);
    - a regular file with other hard links (os.replace would split the link: the other names keep the
      old text);
    - a symbolic link, whatever it points to. Links are refused, not followed: following one lets a link
      planted in a shared directory (``/tmp/ds.json -> /etc/passwd``) redirect a root run onto any file,
      and replacing it would silently turn the link into a file. The message names the link's target so
      the caller can pass that path instead. Links in the directory part of the path are followed as
      usual.

    Every OSError (no permission, a read-only or full file system, /proc) becomes one ``AdvisorError``
    line naming the path and the fix; the temporary file is removed and the target left as it was.
    """
    if os.fspath(path) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return Path(STDOUT)
    target, existing, parent = writable(path)
    mode = stat.S_IMODE(existing.st_mode) & 0o777 if existing else 0o666 & ~_umask()
    tmp = None
    try:
        # the name is cut to 48 characters (at most 192 bytes in UTF-8) so that the temporary name, with its
        # dots, 8 random characters and ".tmp", stays under NAME_MAX (255 bytes on Linux) for any valid target
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:48]}.", suffix=".tmp", dir=parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), mode)  # mkstemp creates 0600
            if existing and (existing.st_uid, existing.st_gid) != (os.geteuid(), os.getegid()):
                _keep_owner(fh.fileno(), existing)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise AdvisorError(f"cannot write {_shown(target)} ({exc.strerror or exc.__class__.__name__}): "
                           f"{_WRITE_FIXES.get(exc.errno, 'choose another path')}") from None
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
    _sync_dir(parent)
    return target


def _replaceable(target: Path) -> os.stat_result | None:
    """The stat of the regular file ``target`` names, None for a new name; AdvisorError for anything else."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # a parent that is a file, a name too long, a NUL byte
        why = getattr(exc, "strerror", None) or str(exc)
        raise AdvisorError(f"cannot write {_shown(target)} ({why}): choose another path") from None
    if stat.S_ISLNK(st.st_mode):
        raise AdvisorError(f"{_shown(target)} is a symbolic link (to {_shown(os.readlink(target))}); links are not "
                           "followed: give the file's own path or a new name")
    if not stat.S_ISREG(st.st_mode):
        what = next((name for test, name in _NOT_A_FILE if test(st.st_mode)), "not a regular file")
        raise AdvisorError(f"{_shown(target)} is {what}, not a regular file; give a file name (or - for stdout)")
    if st.st_nlink > 1:
        raise AdvisorError(f"{_shown(target)} has {st.st_nlink - 1} other hard link(s); replacing it would leave "
                           "them with the old text: give another path, or remove the other links first")
    return st


def _umask() -> int:
    """The process umask (read by setting and restoring it: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _keep_owner(fd: int, existing: os.stat_result) -> None:
    """Give the new file the old one's owner and group where allowed (root may; others keep their own)."""
    try:
        os.fchown(fd, existing.st_uid, existing.st_gid)
    except PermissionError:
        pass


def _sync_dir(parent: Path) -> None:
    """fsync the directory so the rename itself survives a crash; some file systems refuse, which is harmless."""
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _shown(path: str | os.PathLike) -> str:
    """A path as the user typed it, quoted where it holds a newline or other control character (one line)."""
    text = os.fspath(path)
    return text if text.isprintable() else repr(text)
