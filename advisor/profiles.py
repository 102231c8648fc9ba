"""Profiles: named YAML files shipped with advisor (hardware, training stacks), found by name or path, with
``base:`` inheritance. Each kind of profile validates the merged mapping with its own pydantic model.

A profile file may start from another with ``base:`` (a built-in name, or a path relative to the file) and
give only what differs: mappings merge key by key, recursively; any other value (number, string, list)
replaces the base's, and ``null`` drops the base's value. ``name`` and ``description`` must be the child's
own; everything else is inherited. Keys listed in ``ProfileKind.whole`` (a link's ``fit``: one measurement
of one network) replace the base's value whole, never key by key. At most 8 levels, no cycles.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

from advisor.errors import AdvisorError, format_validation_error
from advisor.io import MAX_YAML_BYTES, YAMLRefused, is_file, load_yaml, not_a_file, read_text

_MAX_BASE_DEPTH = 8  # a deeper chain of base: profiles is a mistake, not a design
_CACHE: dict = {}  # (file, text, model) -> validated profile
_CACHE_SIZE = 64
# text -> its parsed YAML: the bounded loader is pure Python (~60 ms for a stack profile), and a file with a base:
# is loaded again each time (its base may have changed), which re-reads its text and its base's, not re-parses them
_PARSED: dict = {}


@dataclass(frozen=True)
class ProfileKind:
    """One kind of profile: where the shipped files are, what to call them, the error to raise."""

    what: str  # "hardware profile"
    dirs: Callable[[], list[Path]]  # searched in order (read at each call: tests point it elsewhere)
    error: type[AdvisorError]
    list_command: str  # the command that lists them ("advisor profiles")
    whole: frozenset[str] = frozenset()  # mapping keys a child replaces whole
    reserved: frozenset[str] = frozenset()  # names that mean something else where a profile is named (--stack auto)
    # what a child may not change over its base's merged mapping: (base, child) -> why, or None
    check: Optional[Callable[[dict, dict], Optional[str]]] = None

    def names(self) -> list[str]:
        found: set[str] = set()
        for d in self.dirs():
            if d.is_dir():
                found.update(p.stem for p in d.glob("*.yaml"))
        return sorted(found)

    def shipped(self, name: str) -> Optional[Path]:
        """The shipped file of a built-in name, or None."""
        for d in self.dirs():
            p = d / f"{name}.yaml"
            if is_file(p):
                return p
        return None

    def find(self, name: str) -> Path:
        found = self.shipped(name)
        if found is not None:
            return found
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.4)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(self.names())}"
        raise self.error(f"unknown {self.what} {name[:200]!r}: {hint} (see `{self.list_command}`, "
                         "or pass a path to a .yaml file)")

    def file(self, name: str, directory: Path = Path()) -> Path:
        """The YAML file a profile name or path names; a relative path resolves against ``directory``.
        A name that is a path to a directory, FIFO or device (and no built-in name) is refused as what it is."""
        path = directory / name
        if is_file(path):
            return path
        explicit = name.endswith((".yaml", ".yml")) or "/" in name
        if not explicit and self.shipped(name) is not None:  # a built-in name wins over a folder of that name
            return self.find(name)
        where = "" if directory == Path() or Path(name).is_absolute() else f" in {directory}"
        kind = not_a_file(path) if name else None  # '' is no path (Path('') is the current folder)
        if kind is not None:
            raise self.error(f"{self.what} {name[:200]!r}{where} is {kind}, not a file: give the path to a .yaml "
                             f"file or a built-in name (see `{self.list_command}`)")
        if explicit:
            raise self.error(f"{self.what} file {name[:200]!r} not found{where}")
        return self.find(name)

    def read(self, path: Path) -> str:
        return read_text(path, f"{self.what} YAML", self.error, limit=MAX_YAML_BYTES)

    def load(self, name_or_path: str | Path, model):
        """The profile a built-in name or a path names, validated by ``model`` (a pydantic class). The same text
        is not parsed twice: profiles are frozen, and a validation run asks for the same few thousands of times
        (a file with ``base:`` is parsed each time, as its base may have changed)."""
        path = self.file(str(name_or_path))
        text = self.read(path)
        key = (str(path), text, model)
        if key in _CACHE:
            return _CACHE[key]
        profile = self.from_yaml(text, model, origin=str(path), path=path)
        name = profile.name
        shipped = self.shipped(name)
        # output names a profile by its name: a file that changes a built-in under its name would be reported as it
        if name in self.reserved:
            raise self.error(f"{path}: name {name!r} means something else where a {self.what} is named: give the file "
                             "a name of its own (name: ...)")
        if shipped is not None and shipped.resolve() != path.resolve() and self.load(shipped, model) != profile:
            raise self.error(f"{path}: name {name!r} is a built-in {self.what}'s and this one differs from it: give the "
                             "file a name of its own (name: ...)")
        if "base" not in text:
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[key] = profile
        return profile

    def from_yaml(self, text: str, model, origin: str = "<yaml>", path: str | Path | None = None):
        """A profile from YAML text, over its ``base:`` profile if it names one (module docstring)."""
        directory = Path(path).parent if path is not None else Path()
        identity = Path(path).resolve() if path is not None else None
        data = self._data(text, [(origin, identity)], directory)
        try:
            return model.model_validate(data)
        except Exception as exc:  # pydantic.ValidationError, reported as one line
            raise self.error(f"{origin}: {format_validation_error(exc)}") from None

    def _chain_error(self, chain: list[tuple[str, Optional[Path]]], problem: str) -> AdvisorError:
        """One line: the profile the user named, the base chain down to the file at fault, the problem."""
        via = f"base {' -> '.join(shown for shown, _ in chain[1:])}: " if len(chain) > 1 else ""
        return self.error(f"{chain[0][0]}: {via}{problem}")

    def _data(self, text: str, chain: list[tuple[str, Optional[Path]]], directory: Path) -> dict:
        """The raw mapping of the last profile in ``chain`` (shown name, resolved file), merged over its base's."""
        try:
            data = _parsed(text)
        except YAMLRefused as exc:
            raise self._chain_error(chain, str(exc)) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise self._chain_error(chain, f"malformed YAML{where}: fix the syntax") from None
        if not isinstance(data, dict):
            raise self._chain_error(chain, f"a {self.what} must be a YAML mapping, got {type(data).__name__}")
        if "base" not in data:
            return data
        base = data.pop("base")
        if not isinstance(base, str):
            raise self._chain_error(chain, f"base must be a profile name or a path to a .yaml file, got {type(base).__name__}")
        missing = [key for key in ("name", "description") if data.get(key) is None]
        if missing:
            raise self._chain_error(chain, f"a profile with base: needs its own {' and '.join(missing)} (the base's "
                                           f"describes another system): add {missing[0]}: ...")
        if len(chain) > _MAX_BASE_DEPTH:
            raise self._chain_error(chain, f"more than {_MAX_BASE_DEPTH} levels of base: flatten the chain")
        try:
            path = self.file(base, directory)
            base_text = self.read(path)
        except AdvisorError as exc:
            raise self._chain_error(chain, f"base: {exc}") from None
        chain = chain + [(base[:200] if base.isprintable() else repr(base[:200]), path.resolve())]
        if any(path.resolve() == seen for _, seen in chain[:-1]):
            raise self.error(f"{chain[0][0]}: base cycle {' -> '.join(shown for shown, _ in chain)}: "
                             "remove one of these base: keys")
        merged_base = self._data(base_text, chain, path.parent)
        why = self.check(merged_base, data) if self.check is not None else None
        if why:
            raise self._chain_error(chain[:-1], why)
        merged = merge(merged_base, data, self.whole)
        if data.get("source") is None and isinstance(merged_base.get("source"), str):  # the base's sources its own values
            merged["source"] = f"what this profile does not set is base {chain[-1][0]}'s: {merged_base['source']}"
        return merged


