"""Hardware profiles: load by name or path, round-trip through YAML, reject malformed input."""

import pytest
import yaml

from advisor.hardware import (PROFILE_DIR, CommFit, HardwareError, hardware_from_yaml, hardware_to_yaml, list_profiles,
                              load_hardware)

REQUIRED = {"titan-rtx-nvlink", "titan-rtx-pcie", "dgx-a100", "aws-p4d", "dgx-h100", "gcp-a3-mega", "dgx-h200",
            "aws-p6-b200"}


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


def test_dgx_b200_is_the_hgx_b200_board_on_infiniband():
    # NVIDIA DGX B200 datasheet: 8x B200 (1,440 GB), 8x single-port ConnectX-7 at up to 400 Gb/s; the board's GPUs and
    # NVSwitch fit are p6-b200's, its network not (EFA's 209 us fitted start-up per call)
    dgx, p6 = load_hardware("dgx-b200"), load_hardware("aws-p6-b200")
    assert (dgx.gpu, dgx.intra_node, dgx.efficiency) == (p6.gpu, p6.intra_node, p6.efficiency)
    assert dgx.inter_node.kind == "infiniband" and dgx.inter_node_bytes_per_s_per_gpu == pytest.approx(50e9)
    assert dgx.inter_node.fit.latency_us == 8.4 < p6.inter_node.fit.latency_us


def test_h200_datasheet_figures():
    # NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s; the H100 SXM's compute (989 TFLOP/s bf16 dense, 1979
    # fp8); NVLink4 900 GB/s bidirectional. aiconfigurator's systems/h200_sxm.yaml: mem_capacity 151397597184 bytes.
    # DGX H200: 8x ConnectX-7 400 Gb/s = 3200 Gb/s per node, 50 GB/s per GPU.
    h200 = load_hardware("dgx-h200")
    assert h200.gpu.memory_bytes == 151397597184
    assert h200.gpu.memory_bandwidth_bytes_per_s == 4.8e12
    assert h200.gpu.peak_tflops == {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}
    assert h200.intra_node.bandwidth_bytes_per_s == 450e9
    assert h200.inter_node.bandwidth_Gbps == 3200 and h200.inter_node_bytes_per_s_per_gpu == pytest.approx(50e9)
    assert h200.gpus_per_node == 8


def test_b200_datasheet_figures():
    # AWS p6-b200.48xlarge: 8x B200, 1,440 GB HBM3e (180 GiB each: aiconfigurator's systems/b200_sxm.yaml,
    # mem_capacity 193273528320 bytes), 8 TB/s each, NVLink5 1.8 TB/s bidirectional = 900 GB/s per direction,
    # EFA v4 3200 Gb/s per node. Dense peaks: bf16/fp16 2250 and fp8 4500 TFLOP/s (aiconfigurator, NVIDIA-authored);
    # HGX B200 datasheet, 8 GPUs: TF32 18 PFLOP/s with sparsity -> 1125 dense per GPU, FP32 600 -> 75 per GPU.
    b200 = load_hardware("aws-p6-b200")
    assert b200.gpu.memory_bytes == 193273528320 and 8 * b200.gpu.memory_GiB == 1440  # AWS's 1,440 GB
    assert b200.gpu.memory_bandwidth_bytes_per_s == 8e12
    assert b200.gpu.peak_flops_per_s("bf16") == 2250e12 and b200.gpu.peak_flops_per_s("fp16") == 2250e12
    assert b200.gpu.peak_flops_per_s("fp8") == 4500e12
    assert b200.gpu.peak_flops_per_s("tf32") == 18e15 / 2 / 8 and b200.gpu.peak_flops_per_s("fp32") == 600e12 / 8
    assert b200.intra_node.bandwidth_bytes_per_s == 1800e9 / 2
    assert b200.inter_node.kind.value == "efa" and b200.inter_node.bandwidth_Gbps == 3200
    assert b200.inter_node_bytes_per_s_per_gpu == pytest.approx(50e9)  # one 400 Gb/s NIC per GPU
    assert b200.price_per_gpu_hour_usd is None  # no sourced price: --objective cost asks for one


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


# --- base: a profile over another one ------------------------------------------------------------------

CHILD = "name: mine\ndescription: DGX A100 nodes but only 4x 200 Gb/s HDR per node\nbase: dgx-a100\n"


