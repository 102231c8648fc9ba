"""Where a calibration writes: the profile YAML (atomically, never into the shipped hardware_profiles/)."""

from __future__ import annotations

from pathlib import Path

from advisor.calibrate.measurements import CalibrationError
from advisor.hardware import Hardware
from advisor.io import write_atomic


def refuse_shipped(path: str | Path) -> Path:
    """Calibration never overwrites a shipped profile (hardware_profiles/)."""
    from advisor.hardware import profile_dirs

    p = Path(path).expanduser().resolve()
    for d in profile_dirs():
        if p.parent == d.resolve():
            raise CalibrationError(f"{path}: refusing to overwrite a shipped profile directory; choose another --out path")
    if p.suffix not in (".yaml", ".yml"):
        raise CalibrationError(f"{path}: --out must end in .yaml (the profile); results go beside it as .jsonl")
    return p


def write_profile(hw: Hardware, path: str | Path, header: str = "") -> Path:
    """The profile as YAML at ``path`` (its folder created), checked to load back before it is written."""
    from advisor.hardware import hardware_from_yaml, hardware_to_yaml

    p = refuse_shipped(path)
    text = header + hardware_to_yaml(hw)
    hardware_from_yaml(text, origin=str(p))  # what we write must load back
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(p, text)
    return p
