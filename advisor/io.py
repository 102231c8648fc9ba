"""Files: reading what a user names (one-line errors) and atomic writes (a crash never leaves a half-written file)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from advisor.errors import AdvisorError


def is_file(path: str | Path) -> bool:
    """Path.is_file that answers False for names the OS refuses (too long, NUL bytes) instead of raising."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def read_text(path: str | Path, what: str, error: type[AdvisorError]) -> str:
    """A user-named file's text, or one line naming the file and the problem (unreadable, not UTF-8)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file (not UTF-8); give a {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror or exc.__class__.__name__})") from None


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory and os.replace."""
    target = Path(path)
    if target.is_dir():
        raise AdvisorError(f"{target} is a directory; give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise AdvisorError(f"directory {parent} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target
