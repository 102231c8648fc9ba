"""Reading what a user names is bounded (issue 18): YAML aliases cannot expand a few hundred bytes into
gigabytes, a huge file is refused by its size before it is read, and a directory, device or FIFO given as
--model or --hw is named as what it is, and never waited on.

Each reproducer here failed before advisor/io.py bounded the reading: the alias bomb took 265 s and 4.6 GB in
`advisor profiles show`, a 2 GB sparse file was read whole (4.2 GB, 9-11 s) before "malformed", a FIFO handed
to the reader blocked until a writer came, and every non-file was "not found". Two tests guard what must not
change: a profile with a few anchors and aliases loads, and newlines read as they did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from _robust import assert_one_line_error, run_main, tried
from advisor.errors import AdvisorError
from advisor.hardware import PROFILE_DIR, load_hardware
from advisor.io import (MAX_TEXT_BYTES, MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, YAMLTooLarge, load_yaml,
                        not_a_file, read_text)
from advisor.model import ModelError, load_model, model_from_hf_config

GPT2 = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 8, "vocab_size": 50257, "n_positions": 1024}
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")


def alias_bomb() -> str:
    """The reproducer of issue 18, ~330 bytes: seven levels of ten aliases each in `calibration:`, which
    expand to 1.1e7 values (PyYAML builds them shared; pydantic and the printer walked every one)."""
    lines = ["name: x", "description: y", "base: dgx-a100", "calibration:", "  a: &a [1,1,1,1,1,1,1,1,1,1]"]
    for prev, name in zip("abcdef", "bcdefg"):
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    return "\n".join(lines) + "\n"


_CHILD = """
import json, sys, time, tracemalloc
from _robust import run_main
tracemalloc.start()
t = time.perf_counter()
code, out, err = run_main(sys.argv[1:])
s = time.perf_counter() - t
print(json.dumps({"code": code, "err": err, "s": s, "peak_MiB": tracemalloc.get_traced_memory()[1] / 2**20}))
"""


def run_child(args: list[str], timeout_s: float = 60) -> dict:
    """advisor's CLI in a fresh interpreter, with the time and the peak of Python memory it takes (tracemalloc:
    ru_maxrss would include the pytest process it was forked from): a regression here costs minutes and
    gigabytes, which the test process must not pay (it fails at the timeout instead)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1])]))
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"advisor {' '.join(args)} ran past {timeout_s} s")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- YAML aliases and depth ----------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["profiles", "show"], ["estimate", "--model", "gpt2", "--hw"]])
def test_alias_bomb_is_refused_fast_and_small(command, tmp_path):
    tried("profiles")
    f = tmp_path / "bomb.yaml"
    f.write_text(alias_bomb())
    assert f.stat().st_size < 400
    got = run_child([*command, str(f)])
    assert got["code"] == 2, got
    assert got["err"].count("\n") == 1 and str(f) in got["err"], got
    assert "aliases (*name) expand to more than 10,000 values (line 8)" in got["err"], got
    # refused in ~5 ms; before: 265 s and 4.6 GB of RSS (`/usr/bin/time -v advisor profiles show bomb.yaml`)
    assert got["s"] < 1.0 and got["peak_MiB"] < 20, got


def test_alias_bomb_in_a_base_profile_names_the_chain(tmp_path):
    tried("profiles")
    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    child = tmp_path / "child.yaml"
    child.write_text("name: c\ndescription: d\nbase: bomb.yaml\n")
    assert_one_line_error(["profiles", "show", str(child)], f"{child}: base bomb.yaml: its aliases (*name) expand")


