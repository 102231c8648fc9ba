"""Files: reading what a user names (one-line errors) and atomic writes (a crash never leaves a half-written file)."""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Optional

import yaml

from advisor.errors import AdvisorError

# Reading is bounded: only regular files are read (a FIFO would wait for a writer, a device may never end), at
# most a stated number of bytes, checked before and while reading; YAML is parsed with a bound on the values its
# aliases expand to and on its depth, so that a few hundred bytes cannot ask for gigabytes.

# The largest text a user-named input may be. Hugging Face config.json files are a few KB and json's C parser
# reads 16 MiB in under a second (0.8 s for 18 MiB of labels): 16 MiB refuses only the wrong file, and bounds
# the memory a read takes to 16 MiB of bytes plus the decoded text (a 2 GB file read whole took 4.2 GB, 9-11 s).
MAX_TEXT_BYTES = 16 * 2**20
# Profiles are parsed by PyYAML's pure-Python scanner, which reads ~1.2 MB/s of comment or long scalar (16 MiB
# took 14 s): 1 MiB keeps the worst case under a second and is 150x the largest shipped profile (6.7 KB).
MAX_YAML_BYTES = 2**20
# Values (scalars, lists, mappings) in one YAML document after its aliases are expanded. The largest shipped
# profile has 139; 10,000 leaves room for any calibration provenance, and costs ~0.5 s to validate and print
# (`advisor profiles show`: 25-55 us a value; a 321-byte alias bomb of 1.1e7 values took 265 s and 4.6 GB).
MAX_YAML_NODES = 10_000
# Nesting levels of one YAML document. Profiles nest 4 deep; the composer recurses 3 frames a level, so
# 64 levels stay far from Python's recursion limit (a deeper document was a RecursionError).
MAX_YAML_DEPTH = 64