def fitted_latency(base: dict, child: dict) -> Optional[str]:
    """A hardware profile's link whose latency the child changes while it keeps the base's ``fit``: a link's
    ``latency_us`` is its datasheet figure, and the fit's start-ups are what the model costs, so the change would cost
    nothing, silently."""
    for key in ("intra_node", "inter_node"):
        link, inherited = child.get(key), base.get(key)
        if (isinstance(link, dict) and link.get("latency_us") is not None and "fit" not in link and isinstance(inherited, dict)
                and isinstance(inherited.get("fit"), dict) and link["latency_us"] != inherited.get("latency_us")):
            return (f"{key}.latency_us {link['latency_us']!r} is not costed: the base's {key}.fit is (its start-up "
                    f"fit.latency_us, measured): give a whole {key}.fit of your own, e.g. from advisor calibrate")
    return None


def merge(base: dict, child: dict, whole: frozenset[str] = frozenset()) -> dict:
    """``child`` over ``base``: mappings merge key by key, recursively, except the keys in ``whole`` (a child's
    value replaces the base's whole); a ``null`` drops the base's value; any other value replaces it.
    Neither argument is modified."""
    out = dict(base)
    for key, value in child.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict) and key not in whole:
            out[key] = merge(base[key], value, whole)
        else:
            out[key] = value
    return out


def to_yaml(profile) -> str:
    """YAML that the profile's loader accepts back unchanged (round trip tested)."""
    return yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False, width=100)


def _parsed(text: str):
    """``load_yaml(text)``, parsed once per text; each caller gets its own copy (``_data`` pops and merges keys)."""
    if text not in _PARSED:
        data = load_yaml(text)
        if len(_PARSED) >= _CACHE_SIZE:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[text] = data
    return copy.deepcopy(_PARSED[text])