def test_a_profile_with_a_few_anchors_and_aliases_still_loads(tmp_path):
    # its own name: a file that differs from a built-in under the built-in's name is refused (advisor.profiles)
    text = (PROFILE_DIR / "dgx-a100.yaml").read_text().replace("name: dgx-a100", "name: anchored", 1)
    text = text.replace("bf16: 312, fp16: 312}", "bf16: &half 312, fp16: *half}")
    text = text.replace("bf16: 0.766, fp16: 0.766}", "bf16: &m 0.766, fp16: *m}")
    text += "calibration:\n  defaults: &d {host: node1, torch: '2.13'}\n  run1: {<<: *d, date: '2026-11-24'}\n"
    assert text.count("*") >= 3
    f = tmp_path / "anchored.yaml"
    f.write_text(text)
    hw = load_hardware(str(f))
    assert hw.gpu.peak_tflops == load_hardware("dgx-a100").gpu.peak_tflops
    assert hw.efficiency == load_hardware("dgx-a100").efficiency
    assert hw.calibration["run1"] == {"host": "node1", "torch": "2.13", "date": "2026-11-24"}
    assert run_main(["profiles", "show", str(f)])[0] == 0


def test_the_value_bound_counts_every_value_once_expanded():
    """MAX_YAML_NODES values load, one more is refused, written out or through aliases alike."""
    assert MAX_YAML_NODES == 10_000
    flat = "[" + ",".join(["1"] * (MAX_YAML_NODES - 1)) + "]"  # the list itself is a value
    assert len(load_yaml(flat)) == MAX_YAML_NODES - 1
    with pytest.raises(YAMLTooLarge, match="more than 10,000 values"):
        load_yaml("[" + ",".join(["1"] * MAX_YAML_NODES) + "]")
    # a: 101 values; b: 1 + 98 x 101 = 9,899; the mapping and its two keys: 3 -> 10,003
    aliased = "a: &a [" + ",".join(["1"] * 100) + "]\nb: [" + ",".join(["*a"] * 98) + "]\n"
    with pytest.raises(YAMLTooLarge, match=r"aliases \(\*name\) expand to more than 10,000 values \(line 2\)"):
        load_yaml(aliased)
    assert len(load_yaml(aliased.replace(",".join(["*a"] * 98), ",".join(["*a"] * 97)))["b"]) == 97


def test_an_alias_inside_what_it_names_is_refused(tmp_path):
    tried("profiles")
    f = tmp_path / "loop.yaml"
    f.write_text("name: x\ndescription: y\nbase: dgx-a100\ncalibration: &c {self: *c}\n")
    assert_one_line_error(["profiles", "show", str(f)], str(f), "alias *c (line 4) is inside the value it names")


def test_a_key_written_twice_is_refused_merge_keys_still_override(tmp_path):
    """PyYAML keeps the last of two equal keys without a word: a profile's first gpus_per_node would vanish."""
    tried("profiles")
    f = tmp_path / "dup.yaml"
    f.write_text("name: x\ndescription: y\nbase: dgx-a100\ngpus_per_node: 8\ngpus_per_node: 4\n")
    assert_one_line_error(["profiles", "show", str(f)], str(f), "key 'gpus_per_node' is written twice in one mapping "
                          "(lines 4 and 5): keep one")
    assert load_yaml("a: &a {x: 1, y: 2}\nb: {<<: *a, y: 3}\n")["b"] == {"x": 1, "y": 3}  # a merge, then an override


