"""A config.json object read key by key with its types checked, each refusal one line naming the file and key.

Types are JSON's: an integer key takes a JSON integer (never a string such as "64", a float such as 12.5 or
NaN, or true), a boolean key takes true or false (never the string "false", which Python reads as true, nor 0
or 1); transformers' own strict configs refuse the same. An absent key, or null, takes the default transformers'
config class gives it for that family, except the keys without one (the model's shape), which are required.
Keys whose null differs from their absence (DeepSeek's q_lora_rank, Mistral's sliding_window: absent gives a
value, null gives none) are read with ``nullable_int``. Every key read is remembered, so that a key which would
change the parameters and that the family's adapter never read is refused (advisor.model.families.check_unread).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from advisor.model.spec import ModelError

REQUIRED = object()


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ModelSpec's bound on n_layers; any other integer of a config (a width, a vocabulary, a count of experts) at most 10^12
LAYER_COUNT_KEYS, LAYER_COUNT_MAX, INT_MAX = ("num_hidden_layers", "n_layer", "n_layers", "num_layers"), 100_000, 10**12


class Config:
    def __init__(self, raw: dict, origin: str, family: str, prefix: str = ""):
        self.raw, self.origin, self.family, self.prefix = raw, origin, family, prefix
        self.read: set[str] = set()

    def error(self, message: str) -> ModelError:
        return ModelError(f"{self.origin}: {message}")

    def _lookup(self, keys: tuple[str, ...]) -> tuple[str, Any]:
        """The first of ``keys`` (a key and its aliases) set to something other than null."""
        self.read.update(keys)
        for key in keys:
            if self.raw.get(key) is not None:
                return key, self.raw[key]
        return keys[0], None

    def _name(self, key: str) -> str:
        return repr(f"{self.prefix}{key}")

    def int(self, *keys: str, default: Any = REQUIRED, minimum: int = 1, null: bool = True) -> Any:
        """An integer key (aliases after the first); absent or null: ``default``, or refused where required; a null
        refused where the family's model code computes with the value as it is (``null`` False)."""
        key, value = self._lookup(keys)
        if value is None and not null and any(k in self.raw for k in keys):
            raise self.error(f"{self._name(keys[0])} must be an integer, not null (the {self.family} model multiplies by "
                             "it): give a number, 0 for none")
        if value is None:
            if default is REQUIRED:
                raise self.error(f"config.json lacks {self._name(keys[0])}, which a {self.family} model needs")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{self._name(key)} must be an integer, not {_show(value)}")
        if value < minimum:
            raise self.error(f"{self._name(key)} must be at least {minimum}, got {value}")
        most = LAYER_COUNT_MAX if key in LAYER_COUNT_KEYS else INT_MAX
        if value > most:  # checked before any per-layer list is built from it (a 10^20-layer list never ends)
            got = f"{value:.3g}" if value < 10**300 else f"a number of {len(str(value)):,} digits"
            raise self.error(f"{self._name(key)} must be at most {most:,}, got {got}")
        return value

    def nullable_int(self, key: str, absent: Optional[int], minimum: int = 1) -> Optional[int]:
        """An integer key whose null means none, and whose absence means ``absent``."""
        if key not in self.raw:
            self.read.add(key)
            return absent
        return self.int(key, default=None, minimum=minimum)

    def bool(self, key: str, default: bool) -> bool:
        _, value = self._lookup((key,))
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"{self._name(key)} must be true or false (a JSON boolean), not {_show(value)}")
        return value

    def float(self, key: str, default: Optional[float]) -> Optional[float]:
        _, value = self._lookup((key,))
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(f"{self._name(key)} must be a finite number, not {_show(value)}")
        return float(value)

    def str(self, key: str, default: str, allowed: Optional[tuple[str, ...]] = None) -> str:
        _, value = self._lookup((key,))
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(f"{self._name(key)} must be a string, not {_show(value)}")
        if allowed is not None and value not in allowed:
            raise self.error(f"{self._name(key)} = {value[:40]!r} is not supported for {self.family}: "
                             f"one of {', '.join(allowed)}")
        return value

    def list(self, key: str, of: type, length: Optional[int] = None) -> Optional[list]:
        """A list of ``of`` (int or str), or None where absent or null; ``length`` checked where given."""
        _, value = self._lookup((key,))
        if value is None:
            return None
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, of) for v in value):
            kind = "integers" if of is int else "strings"
            raise self.error(f"{self._name(key)} must be a list of {kind}, not {_show(value)}")
        if length is not None and len(value) != length:
            raise self.error(f"{self._name(key)} has {len(value)} entries for {length} layers")
        return value

    def sub(self, key: str) -> "Config":
        """A nested object (MPT's attn_config), read with the same rules; absent or null: empty."""
        _, value = self._lookup((key,))
        if value is not None and not isinstance(value, dict):
            raise self.error(f"{self._name(key)} must be a JSON object, not {_show(value)}")
        return Config(value or {}, self.origin, self.family, f"{self.prefix}{key}.")

    def refuse(self, key: str, value: Any, why: str) -> ModelError:
        return self.error(f"{self._name(key)} = {_show(value)} is not supported: {why}")

    def expect(self, key: str, value: Any, supported: Any, why: str) -> None:
        """Refuse a value other than the one transformers' model of this family builds."""
        if value != supported:
            raise self.refuse(key, value, why)