def test_gcp_a3_mega_is_dgx_h100_with_its_own_network():
    """gcp-a3-mega.yaml gives only what differs from dgx-h100.yaml (same HGX H100 node, another network)."""
    a3, dgx = load_hardware("gcp-a3-mega"), load_hardware("dgx-h100")
    for block in ("gpu", "gpus_per_node", "intra_node", "efficiency"):
        assert getattr(a3, block) == getattr(dgx, block), block
    assert a3.price_per_gpu_hour_usd is None  # dgx-h100's is an assumption, not Google's rate
    assert a3.inter_node != dgx.inter_node and a3.inter_node.kind.value == "ethernet"
    assert a3.inter_node.bandwidth_Gbps == 1600 and a3.name == "gcp-a3-mega" and a3.source != dgx.source
    # its fit is its own: no key of dgx-h100's InfiniBand fit leaks in
    own = yaml.safe_load((PROFILE_DIR / "gcp-a3-mega.yaml").read_text())["inter_node"]["fit"]
    assert a3.inter_node.fit == CommFit(**own)


def test_dgx_h200_is_dgx_h100_with_its_own_gpu_memory_and_nvlink_fit():
    """dgx-h200.yaml gives only what differs from dgx-h100.yaml: the H200's memory, its NVSwitch fit (the H200 sweeps),
    the half-precision GEMM rate (aiconfigurator's H200/H100 ratio), the GPU's per-kernel floor (its thin GEMMs in the
    same tables: 3.4 us, the H100's 3.7) and no price; the rest is inherited."""
    h200, h100 = load_hardware("dgx-h200"), load_hardware("dgx-h100")
    assert h200.gpu.peak_tflops == h100.gpu.peak_tflops and h200.gpus_per_node == h100.gpus_per_node
    assert h200.inter_node == h100.inter_node  # no H200 multi-node sweep: the DGX H100 network and its fit
    assert h200.intra_node.bandwidth_GBps == h100.intra_node.bandwidth_GBps and h200.intra_node.fit != h100.intra_node.fit
    assert h200.intra_node.fit.ll_bandwidth_ratio == 0.0  # its fit replaces dgx-h100's whole: no low-latency path
    own = ("matmul_max", "matmul_kernel_floor_us")
    same = {k: v for k, v in h200.efficiency.model_dump().items() if k not in own}
    assert same == {k: v for k, v in h100.efficiency.model_dump().items() if k not in own}
    assert (h200.efficiency.matmul_kernel_floor_us["bf16"], h100.efficiency.matmul_kernel_floor_us["bf16"]) == (3.4, 3.7)
    assert h200.price_per_gpu_hour_usd is None and h100.price_per_gpu_hour_usd == 4.0


def test_child_overrides_one_number_only(tmp_path):
    base = load_hardware("dgx-a100")
    (tmp_path / "mine.yaml").write_text(CHILD + "inter_node:\n  bandwidth_Gbps: 800\n")
    hw = load_hardware(tmp_path / "mine.yaml")
    assert hw.inter_node.bandwidth_Gbps == 800
    assert hw.inter_node.fit == base.inter_node.fit  # fractions of the link rate: kept with the new rate
    expected = base.model_copy(update={"name": "mine", "description": hw.description, "source": hw.source,
                                       "inter_node": base.inter_node.model_copy(update={"bandwidth_Gbps": 800})})
    # the base's source stays, said to be the base's (advisor.profiles: it describes the values this one inherits)
    assert hw == expected and hw.source == f"what this profile does not set is base dgx-a100's: {base.source}"


def test_nested_merge_keeps_siblings():
    hw = hardware_from_yaml(CHILD + "gpu:\n  peak_tflops: {bf16: 300}\nefficiency:\n  matmul_max: {fp32: 0.5}\n")
    base = load_hardware("dgx-a100")
    assert hw.gpu.peak_tflops == {**base.gpu.peak_tflops, "bf16": 300.0}
    assert hw.gpu.memory_GiB == base.gpu.memory_GiB
    assert hw.efficiency.matmul_max == {**base.efficiency.matmul_max, "fp32": 0.5}
    assert hw.efficiency.memory_bandwidth == base.efficiency.memory_bandwidth


def test_non_mapping_values_replace():
    hw = hardware_from_yaml(CHILD + "source: my own measurements\ngpu:\n  peak_tflops: {fp32: 10}\n")
    assert hw.source == "my own measurements"
    assert hw.gpu.peak_tflops == {**load_hardware("dgx-a100").gpu.peak_tflops, "fp32": 10.0}


