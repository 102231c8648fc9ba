"""Hugging Face config.json, read offline into a ModelSpec by its family's adapter (advisor.model.families)."""

from __future__ import annotations

import json
from pathlib import Path

from advisor.io import read_text
from advisor.model.families import spec_from_config
from advisor.model.spec import ModelError, ModelSpec


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json offline: any family in advisor.model.families.FAMILIES."""
    origin = str(path)
    # a byte-order mark (Windows editors write one) is not part of the JSON; an integer of more digits than Python
    # converts (4,300) is no model's size: both named, not a ValueError
    text = read_text(path, "Hugging Face config.json", ModelError).removeprefix("\ufeff")
    try:
        cfg = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ModelError(f"{origin}: malformed JSON ({exc.__class__.__name__}: {str(exc).splitlines()[0]})") from None
    except ValueError as exc:  # int() beyond sys.get_int_max_str_digits
        raise ModelError(f"{origin}: a number of thousands of digits ({str(exc).splitlines()[0][:60]}): no model has "
                         "one; check the file") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{origin}: config.json must be a JSON object")
    p = Path(path)
    # a model folder's config.json is named by its folder (Qwen2-7B/config.json); any other file by its stem
    name = (p.resolve().parent.name if p.name == "config.json" else p.stem) or p.stem
    return model_from_hf_dict(cfg, name, origin)


def model_from_hf_dict(cfg: dict, name: str, origin: str = "config.json") -> ModelSpec:
    """A config.json already parsed (the catalogue's cited configs, tests); ``origin`` prefixes every error."""
    return spec_from_config(cfg, name, origin)