def test_depth_bound():
    deep = load_yaml("[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH)
    for _ in range(MAX_YAML_DEPTH - 1):
        deep = deep[0]
    assert deep == []
    with pytest.raises(YAMLTooLarge, match="nested more than 64 levels deep"):
        load_yaml("[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1))


def test_yaml_text_longer_than_the_bound_is_refused_before_parsing():
    with pytest.raises(YAMLTooLarge, match="more than the 1 MiB a YAML input may be"):
        load_yaml("# " + "x" * MAX_YAML_BYTES + "\na: 1\n")  # PyYAML scans a comment at ~1.2 MB/s


# --- file size -------------------------------------------------------------------------------------

def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:  # a hole: no disk used
        fh.truncate(size)
    return path


def test_a_2gb_profile_is_refused_by_its_size(tmp_path):
    tried("profiles")
    f = sparse(tmp_path / "big.yaml", 2 * 2**30)
    got = run_child(["estimate", "--model", "gpt2", "--hw", str(f)])
    assert got["code"] == 2 and got["err"].count("\n") == 1, got
    assert f"{f}: 2 GiB, more than the 1 MiB a hardware profile YAML may be" in got["err"], got
    assert got["s"] < 1.0 and got["peak_MiB"] < 20, got  # before: read whole, 4.2 GB of RSS and 11 s


@pytest.mark.parametrize("arg", ["config.json", "."])
def test_a_2gb_config_json_is_refused_by_its_size(arg, tmp_path):
    tried("models")
    f = sparse(tmp_path / "config.json", 2 * 2**30)
    got = run_child(["estimate", "--model", str(tmp_path / arg), "--hw", "dgx-a100"])
    assert got["code"] == 2 and got["err"].count("\n") == 1, got
    assert f"{f}: 2 GiB, more than the 16 MiB a Hugging Face config.json may be" in got["err"], got
    assert got["s"] < 1.0 and got["peak_MiB"] < 20, got  # before: 4.2 GB of RSS and 9 s, then "malformed JSON"


def test_the_size_bound_holds_while_reading(tmp_path):
    """A file whose size is not known in advance (/proc says 0) or grows is cut at the bound as it is read."""
    proc = Path("/proc/self/maps")
    if not proc.is_file() or proc.stat().st_size != 0:
        pytest.skip("needs Linux /proc")
    assert len(read_text(proc, "map", AdvisorError)) > 100
    with pytest.raises(AdvisorError, match=r"^/proc/self/maps: more than the 100 bytes a map may be .*it grew"):
        read_text(proc, "map", AdvisorError, limit=100)


def test_a_file_at_the_bound_is_read(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(GPT2) + " " * (MAX_TEXT_BYTES - len(json.dumps(GPT2))))
    assert f.stat().st_size == MAX_TEXT_BYTES
    assert model_from_hf_config(f).n_layers == 4
    with open(f, "a") as fh:
        fh.write(" ")
    with pytest.raises(ModelError, match=r"16 MiB, more than the 16 MiB a Hugging Face config.json may be"):
        model_from_hf_config(f)


# --- newlines ------------------------------------------------------------------------------------------

def test_newlines_read_as_text_mode_reads_them(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_bytes(b"a: 1\r\nb: 2\rc: 3\n")
    assert read_text(f, "x", AdvisorError) == "a: 1\nb: 2\nc: 3\n"


# --- directories, devices, FIFOs ---------------------------------------------------------------------

def test_a_directory_as_model_or_hw(tmp_path):
    tried("models")
    tried("profiles")
    assert_one_line_error(["estimate", "--model", str(tmp_path), "--hw", "dgx-a100"],
                          f"model {str(tmp_path)!r} is a directory without a config.json",
                          "give a Hugging Face model folder (holding config.json) or the config.json file")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", str(tmp_path)],
                          f"hardware profile {str(tmp_path)!r} is a directory, not a file",
                          "give the path to a .yaml file or a built-in name (see `advisor profiles`)")
    (tmp_path / "config.json").mkdir()
    assert_one_line_error(["estimate", "--model", str(tmp_path), "--hw", "dgx-a100"],
                          f"model config {str(tmp_path / 'config.json')!r} is a directory, not a file")


def test_a_relative_directory_without_a_slash(tmp_path, monkeypatch):
    """`--model somedir`: once "unknown model"; a catalogue or built-in name still wins over a folder of that name."""
    tried("models")
    monkeypatch.chdir(tmp_path)
    for name in ("weights", "gpt2", "dgx-a100"):
        (tmp_path / name).mkdir()
    assert_one_line_error(["estimate", "--model", "weights", "--hw", "dgx-a100"], "'weights' is a directory without")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", "weights"], "'weights' is a directory, not a file")
    assert run_main(["estimate", "--model", "gpt2", "--hw", "dgx-a100"])[0] == 0


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null")
def test_a_device_as_model_or_hw():
    tried("models")
    tried("profiles")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", "/dev/null"],
                          "hardware profile '/dev/null' is a character device, not a file")
    assert_one_line_error(["estimate", "--model", "/dev/null", "--hw", "dgx-a100"],
                          "model config '/dev/null' is a character device, not a file",
                          "give a Hugging Face config.json file or a catalogue name (see `advisor models`)")
    with pytest.raises(ModelError, match=r"^/dev/null: a character device, not a file"):  # was "malformed JSON"
        model_from_hf_config("/dev/null")


@needs_fifo
def test_a_fifo_as_model_or_hw(tmp_path, monkeypatch):
    tried("models", 3)
    tried("profiles", 3)
    monkeypatch.chdir(tmp_path)
    os.mkfifo("some.fifo")
    os.mkfifo("p.yaml")
    (tmp_path / "m").mkdir()
    os.mkfifo("m/config.json")
    for hw in ("some.fifo", "p.yaml", str(tmp_path / "some.fifo")):
        assert_one_line_error(["estimate", "--model", "gpt2", "--hw", hw],
                              f"hardware profile {hw!r} is a FIFO (named pipe), not a file")
    for model, shown in (("some.fifo", "some.fifo"), ("m", "m/config.json"), ("m/config.json", "m/config.json")):
        assert_one_line_error(["estimate", "--model", model, "--hw", "dgx-a100"],
                              f"model config {shown!r} is a FIFO (named pipe), not a file")
    (tmp_path / "child.yaml").write_text("name: c\ndescription: d\nbase: p.yaml\n")
    assert_one_line_error(["profiles", "show", "child.yaml"], "base: hardware profile 'p.yaml' is a FIFO")


@needs_fifo
@pytest.mark.parametrize("reader", [lambda p: read_text(p, "x", AdvisorError), model_from_hf_config,
                                    lambda p: load_hardware(str(p))], ids=["read_text", "config", "profile"])
def test_reading_a_fifo_never_blocks(reader, tmp_path):
    """Handed a FIFO directly (the Python API), the reader refuses it at once; before, open() waited for a
    writer. If it blocks, the test opens the write end itself so that the reader returns and the test fails."""
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    outcome = []

    def read():
        try:
            outcome.append(reader(fifo))
        except AdvisorError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    blocked = thread.is_alive()
    if blocked:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a reader waits: this open succeeds, the close is EOF
        thread.join(5)
    assert not blocked, "the reader waited for a writer on a FIFO"
    assert isinstance(outcome[0], AdvisorError) and "a FIFO (named pipe), not a file" in str(outcome[0])


def test_broken_symlink(tmp_path):
    tried("profiles")
    link = tmp_path / "hw.yaml"
    link.symlink_to(tmp_path / "gone.yaml")
    assert_one_line_error(["estimate", "--model", "gpt2", "--hw", str(link)],
                          f"is a broken symbolic link to {str(tmp_path / 'gone.yaml')!r}, not a file")


def test_not_a_file_says_nothing_for_files_and_missing_names(tmp_path):
    f = tmp_path / "f.yaml"
    f.write_text("a: 1\n")
    assert not_a_file(f) is None and not_a_file(tmp_path / "missing") is None
    assert not_a_file(tmp_path) == "a directory"
    assert not_a_file("x" * 5000) is None and not_a_file("a\0b") is None  # names the OS refuses: nothing there
    with pytest.raises(ModelError, match="not found"):
        load_model(str(tmp_path / "missing.json"))
    assert yaml.safe_load(f.read_text()) == load_yaml(f.read_text())
