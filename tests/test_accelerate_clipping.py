"""The accelerate export clips as the plan was costed, at every ZeRO stage, read back through the libraries themselves.

ZeRO-1 goes through accelerate's DeepSpeed plugin, whose clip is the YAML's gradient_clipping: `accelerate launch`
exports it as ACCELERATE_GRADIENT_CLIPPING (accelerate 1.15 utils/launch.py:571-572), DeepSpeedPlugin writes it into the
ds config where truthy (utils/dataclasses.py:1233-1235, 1321-1322), and accelerator.clip_grad_norm_ under DeepSpeed only
reads the engine's norm (accelerator.py:3023-3027). A 0.0 is left out, and DeepSpeedConfig then takes its default, 1.0
(deepspeed 0.19.8 runtime/constants.py:203): a profile costed without clipping cannot be written there, and the export
refuses it, naming the DeepSpeed JSON, which says 0.0. DDP (ZeRO-0) and FSDP (ZeRO-2/3) clip in the script (the
Trainer's max_grad_norm, 1.0 by default: transformers training_args.py:866): the YAML has no key for it, and a note
says --max_grad_norm 0 where none was costed."""

from __future__ import annotations

import json

import pytest

from advisor.export import ExportError, export
from advisor.hardware import load_hardware
from advisor.layout import Plan
from advisor.model import load_model
from advisor.training import TrainingSetup

MODEL, H100 = load_model("llama3-8b"), load_hardware("dgx-h100")
SETUP = TrainingSetup(seq_len=2048, micro_batch=1, global_batch=8, precision="bf16-mixed")
NOTE = "pass --max_grad_norm 0 to the Trainer"


def _no_clip(tmp_path) -> str:
    path = tmp_path / "hf-noclip.yaml"
    path.write_text("base: hf-trainer\nname: hf-noclip\ndescription: t\nengine: {clip_grad_norm: false}\n")
    return str(path)


def _deepspeed_config_of(yaml_text: str, tmp_path, monkeypatch):
    """DeepSpeedConfig of what `accelerate launch --config_file` gives the DeepSpeed engine: the launcher's
    environment, DeepSpeedPlugin, accelerate's own fill of its "auto" values (accelerator.py:2223-2232, 2355), and
    DeepSpeed 0.19.8's parser over 8 data-parallel ranks."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env
    import deepspeed.runtime.config as ds_config

    path = tmp_path / "accelerate_config.yaml"
    path.write_text(yaml_text)
    args, defaults, mp = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "x.py"]))
    args.deepspeed_fields_from_accelerate_config = ",".join(list(defaults.deepspeed_config) + (["mixed_precision"] if mp else []))
    for key, value in prepare_deepspeed_cmd_env(args)[1].items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    plugin.deepspeed_config_process(must_match=False, **{
        "gradient_clipping": 1.0, "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
        "train_micro_batch_size_per_gpu": 1, "train_batch_size": 8})

    class MPU:
        def get_data_parallel_world_size(self):
            return 8

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    return ds_config.DeepSpeedConfig(plugin.deepspeed_config, mpu=MPU())


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_every_zero_stage_clips_as_costed(zero, tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    plan = Plan(dp=8, zero=zero)
    on = export("accelerate", MODEL, H100, plan, SETUP, 1, 8, "hf-trainer")
    kind = {0: "MULTI_GPU", 1: "DEEPSPEED"}.get(zero, "FSDP")
    assert f"distributed_type: {kind}" in on.text and NOTE not in on.text
    if zero == 1:  # hf-trainer clips (engine.clip_grad_norm): DeepSpeed's ZeRO-1 optimizer at 1.0
        parsed = _deepspeed_config_of(on.text, tmp_path, monkeypatch)
        assert (parsed.zero_optimization_stage, parsed.gradient_clipping) == (1, 1.0)
        # a 0.0 in that YAML still clips at 1.0: why the profile costed without clipping is refused there
        zeroed = on.text.replace("gradient_clipping: 1.0", "gradient_clipping: 0.0")
        assert zeroed != on.text and _deepspeed_config_of(zeroed, tmp_path, monkeypatch).gradient_clipping == 1.0
        with pytest.raises(ExportError, match=r"cannot write .*: use --format deepspeed$"):
            export("accelerate", MODEL, H100, plan, SETUP, 1, 8, _no_clip(tmp_path))
        import deepspeed.runtime.config as ds_config  # the format it names: DeepSpeed reads 0.0, its norm off too
        cfg = json.loads(export("deepspeed", MODEL, H100, plan, SETUP, 1, 8, _no_clip(tmp_path)).text)
        cfg.pop("_advisor_notes")
        monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
        parsed = ds_config.DeepSpeedConfig(cfg, mpu=type("MPU", (), {"get_data_parallel_world_size": lambda s: 8})())
        assert parsed.gradient_clipping == 0.0 and parsed.zero_config.compute_grad_norm is False
        assert export(None, MODEL, H100, plan, SETUP, 1, 8, _no_clip(tmp_path)).kind == "deepspeed"
    else:  # the script clips: the Trainer's max_grad_norm, 1.0 unless told, as the note says where none was costed
        from transformers import TrainingArguments

        assert TrainingArguments.__dataclass_fields__["max_grad_norm"].default == 1.0
        off = export("accelerate", MODEL, H100, plan, SETUP, 1, 8, _no_clip(tmp_path))
        assert f"distributed_type: {kind}" in off.text and NOTE in off.text and "gradient_clipping" not in off.text