def is_file(path: str | Path) -> bool:
    """Path.is_file that answers False for names the OS refuses (too long, NUL bytes) instead of raising."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def _kind(mode: int) -> Optional[str]:
    """What a file of this ``st_mode`` is, when it is not a regular file (None when it is)."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def not_a_file(path: str | Path) -> Optional[str]:
    """What is at ``path`` when something is there that is not a regular file, as a phrase for an error
    ("a directory", "a FIFO (named pipe)", "a character device", "a broken symbolic link to x", ...);
    None when ``path`` is a regular file (after symbolic links) or nothing is there. Never opens ``path``."""
    try:
        return _kind(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        try:
            return f"a broken symbolic link to {os.readlink(path)!r}" if os.path.islink(path) else None
        except (OSError, ValueError):
            return None
    except ValueError:  # a NUL byte in the name: nothing can be there
        return None
    except OSError as exc:  # a loop of links, a folder on the way that cannot be searched
        return None if exc.errno == errno.ENAMETOOLONG else f"unreachable ({exc.strerror or exc.__class__.__name__})"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def read_text(path: str | Path, what: str, error: type[AdvisorError], limit: int = MAX_TEXT_BYTES) -> str:
    """A user-named file's text, or one line naming the file and the problem: not a regular file (a FIFO is
    refused, never waited on; a device is never opened), larger than ``limit`` bytes (by its size, or while
    reading: a file can grow, and /proc files say 0), unreadable, not UTF-8. Newlines as Path.read_text gives them."""
    too_big = f"more than the {_size(limit)} a {what} may be (real ones are a few KB): give the right file"
    kind = not_a_file(path)
    if kind is not None:
        raise error(f"{path}: {kind}, not a file: give a {what}")
    try:
        # O_NONBLOCK: if a FIFO took the file's place since the check, opening it does not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if _kind(st.st_mode) is not None:
                raise error(f"{path}: {_kind(st.st_mode)}, not a file: give a {what}")
            if st.st_size > limit:
                raise error(f"{path}: {_size(st.st_size)}, {too_big}")
            data = fh.read(limit + 1)
    except AdvisorError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise error(f"{path}: cannot read the {what} ({getattr(exc, 'strerror', None) or exc.__class__.__name__})") from None
    if len(data) > limit:
        raise error(f"{path}: {too_big} (it grew while read, or did not say its size)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file (not UTF-8); give a {what}") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as text mode reads


class YAMLRefused(yaml.YAMLError):
    """A YAML document that parses but is refused; the message is the problem and its fix, without the file's name."""


class YAMLTooLarge(YAMLRefused):
    """A YAML document refused before it is built: too long, too many values once its aliases are expanded,
    or nested too deep."""


class YAMLDuplicateKey(YAMLRefused):
    """A mapping that names a key twice: PyYAML keeps the last silently, so a profile's earlier value would vanish."""


class _BoundedSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader whose composer counts the values the document holds once every alias is expanded
    (an alias counts the values of what it names) and its depth, and stops at the bounds: the count is kept
    while composing, so an alias bomb is stopped at its first lines, before any expansion happens."""

    def __init__(self, text: str, max_nodes: int, max_depth: int):
        super().__init__(text)
        self.max_nodes, self.max_depth = max_nodes, max_depth
        self.n_nodes, self.n_aliases, self.depth = 0, 0, 0
        self.expanded: dict[int, int] = {}  # id(anchored node) -> values it holds, aliases expanded

    def _count(self, n: int, mark) -> None:
        self.n_nodes += n
        if self.n_nodes > self.max_nodes:
            line = f" (line {mark.line + 1})" if mark is not None else ""
            if self.n_aliases:
                raise YAMLTooLarge(f"its aliases (*name) expand to more than {self.max_nodes:,} values{line}: "
                                   "write the repeated values out, or repeat fewer")
            raise YAMLTooLarge(f"more than {self.max_nodes:,} values{line}: is this the right file?")

    def construct_mapping(self, node, deep=False):
        """SafeLoader's, refusing a key written twice in one mapping (a merge key's values may be overridden)."""
        seen: dict = {}
        for key, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise YAMLDuplicateKey(f"key {key.value!r} is written twice in one mapping (lines {seen[key.value]} "
                                           f"and {key.start_mark.line + 1}): keep one")
                seen[key.value] = key.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = self.anchors.get(event.anchor)
            if node is not None:  # an undefined alias is the composer's error
                if id(node) not in self.expanded:
                    raise YAMLTooLarge(f"alias *{event.anchor} (line {event.start_mark.line + 1}) is inside the "
                                       f"value it names, which would never end: remove it")
                self.n_aliases += 1
                self._count(self.expanded[id(node)], event.start_mark)
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > self.max_depth:
            raise YAMLTooLarge(f"nested more than {self.max_depth} levels deep (line {event.start_mark.line + 1}): "
                               "flatten it")
        before = self.n_nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        if getattr(event, "anchor", None) is not None:
            self.expanded[id(node)] = self.n_nodes - before
        return node


# Numbers as YAML 1.2 (and JSON) reads them, not as PyYAML's YAML 1.1: 1.1 reads 80e9 and 1.5e9 as strings (its floats
# need a dot and a signed exponent), 010 as octal 8 and 1:20 as sexagesimal 80, none of which a profile's author means.
# Here ints are decimal (underscores allowed, as 1.1 does), 0x hex or 0o octal, and floats take any exponent; 1:20 and
# 0b101 stay strings, which a number field refuses (advisor.spec), as it does a quoted "80e9".
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BoundedSafeLoader.yaml_implicit_resolvers = {  # SafeLoader's, less its int and float rules (a copy: SafeLoader keeps its own)
    ch: [(tag, rx) for tag, rx in rules if tag not in (_INT, _FLOAT)]
    for ch, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_BoundedSafeLoader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9][0-9_]*|0x[0-9a-fA-F]+|0o[0-7]+)$"), list("-+0123456789"))
_BoundedSafeLoader.add_implicit_resolver(
    _FLOAT, re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                       r"|\.(?:nan|NaN|NAN))$"), list("-+.0123456789"))


def _int_1_2(loader, node):
    """An int as YAML 1.2 reads it: a leading zero is decimal (1.1 read 010 as octal 8)."""
    text = loader.construct_scalar(node).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if len(digits) > 100:  # int() refuses 4,300 digits with a ValueError; no profile holds a 100-digit count
        raise YAMLRefused(f"line {node.start_mark.line + 1}: an integer of {len(digits):,} digits: no value of a "
                          "profile has one; check the file")
    if digits.startswith(("0x", "0o")):
        return sign * int(digits[2:], 16 if digits[1] == "x" else 8)
    return sign * int(digits, 10)


_BoundedSafeLoader.add_constructor(_INT, _int_1_2)


def load_yaml(text: str, max_nodes: int = MAX_YAML_NODES, max_depth: int = MAX_YAML_DEPTH,
              max_chars: int = MAX_YAML_BYTES):
    """yaml.safe_load with bounds (see MAX_YAML_*): raises YAMLTooLarge for a document over them, and
    yaml.YAMLError for a malformed one. A few anchors and aliases, as people write them, load as before."""
    if len(text) > max_chars:
        raise YAMLTooLarge(f"{len(text):,} characters, more than the {_size(max_chars)} a YAML input may be: "
                           "is this the right file?")
    loader = _BoundedSafeLoader(text, max_nodes, max_depth)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


# What a path that is not a regular file is, for the refusal (os.lstat: the name itself, links not followed).
_NOT_A_FILE = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))
# The fix to name for an OSError while writing; any other errno: choose another path.
_WRITE_FIXES = {errno.ENOSPC: "free space on that file system or choose another path",
                errno.EDQUOT: "free space within your quota or choose another path",
                errno.EROFS: "the file system is read-only: choose another path",
                errno.EACCES: "choose a path you may write to", errno.EPERM: "choose a path you may write to"}
STDOUT = "-"  # --out - : the text goes to standard output (a file named "-" is ./-)


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
    if os.fspath(path).endswith(("/", os.sep)):  # Path() drops the slash: "x/" would write a file named x
        raise AdvisorError(f"cannot write {_shown(path)}: a path ending in / names a directory; give a file name")
    target = Path(path)
    existing = _replaceable(target)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist; create it first"
        raise AdvisorError(f"cannot write {_shown(target)}: directory {_shown(parent)} {what}")
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
