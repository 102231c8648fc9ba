"""The launch formats ``advisor export`` writes, named as a stack profile lists them (``launch:``): one writer each in
advisor.export.EXPORTERS (tests/test_export_stacks.py checks it). A profile naming another is refused as it loads."""

from __future__ import annotations

from typing import Literal, get_args

LaunchFormat = Literal["accelerate", "deepspeed", "megatron", "megatron-bridge", "torchrun", "torchtitan",
                       "torchtitan-toml", "llm-foundry", "litgpt", "nanotron"]
LAUNCH_FORMATS: tuple[str, ...] = get_args(LaunchFormat)