def test_null_drops_a_block():
    base = load_hardware("dgx-a100")
    assert base.price_per_gpu_hour_usd == 2.0 and base.efficiency.elementwise_bandwidth == 0.757
    hw = hardware_from_yaml(CHILD + "price_per_gpu_hour_usd: null\nefficiency: {elementwise_bandwidth: null}\n")
    assert hw.price_per_gpu_hour_usd is None and hw.efficiency.elementwise_bandwidth is None
    assert hw.efficiency.memory_bandwidth == base.efficiency.memory_bandwidth  # only the nulled key goes
    # a dropped fit must be replaced: the base's describes another network
    with pytest.raises(HardwareError, match=r"^<yaml>: inter_node.fit: required key is missing$"):
        hardware_from_yaml(CHILD + "inter_node: {kind: ethernet, fit: null}\n")


def test_a_child_fit_replaces_the_base_fit_whole():
    # A fit is one measurement of one network: keys the child's fit leaves out take their defaults, never
    # the base's values (dgx-a100's intra-node fit has a 3 MiB loop and an LL128 path; this one has neither).
    base = load_hardware("dgx-a100").intra_node.fit
    assert base.loop_MiB_per_rank == 3.0 and base.ll128_bandwidth_ratio > 0
    hw = hardware_from_yaml(CHILD + "intra_node:\n  fit: {latency_us: 10.0, latency_per_hop_us: 1.0, "
                                    "bandwidth_efficiency: 0.9}\n")
    assert hw.intra_node.fit == CommFit(latency_us=10.0, latency_per_hop_us=1.0, bandwidth_efficiency=0.9)
    assert hw.intra_node.bandwidth_GBps == load_hardware("dgx-a100").intra_node.bandwidth_GBps


def test_relative_path_base(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "parent.yaml").write_text(CHILD + "gpus_per_node: 4\n")
    (tmp_path / "sub" / "child.yaml").write_text(CHILD.replace("base: dgx-a100", "base: parent.yaml"))
    hw = load_hardware(tmp_path / "sub" / "child.yaml")  # parent.yaml beside child.yaml, not in the cwd
    assert hw.gpus_per_node == 4 and hw.gpu == load_hardware("dgx-a100").gpu
    monkeypatch.chdir(tmp_path)  # text with no file: relative to the current directory
    assert hardware_from_yaml(CHILD.replace("base: dgx-a100", "base: sub/parent.yaml")).gpus_per_node == 4
    with pytest.raises(HardwareError, match="'parent.yaml' not found"):
        hardware_from_yaml(CHILD.replace("base: dgx-a100", "base: parent.yaml"))


def test_cycle_is_one_line_naming_the_chain(tmp_path):
    (tmp_path / "a.yaml").write_text(CHILD.replace("base: dgx-a100", "base: b.yaml"))
    (tmp_path / "b.yaml").write_text(CHILD.replace("base: dgx-a100", "base: a.yaml"))
    with pytest.raises(HardwareError) as info:
        load_hardware(tmp_path / "a.yaml")
    a = tmp_path / "a.yaml"
    assert str(info.value) == f"{a}: base cycle {a} -> b.yaml -> a.yaml: remove one of these base: keys"


def test_depth_limit(tmp_path):
    for i in range(9):
        base = f"p{i + 1}.yaml" if i < 8 else "dgx-a100"
        (tmp_path / f"p{i}.yaml").write_text(CHILD.replace("base: dgx-a100", f"base: {base}"))
    assert load_hardware(tmp_path / "p1.yaml").name == "mine"  # 8 levels of base below p1: p2 .. p8, dgx-a100
    with pytest.raises(HardwareError, match=r"base p1.yaml -> .* -> p8.yaml: more than 8 levels of base"):
        load_hardware(tmp_path / "p0.yaml")


@pytest.mark.parametrize("text,needle", [
    (CHILD.replace("dgx-a100", "dgx-a10"), "base: unknown hardware profile 'dgx-a10': did you mean dgx-a100"),
    (CHILD.replace("base: dgx-a100", "base: nowhere.yaml"), "base: hardware profile file 'nowhere.yaml' not found"),
    (CHILD.replace("base: dgx-a100", "base: 42"), "base must be a profile name or a path to a .yaml file, got int"),
    (CHILD.replace("base: dgx-a100", "base: [dgx-a100]"), "got list"),
    (CHILD.replace("name: mine\n", ""), "needs its own name (the base's describes another system): add name:"),
    (CHILD.replace("description:", "descr:"), "needs its own description"),
    (CHILD + "gpu: {memory_GiB: -1}\n", "gpu.memory_GiB: Input should be greater than 0"),  # merged, validated as ever
])
def test_bad_base_is_one_line(text, needle):
    with pytest.raises(HardwareError) as info:
        hardware_from_yaml(text, origin="child.yaml")
    assert str(info.value).startswith("child.yaml: ") and needle in str(info.value) and "\n" not in str(info.value)


