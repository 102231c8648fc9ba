"""Files: reading what a user names (one-line errors); atomic writes in advisor.atomic, read from here too."""

from __future__ import annotations

import errno
import os
import re
import stat
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


def read_text(path: str | Path, what: str, error: type[AdvisorError], limit: int = MAX_TEXT_BYTES,
              real: str = "a few KB") -> str:
    """A user-named file's text, or one line naming the file and the problem: not a regular file (a FIFO is
    refused, never waited on; a device is never opened), larger than ``limit`` bytes (by its size, or while
    reading: a file can grow, and /proc files say 0; ``real``: the size of real ones), unreadable, not UTF-8.
    Newlines as Path.read_text gives them."""
    too_big = f"more than the {_size(limit)} a {what} may be (real ones are {real}): give the right file"
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


from advisor.atomic import STDOUT, writable, write_atomic  # noqa: E402,F401  (imported from here by callers)
