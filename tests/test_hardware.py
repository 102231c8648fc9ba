"""Hardware profiles: load by name or path, round-trip through YAML, reject malformed input."""

import pytest

from advisor.hardware import HardwareError, hardware_from_yaml, hardware_to_yaml, list_profiles, load_hardware

REQUIRED = {"titan-rtx-nvlink", "titan-rtx-pcie", "dgx-a100", "aws-p4d", "dgx-h100", "gcp-a3-mega"}


def test_required_profiles_ship():
    assert REQUIRED <= set(list_profiles())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_round_trip(name, tmp_path):
    hw = load_hardware(name)
    text = hardware_to_yaml(hw)
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    assert load_hardware(str(p)) == hw
    assert hw.source


def test_datasheet_figures():
    # NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense, NVLink3 600 GB/s bidirectional = 300 per direction.
    a100 = load_hardware("dgx-a100")
    assert a100.gpu.peak_flops_per_s("bf16") == 312e12
    assert a100.intra_node.bandwidth_bytes_per_s == 300e9
    # 8x 200 Gb/s HDR = 1600 Gb/s = 200 GB/s per node, 25 GB/s per GPU.
    assert a100.inter_node_bytes_per_s_per_gpu == pytest.approx(25e9)
    # AWS p4d: 400 Gb/s EFA per node.
    assert load_hardware("aws-p4d").inter_node.bandwidth_bytes_per_s == pytest.approx(50e9)


@pytest.mark.parametrize("text,match", [
    ("name: [", "malformed YAML"),
    ("- a\n- b", "mapping"),
    ("name: x\n", "required"),
])
def test_malformed(text, match):
    with pytest.raises(HardwareError, match=match):
        hardware_from_yaml(text)


def test_negative_and_extra_keys_rejected():
    good = hardware_to_yaml(load_hardware("dgx-a100"))
    with pytest.raises(HardwareError, match="memory_GiB"):
        hardware_from_yaml(good.replace("memory_GiB: 80.0", "memory_GiB: -80"))
    with pytest.raises(HardwareError, match="unknown key"):
        hardware_from_yaml(good + "\nbogus: 1\n")


def test_unknown_profile_suggests():
    with pytest.raises(HardwareError, match="did you mean dgx-a100"):
        load_hardware("dgx-a10")
