"""Robustness of hardware profiles (YAML given to --hw): every bad profile is refused at load time with one
line that names the file, the key and the value, and `advisor` exits 2.

Bad inputs tried (BAD_PROFILES below, plus generated mutations of every shipped profile): malformed YAML,
non-mapping documents, unsafe YAML tags, alias bombs, deep nesting, binary files, empty files, missing and
extra keys, wrong units (memory_GB for memory_GiB, bandwidth in bits where bytes are meant), numbers as
strings or booleans, zero/negative/NaN/inf numbers, unknown enums and precisions, a link with no or two
bandwidths, a bad `base:` (unknown name, missing file, itself, not a string, no name of its own, a bad merged value).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _robust import assert_one_line_error, run_main, tried
from advisor.api import estimate
from advisor.hardware import PROFILE_DIR, HardwareError, hardware_from_yaml, list_profiles, load_hardware

GOOD = yaml.safe_load((PROFILE_DIR / "dgx-a100.yaml").read_text())


def mutated(path: str, value=None, delete: bool = False) -> dict:
    """GOOD with the dotted key ``path`` set to ``value`` (or deleted)."""
    d = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    if delete:
        del node[last]
    else:
        node[last] = value
    return d


# (YAML text, substrings the one-line error must contain)
BAD_PROFILES = [
    ("gpu: [unclosed", ["malformed YAML at line"]),
    ("a: b: c", ["malformed YAML"]),
    ("\t- tab", ["malformed YAML"]),
    ("", ["must be a YAML mapping, got NoneType"]),
    ("- 1\n- 2", ["must be a YAML mapping, got list"]),
    ("just a string", ["must be a YAML mapping, got str"]),
    ("!!python/object/apply:os.system ['echo pwned']", ["malformed YAML"]),  # safe_load refuses tags
    ("!!python/name:builtins.eval ''", ["malformed YAML"]),
    ("a: &a [1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
     "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: [*d, *d, *d, *d, *d, *d, *d, *d, *d]",
     ["aliases (*name) expand to more than 10,000 values (line 5)"]),  # alias bomb: 15,712 values, was loaded
    ("[" * 5000 + "]" * 5000, ["nested more than 64 levels deep (line 1)"]),  # was a RecursionError
    (yaml.safe_dump(mutated("gpu", delete=True)), ["gpu: required key is missing"]),
    (yaml.safe_dump(mutated("source", delete=True)), ["source: required key is missing"]),
    (yaml.safe_dump(mutated("gpus_per_node", delete=True)), ["gpus_per_node: required key is missing"]),
    (yaml.safe_dump(mutated("intra_node.fit", delete=True)), ["intra_node.fit: required key is missing"]),
    (yaml.safe_dump(mutated("gpu.memory_GB", 80)), ["gpu.memory_GB: unknown key"]),  # wrong unit in the key
    (yaml.safe_dump(mutated("gpu.memory_GiB", "80 GiB")), ["gpu.memory_GiB", "'80 GiB'"]),
    # a quoted number is the wrong type (pydantic's lax mode read "80e9" as 8e10 and "8" as 8)
    (yaml.safe_dump(GOOD).replace("memory_GiB: 80", "memory_GiB: '80e9'"), ["gpu.memory_GiB", "not the string '80e9'"]),
    (yaml.safe_dump(mutated("gpus_per_node", "8")), ["gpus_per_node", "not the string '8'"]),
    (yaml.safe_dump(mutated("gpu.peak_tflops.bf16", "312")), ["gpu.peak_tflops", "bf16 must be a number", "'312'"]),
    (yaml.safe_dump(GOOD).replace("memory_GiB: 80", "memory_GiB: 80e9"), ["gpu.memory_GiB", "less than or equal to 100000"]),
    (yaml.safe_dump(mutated("gpu.memory_GiB", 0)), ["gpu.memory_GiB", "greater than 0"]),
    (yaml.safe_dump(mutated("gpu.memory_GiB", -80)), ["gpu.memory_GiB"]),
    (yaml.safe_dump(mutated("gpu.memory_GiB", float("nan"))), ["gpu.memory_GiB", "finite"]),
    (yaml.safe_dump(mutated("gpu.memory_GiB", float("inf"))), ["gpu.memory_GiB"]),
    (yaml.safe_dump(mutated("gpu.memory_GiB", True)), ["gpu.memory_GiB: must be a number, not true"]),  # was read as 1 GiB
    (yaml.safe_dump(mutated("gpus_per_node", True)), ["gpus_per_node: must be a number, not true"]),
    (yaml.safe_dump(mutated("gpus_per_node", 0)), ["gpus_per_node"]),
    (yaml.safe_dump(mutated("gpus_per_node", 8.5)), ["gpus_per_node"]),
    (yaml.safe_dump(mutated("gpus_per_node", 10**9)), ["gpus_per_node"]),
    (yaml.safe_dump(mutated("gpu.peak_tflops", {"bf16": 312})), ["peak_tflops needs at least fp32"]),
    (yaml.safe_dump(mutated("gpu.peak_tflops", {"fp32": 19.5, "fp64": 9.7})), ["unknown precision 'fp64'"]),
    (yaml.safe_dump(mutated("gpu.peak_tflops", {"fp32": 0})), ["peak_tflops.fp32=0"]),
    (yaml.safe_dump(mutated("gpu.peak_tflops", {"fp32": float("nan")})), ["peak_tflops"]),
    (yaml.safe_dump(mutated("gpu.peak_tflops", {"fp32": True})), ["gpu.peak_tflops: fp32 must be a number, not true"]),  # was 1 TFLOP/s
    (yaml.safe_dump(mutated("efficiency.matmul_max", {"bf16": True})), ["bf16 must be a number, not true"]),
    (yaml.safe_dump(mutated("bad\nkey", 1)), ["'bad\\nkey': unknown key"]),  # was a two-line message
    (yaml.safe_dump(mutated("gpu.peak_tflops", [19.5])), ["peak_tflops"]),
    (yaml.safe_dump(mutated("intra_node.kind", "nvlink5")), ["intra_node.kind"]),
    (yaml.safe_dump(mutated("intra_node.bandwidth_GBps", -300)), ["intra_node.bandwidth_GBps"]),
    (yaml.safe_dump(mutated("intra_node.bandwidth_GBps", delete=True)), ["exactly one of bandwidth_GBps"]),  # was a crash mid-estimate
    (yaml.safe_dump(mutated("inter_node.bandwidth_GBps", 200)), ["exactly one of bandwidth_GBps"]),  # bytes and bits both given
    (yaml.safe_dump(mutated("inter_node.latency_us", -5)), ["inter_node.latency_us"]),
    (yaml.safe_dump(mutated("intra_node.fit.bandwidth_efficiency", 1.5)), ["bandwidth_efficiency"]),
    (yaml.safe_dump(mutated("intra_node.fit.bandwidth_efficiency", 0)), ["bandwidth_efficiency"]),
    (yaml.safe_dump(mutated("efficiency.memory_bandwidth", 2)), ["efficiency.memory_bandwidth"]),
    (yaml.safe_dump(mutated("efficiency.kernel_launch_us", -1)), ["kernel_launch_us"]),
    (yaml.safe_dump(mutated("price_per_gpu_hour_usd", 0)), ["price_per_gpu_hour_usd"]),
    (yaml.safe_dump(mutated("name", 42)), ["name", "valid string"]),
    # keys read by nothing were taken silently (matmul_max.int4, optimizer_bandwidth.lion), and a name that output
    # prints could be empty or forge lines with a newline and an escape sequence (2026-11-30 (16))
    (yaml.safe_dump(mutated("efficiency.matmul_max.int4", 0.5)), ["unknown key 'int4' in matmul_max", "fp8-tensorwise"]),
    (yaml.safe_dump(mutated("efficiency.optimizer_bandwidth.lion", 0.5)), ["unknown key 'lion' in optimizer_bandwidth"]),
    (yaml.safe_dump(mutated("efficiency.matmul_half_dim.int4", 100)), ["unknown key 'int4' in matmul_half_dim"]),
    (yaml.safe_dump(mutated("name", "")), ["name: String should have at least 1 character"]),
    (yaml.safe_dump(mutated("name", "x\n\x1b[31m")), ["name: String should match pattern"]),
    (yaml.safe_dump(mutated("bogus_key", 1)), ["bogus_key: unknown key"]),
    ("name: x\ndescription: y\nbase: dgx-a10", ["base: unknown hardware profile 'dgx-a10'", "did you mean dgx-a100"]),
    ("name: x\ndescription: y\nbase: none.yaml", ["base: hardware profile file 'none.yaml' not found in"]),
    ("name: x\ndescription: y\nbase: p.yaml", ["base cycle", "p.yaml -> p.yaml"]),  # the file is p.yaml
    ("name: x\ndescription: y\nbase: {name: dgx-a100}", ["base must be a profile name", "got dict"]),
    ("description: y\nbase: dgx-a100", ["needs its own name", "add name:"]),
    ("name: x\ndescription: y\nbase: dgx-a100\ngpu: {memory_GiB: 0}", ["gpu.memory_GiB", "greater than 0"]),
    ("name: x\ndescription: y\nbase: dgx-a100\ninter_node: {fit: {latency_us: 5, bandwidth_efficiency: 0.9, "
     "algorithm: star}}", ["inter_node.fit.algorithm", "'ring' or 'tree'"]),
    ("name: x\ndescription: y\nbase: dgx-a100\nintra_node: {fit: {latency_us: 5, bandwidth_efficiency: 0.9, "
     "algorithm: ring}}", ["intra_node: fit.algorithm", "belongs to inter_node.fit"]),
    # NCCL's channels on as many SMs as the GPU has held the whole GPU (a share over 1 once); a CUDA context as large as
    # the memory (2026-11-30)
    ("name: x\ndescription: y\nbase: dgx-a100\ngpu: {sm_count: 16}", ["intra_node.nccl_channels=24", "gpu.sm_count=16"]),
    ("name: x\ndescription: y\nbase: dgx-a100\nefficiency: {framework_overhead_GiB: 500}",
     ["framework_overhead_GiB=500", "gpu.memory_GiB"]),
    # a link's latency_us is its datasheet figure; the fit's start-up is costed: a changed one was silently ignored
    ("name: x\ndescription: y\nbase: dgx-h100\ninter_node: {latency_us: 1000000}",
     ["inter_node.latency_us 1000000 is not costed", "give a whole inter_node.fit"]),
]


@pytest.mark.parametrize("text,needles", BAD_PROFILES, ids=[f"bad{i}" for i in range(len(BAD_PROFILES))])
def test_bad_profile_is_one_line_exit_2(text, needles, tmp_path):
    tried("profiles")
    f = tmp_path / "p.yaml"
    f.write_text(text)
    for args in (["estimate", "--model", "gpt2", "--hw", str(f)], ["profiles", "show", str(f)]):
        assert_one_line_error(args, str(f) if needles != ["error"] else "error", *needles)


@pytest.mark.parametrize("content,needle", [(b"\xff\xfe\x00garbage\x9f", "not a text file"), (b"", "mapping")])
def test_binary_or_empty_file(content, needle, tmp_path):
    tried("profiles")
    f = tmp_path / "p.yaml"
    f.write_bytes(content)
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", str(f)], needle)


def test_a_directory_or_missing_file(tmp_path):
    tried("profiles", 2)
    (tmp_path / "d.yaml").mkdir()
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", str(tmp_path / "d.yaml")], "is a directory, not a file")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", str(tmp_path / "none.yaml")], "not found")


@pytest.mark.parametrize("name", list_profiles())
def test_shipped_profiles_round_trip(name, tmp_path):
    f = tmp_path / f"{name}.yaml"
    code, out, err = run_main(["profiles", "show", name])
    assert code == 0, err
    f.write_text(out)
    assert load_hardware(f) == load_hardware(name)


# --- generated mutations of the shipped profiles ----------------------------------------------------------

SHIPPED = {n: yaml.safe_load((PROFILE_DIR / f"{n}.yaml").read_text()) for n in list_profiles()}
GARBAGE = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _paths(d, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


@st.composite
def mutations(draw):
    d = copy.deepcopy(SHIPPED[draw(st.sampled_from(sorted(SHIPPED)))])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(d))))
        node = d
        for p in path[:-1]:
            node = node[p]
        action = draw(st.sampled_from(["set", "set", "delete", "scale", "extra"]))
        if action == "delete":
            del node[path[-1]]
        elif action == "scale" and isinstance(node[path[-1]], (int, float)) and not isinstance(node[path[-1]], bool):
            node[path[-1]] = node[path[-1]] * draw(st.sampled_from([0, -1, 1e-9, 1e9, float("nan"), 0.5, 2]))
        elif action == "extra":
            node[draw(st.text(min_size=1, max_size=6))] = draw(GARBAGE)
        else:
            node[path[-1]] = draw(GARBAGE)
    return d


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutations())
def test_mutated_profiles_load_or_refuse_in_one_line(d):
    """Either a HardwareError with one line, or a profile on which an estimate is finite and positive."""
    tried("profiles")
    text = yaml.safe_dump(d, allow_unicode=True)
    try:
        hw = hardware_from_yaml(text, origin="gen.yaml")
    except HardwareError as exc:
        assert str(exc).startswith("gen.yaml: ") and "\n" not in str(exc)
        return
    e = estimate("gpt2", hw, gpus=min(2, hw.gpus_per_node), seq=256)
    assert math.isfinite(e.step_time_s) and e.step_time_s > 0
    assert all(math.isfinite(v) and v >= 0 for v in e.breakdown.values())


@pytest.mark.parametrize("value, says", [("74.1", "not the string '74.1'"), (True, "not true")])
def test_stack_coefficients_are_numbers(tmp_path, value, says):
    """A coefficient of a stack's measured tables written as a string or a boolean was read as a number (pydantic's lax
    mode: '74.1' as 74.1, true as 1): one line naming the table and the key."""
    from advisor.stack import STACK_DIR

    doc = yaml.safe_load((STACK_DIR / "hf-trainer.yaml").read_text())
    doc["kernels"]["elementwise"][0]["forward"]["split"]["d_model"] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert_one_line_error(["estimate", "--model", "llama3-8b", "--hw", "dgx-a100", "--gpus", "8", "--stack", str(path)],
                          "kernels.elementwise.0.forward.split", f"d_model must be a number, {says}")


@pytest.mark.parametrize("value", [-1000.0, 1e300])
def test_stack_activation_coefficients_are_bounded(tmp_path, value):
    """A negative coefficient of memory.saved made activations 0 (and a plan rank on it); a huge one inf GiB and
    invalid JSON: each is a one-line error naming the field."""
    from advisor.stack import STACK_DIR

    doc = yaml.safe_load((STACK_DIR / "megatron-core.yaml").read_text())
    doc["memory"]["saved"][0]["layer"]["sequence"]["d_model"] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert_one_line_error(["estimate", "--model", "llama3-8b", "--hw", "dgx-a100", "--gpus", "8", "--stack", str(path)],
                          "memory.saved.0.layer.sequence.d_model")


def test_a_file_that_changes_a_built_in_under_its_name_or_a_reserved_name_is_refused(tmp_path):
    """Output names a profile by its name: a file named megatron-core with other settings was reported as
    megatron-core, and one named auto as --stack auto (a review). A verbatim copy of a built-in still loads."""
    tried("profiles", 3)
    changed = tmp_path / "mc.yaml"
    changed.write_text("base: megatron-core\nname: megatron-core\ndescription: t\nengine: {bucket_MiB: 1}\n")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", "dgx-h100", "--stack", str(changed)],
                          "name 'megatron-core' is a built-in stack profile's and this one differs")
    auto = tmp_path / "auto.yaml"
    auto.write_text("base: megatron-core\nname: auto\ndescription: t\n")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", "dgx-h100", "--stack", str(auto)], "name 'auto' means")
    import advisor

    verbatim = tmp_path / "verbatim.yaml"
    verbatim.write_text((Path(advisor.__file__).parent.parent / "hardware_profiles" / "dgx-h100.yaml").read_text())
    assert run_main(["estimate", "--model", "gpt2", "--hw", str(verbatim), "--gpus", "8"])[0] == 0


def test_a_stack_without_the_even_split_refuses_even_pipelines(tmp_path):
    tried("profiles")
    f = tmp_path / "edgy.yaml"
    f.write_text("base: megatron-core\nname: edgy\ndescription: t\nengine: {pipeline_splits: [edges]}\n")
    assert_one_line_error(["estimate", "--model", "llama2-7b", "--hw", "dgx-h100", "--pp", "3", "--gpus", "3", "--stack",
                           str(f)], "edgy lists no even pipeline split (engine.pipeline_splits): add even")


@pytest.mark.parametrize("where", ["selective: {recomputes: [attention/core, mlp/gate_proj]}",
                                   "selective: {recomputes: [norms], modules: {core_attn: {recomputes: [attn/core]}}}"])
def test_a_selective_policy_naming_an_unknown_op_is_refused(tmp_path, where):
    """A typo in what selective recomputation reruns (mlp/gate_proj for mlp/gate) reran nothing, silently: the step
    and the memory were a policy the profile did not say. Every name is a layer's linear or one of advisor's ops."""
    tried("profiles")
    f = tmp_path / "typo.yaml"
    f.write_text(f"base: megatron-core\nname: typo\ndescription: t\nengine: {{{where}}}\n")
    bad = "mlp/gate_proj" if "gate_proj" in where else "attn/core"
    assert_one_line_error(["estimate", "--model", "llama3-8b", "--hw", "dgx-h100", "--gpus", "8", "--stack", str(f)],
                          f"unknown op '{bad}'")


def test_every_catalogue_layer_names_its_linears_from_the_known_set():
    """advisor.selective.LINEAR_NAMES is the vocabulary profiles are checked against: a layer with a linear outside
    it could not be named by a selective policy."""
    from advisor.model import list_models, load_model
    from advisor.selective import LINEAR_NAMES

    for name in list_models():
        spec = load_model(name)
        for layer in spec.layers:
            assert {lin.name for lin in layer.linears} <= set(LINEAR_NAMES), name


def test_a_stack_that_runs_several_devices_only_sharded_counts_pipeline_ranks_as_devices(tmp_path):
    """engine.distributed fsdp_checkpointed (litgpt's scripts): several devices run only ZeRO-3 with every layer
    checkpointed. A custom profile offering pipelines passed a ZeRO-1 pipeline of one data-parallel rank, unchecked."""
    tried("profiles")
    f = tmp_path / "pipe.yaml"
    f.write_text("base: litgpt\nname: pipe\ndescription: t\nengine: {offers: [ddp, zero1, zero3, pp]}\n")
    assert_one_line_error(["estimate", "--model", "llama2-7b", "--hw", "dgx-h100", "--gpus", "2", "--pp", "2",
                           "--zero", "1", "--stack", str(f)], "pipe runs several devices only sharded (ZeRO-3 / FSDP)")


def test_an_integer_of_thousands_of_digits_in_a_profile_is_one_line(tmp_path):
    """int() refuses 4,300 digits with a ValueError, which reached the user as 'ValueError: Exceeds the limit'."""
    tried("profiles", 2)
    hw = tmp_path / "big.yaml"
    hw.write_text("base: dgx-h100\nname: big\ngpus_per_node: " + "9" * 5000 + "\n")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", str(hw)], "line 3: an integer of 5,000 digits")
    st = tmp_path / "bigst.yaml"
    st.write_text("base: megatron-core\nname: bigst\ndescription: t\nengine: {bucket_MiB: " + "9" * 5000 + "}\n")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", "dgx-h100", "--stack", str(st)], "an integer of 5,000")


@pytest.mark.parametrize("where, text, says", [
    ("inter_node", "  bandwidth_Gbps: 400GB/s",
     "inter_node.bandwidth_Gbps: must be a number, not the string '400GB/s' (write the number alone, in Gb/s as the "
     "key's name says)"),
    ("gpu", "  peak_tflops: {bf16: 989 TFLOPS}",
     "gpu.peak_tflops: bf16 must be a number, not the string '989 TFLOPS' (write the number alone, in TFLOP/s"),
    ("gpu", "  memory_GiB: '80'", "gpu.memory_GiB: must be a number, not the string '80' (write it without quotes)"),
])
def test_a_number_written_with_its_unit_is_told_the_unit_not_to_drop_quotes(tmp_path, where, text, says):
    """'400GB/s' was told '(write it without quotes)', which it is not (and 400 GB/s is 3200 in this Gb/s key), then
    '(got ...)' repeated the value the message quotes: the unit the key's name ends in is named, the value once."""
    path = tmp_path / "units.yaml"
    path.write_text(f"name: units\ndescription: d\nbase: dgx-h100\n{where}:\n{text}\n")
    with pytest.raises(HardwareError) as err:
        load_hardware(str(path))
    assert says in str(err.value) and str(err.value).count("400GB/s") <= 1 and "(got" not in str(err.value)


@pytest.mark.parametrize("text", ["base: l40s\nintra_node:\n  nvls: true", "base: dgx-h100\nintra_node:\n  kind: pcie"])
def test_nvls_without_an_nvswitch_is_refused(tmp_path, text):
    """nvls: true on a PCIe node (or a DGX base switched to PCIe, its nvls kept) loaded silently: advisor.comm then named
    its all-reduces across nodes NVLS-tree and held NVLS's 16 channels of SMs for them (held_sms)."""
    path = tmp_path / "nvls.yaml"
    path.write_text(f"name: nvls\ndescription: d\n{text}\n")
    with pytest.raises(HardwareError, match="intra_node: nvls .* needs kind nvswitch, not pcie: set nvls: false"):
        load_hardware(str(path))