def test_malformed_base_yaml_names_the_base(tmp_path):
    (tmp_path / "bad.yaml").write_text("gpu: [")
    (tmp_path / "child.yaml").write_text(CHILD.replace("base: dgx-a100", "base: bad.yaml"))
    with pytest.raises(HardwareError, match=r"child.yaml: base bad.yaml: malformed YAML at line 1: fix the syntax$"):
        load_hardware(tmp_path / "child.yaml")


def test_child_round_trips_flattened(tmp_path):
    hw = hardware_from_yaml(CHILD + "inter_node:\n  bandwidth_Gbps: 800\n")
    text = hardware_to_yaml(hw)
    assert "base" not in yaml.safe_load(text) and "gpu" in yaml.safe_load(text)
    assert hardware_from_yaml(text) == hw
    assert hardware_from_yaml(hardware_to_yaml(load_hardware("gcp-a3-mega"))) == load_hardware("gcp-a3-mega")


def test_builtin_base_resolves_from_the_packaged_profiles(tmp_path, monkeypatch):
    """An installed wheel has only advisor/hardware_profiles/: gcp-a3-mega's base: dgx-h100 is found there."""
    import advisor.hardware as hardware

    for name in ("dgx-h100", "gcp-a3-mega"):
        (tmp_path / f"{name}.yaml").write_text((PROFILE_DIR / f"{name}.yaml").read_text())
    expected = load_hardware("gcp-a3-mega")
    monkeypatch.setattr(hardware, "PROFILE_DIR", tmp_path / "absent")
    monkeypatch.setattr(hardware, "_PACKAGED_PROFILE_DIR", tmp_path)
    monkeypatch.chdir(tmp_path / "..")
    assert hardware.list_profiles() == ["dgx-h100", "gcp-a3-mega"]
    assert load_hardware("gcp-a3-mega") == expected


def test_sm_counts_are_the_datasheets():
    """SMs (advisor.parallel.tensor: what userbuffers' overlap kernels take from a GEMM): A100 108 and H100 SXM5 132
    (their architecture whitepapers), H200 the H100's die, B200 148, Blackwell Ultra 160 (NVIDIA's 'Inside Blackwell
    Ultra' blog); the Ada and GA10x cards their datasheets' CUDA cores / 128; AWS publishes none for the A10G."""
    want = {"dgx-a100": 108, "dgx-h100": 132, "dgx-h200": 132, "aws-p5": 132, "dgx-b200": 148, "gb200-nvl72": 148,
            "dgx-b300": 160, "gb300-nvl72": 160, "l40s": 142, "l4": 58, "rtx-4090": 128, "rtx-3090-nvlink": 82,
            "rtx-a6000-nvlink": 84, "a10g": None}
    assert {name: load_hardware(name).gpu.sm_count for name in want} == want


def test_grand_teton_h100_is_the_h100_die_with_its_own_memory_and_network_kind():
    """meta-grand-teton-h100.yaml: the H100s of torchtitan's tables (reference/lowprec_runs.yaml notes: 96GB HBM2e,
    2.4 TB/s, 500 W, 400 Gb/s RDMA per GPU): the GH100's peaks, NVLink node and efficiency fractions are dgx-h100's;
    the memory is its own (96 GB at the 80 GB part's nominal-to-usable ratio, 2,400 GB/s), the per-GPU network 400 Gb/s."""
    gt, dgx = load_hardware("meta-grand-teton-h100"), load_hardware("dgx-h100")
    assert gt.gpu.peak_tflops == dgx.gpu.peak_tflops and gt.gpu.sm_count == dgx.gpu.sm_count == 132
    assert gt.intra_node == dgx.intra_node and gt.efficiency == dgx.efficiency
    assert gt.gpu.memory_bandwidth_GBps == 2400 and gt.gpu.memory_GiB == pytest.approx(96 * 79.6 / 80, abs=0.1)
    assert gt.inter_node.bandwidth_Gbps / gt.gpus_per_node == 400 and gt.inter_node.fit == dgx.inter_node.fit
    assert gt.price_per_gpu_hour_usd is None and gt.host is None
