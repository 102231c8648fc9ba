"""Robustness of model inputs (--model NAME or a Hugging Face config.json): half-remembered names get the
closest catalogue names; every bad config.json is one line naming the file, key and value, exit 2.

Bad inputs tried (tables below, plus generated config.json mutations): typos and case variants of every
catalogue name, malformed JSON, non-object JSON, binary and empty files, missing keys, strings, floats,
booleans, nulls, zero/negative/NaN/Infinity values, heads that do not divide d_model, KV heads that do not
divide heads, zero KV heads (once silently replaced by the head count), absurd sizes (10^15 parameters).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _robust import assert_one_line_error, run_main, tried
from advisor.api import estimate
from advisor.errors import AdvisorError
from advisor.model import CATALOGUE, ModelError, load_model, model_from_hf_config

LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
         "num_key_value_heads": 4, "intermediate_size": 688, "vocab_size": 32000, "max_position_embeddings": 2048}
GPT2 = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 8, "vocab_size": 50257, "n_positions": 1024}

TYPOS = [("gpt2-xll", "gpt2-xl"), ("gpt-2", "gpt2"), ("gpt2xl", "gpt2-xl"), ("lama3-8b", "llama3-8b"),
         ("llama3-8", "llama3-8b"), ("llama-3.1-8b", "llama3-8b"), ("llama2_70b", "llama2-70b"), ("bloom176b", "bloom-176b"),
         ("gpt3-175", "gpt3-175b"), ("lllama2-13b", "llama2-13b"), ("gpt2-larg", "gpt2-large"), ("gtp2-medium", "gpt2-medium")]


@pytest.mark.parametrize("typo,expected", TYPOS)
def test_typos_suggest_the_closest_names(typo, expected):
    tried("models")
    assert_one_line_error(["estimate", "--model", typo, "--hw", "dgx-a100"], f"unknown model {typo!r}", expected)


@pytest.mark.parametrize("name", [n.upper() for n in CATALOGUE] + ["Llama-2-7B", "GPT3", "BLOOM"])
def test_names_are_case_insensitive(name):
    assert load_model(name).name in CATALOGUE


def _cfg(base: dict, **changes) -> dict:
    d = dict(base)
    for k, v in changes.items():
        if v is _DEL:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DEL = object()
# (config.json text, substrings the one-line error must contain)
BAD_CONFIGS = [
    ("{", ["malformed JSON"]),
    ("{'n_layer': 1}", ["malformed JSON"]),
    ("", ["malformed JSON"]),
    ("[1, 2]", ["must be a JSON object"]),
    ("null", ["must be a JSON object"]),
    ("\"gpt2\"", ["must be a JSON object"]),
    ("[" * 100_000 + "]" * 100_000, ["malformed JSON"]),  # RecursionError in the parser
    (json.dumps({"model_type": "bert"}), ["'bert' is an encoder", "not a decoder-only language model", "llama"]),
    (json.dumps(_cfg(GPT2, n_embd=_DEL)), ["lacks 'n_embd'"]),
    (json.dumps(_cfg(GPT2, n_head=None)), ["lacks 'n_head'"]),
    (json.dumps(_cfg(LLAMA, vocab_size=_DEL)), ["lacks 'vocab_size'"]),
    (json.dumps(_cfg(LLAMA, hidden_size=_DEL)), ["lacks 'hidden_size'"]),
    (json.dumps(_cfg(GPT2, n_layer=0)), ["'n_layer' must be at least 1, got 0"]),
    (json.dumps(_cfg(GPT2, n_layer=-12)), ["'n_layer'", "got -12"]),
    (json.dumps(_cfg(GPT2, n_layer=12.5)), ["'n_layer' must be an integer, not 12.5"]),
    (json.dumps(_cfg(GPT2, n_layer="twelve")), ["'n_layer'", "the string 'twelve'"]),
    (json.dumps(_cfg(GPT2, n_layer=True)), ["'n_layer' must be an integer, not true"]),  # was read as 1 layer
    (json.dumps(_cfg(GPT2, n_layer=[12])), ["'n_layer' must be an integer"]),
    (json.dumps(_cfg(GPT2, n_layer=10**30)), ["'n_layer' must be at most 100,000"]),
    (json.dumps(_cfg(GPT2, n_embd=float("nan"))), ["'n_embd' must be an integer, not nan"]),  # Python's json writes NaN
    (json.dumps(_cfg(GPT2, n_embd=float("inf"))), ["'n_embd' must be an integer, not inf"]),
    (json.dumps(_cfg(GPT2, n_embd=250)), ["d_model=250 is not divisible by n_heads=8"]),
    (json.dumps(_cfg(GPT2, vocab_size=0)), ["vocab"]),
    (json.dumps(_cfg(GPT2, n_inner=0)), ["'n_inner'", "got 0"]),  # was silently 4 x d_model
    (json.dumps(_cfg(GPT2, n_positions=-1)), ["'n_positions'", "got -1"]),
    (json.dumps(_cfg(LLAMA, num_key_value_heads=3)), ["n_kv_heads=3 must divide n_heads=8"]),
    (json.dumps(_cfg(LLAMA, num_key_value_heads=16)), ["n_kv_heads=16 must divide n_heads=8"]),
    (json.dumps(_cfg(LLAMA, num_key_value_heads=0)), ["'num_key_value_heads'", "got 0"]),  # was silently n_heads
    (json.dumps(_cfg(LLAMA, head_dim=0)), ["head_dim"]),
    (json.dumps(_cfg(LLAMA, intermediate_size=-1)), ["'intermediate_size'", "got -1"]),
    (json.dumps(_cfg(LLAMA, num_hidden_layers=None)), ["n_layers"]),
    (json.dumps(_cfg(LLAMA, max_position_embeddings="long")), ["'max_position_embeddings' must be an integer, not the string 'long'"]),
    # past Python's 4,300-digit int conversion (a review found a bare ValueError)
    (json.dumps(GPT2).replace('"vocab_size": 50257', '"vocab_size": ' + "9" * 5000), ["a number of thousands of digits"]),
]


@pytest.mark.parametrize("text,needles", BAD_CONFIGS, ids=[f"bad{i}" for i in range(len(BAD_CONFIGS))])
def test_bad_config_json_is_one_line_exit_2(text, needles, tmp_path):
    tried("models")
    f = tmp_path / "config.json"
    f.write_text(text)
    for arg in (str(f), str(tmp_path)):  # the file, or the directory holding it
        assert_one_line_error(["estimate", "--model", arg, "--hw", "dgx-a100"], str(f), *needles)


def test_a_byte_order_mark_is_not_part_of_the_json(tmp_path):
    """Windows editors save config.json with a UTF-8 byte-order mark: read as the same model (it was refused)."""
    f = tmp_path / "config.json"
    f.write_text(json.dumps(GPT2), encoding="utf-8-sig")
    assert f.read_bytes().startswith(b"\xef\xbb\xbf")
    assert model_from_hf_config(f).n_params == model_from_hf_config(_write(tmp_path / "plain.json", GPT2)).n_params


def _write(path, cfg: dict):
    path.write_text(json.dumps(cfg))
    return path


def test_binary_config(tmp_path):
    tried("models")
    f = tmp_path / "config.json"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert_one_line_error(["estimate", "--model", str(f), "--hw", "dgx-a100"], "not a text file")


def test_absurd_model_sizes_are_answered_fast(tmp_path):
    """10^15 parameters: estimate answers (it does not fit) and plan says no GPU count fits, in seconds."""
    tried("models", 2)
    f = tmp_path / "config.json"
    f.write_text(json.dumps(_cfg(LLAMA, num_hidden_layers=100_000, hidden_size=1_000_000, num_attention_heads=1000,
                                 num_key_value_heads=1000, intermediate_size=4_000_000)))
    assert model_from_hf_config(f).n_params > 1e15
    code, out, err = run_main(["estimate", "--model", str(f), "--hw", "dgx-h100", "--gpus", "8"])
    assert code == 0 and "DOES NOT FIT" in out, err
    assert_one_line_error(["plan", "--model", str(f), "--hw", "dgx-h100", "--gpus", "8"], "no GPU count up to 10,000,000 fits")


# --- generated config.json mutations -------------------------------------------------------------------

VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.sampled_from([0, 1, 2, 3, 7, 8, 64, 4096]),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.lists(st.integers(), max_size=2))


@st.composite
def configs(draw):
    d = dict(draw(st.sampled_from([GPT2, LLAMA])))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(d) + ["head_dim", "n_inner", "tie_word_embeddings", "hidden_act", "mlp_bias"]))
        if draw(st.booleans()) and key in d:
            del d[key]
        else:
            d[key] = draw(VALUES)
    return d


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(configs())
def test_mutated_configs_load_or_refuse_in_one_line(tmp_path, cfg):
    """Either a ModelError with one line, or a model whose estimate is finite and positive."""
    tried("models")
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    try:
        m = model_from_hf_config(f)
    except ModelError as exc:
        assert "\n" not in str(exc) and str(f) in str(exc)
        return
    assert m.n_params > 0
    try:
        e = estimate(m, "dgx-a100", gpus=1, seq=min(128, m.max_positions))
    except AdvisorError as exc:  # e.g. a plan constraint: refused in one line too
        assert "\n" not in str(exc)
        return
    assert math.isfinite(e.step_time_s) and e.step_time_s > 0
