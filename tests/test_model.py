"""Parameter counts against what Hugging Face transformers builds (model.num_parameters())."""

import json

import pytest

from advisor.model import ModelError, load_model, model_from_hf_config

# Sources: HF model cards / `AutoModelForCausalLM.from_config(cfg).num_parameters()` for each config.json.
HF_PARAMS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "bloom-176b": 176_247_271_424,
}


@pytest.mark.parametrize("name,params", HF_PARAMS.items())
def test_param_counts_match_hugging_face(name, params):
    assert load_model(name).n_params == params


def test_gpt3_175b_is_175b():
    # Brown et al. 2020 Table 2.1 lists 175.0B for 96 layers x 12288; biases and positions add the rest.
    assert load_model("gpt3-175b").n_params == pytest.approx(175e9, rel=0.005)


def test_breakdown_sums_to_total():
    m = load_model("llama3-8b")
    assert sum(m.param_breakdown().values()) == m.n_params
    assert m.param_breakdown()["lm_head"] == 128256 * 4096  # untied head


def test_gpt2_config_json(tmp_path):
    cfg = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None, "vocab_size": 50257, "n_positions": 1024}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert load_model(str(p)).n_params == 124_439_808


def test_llama_config_json_gqa(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = model_from_hf_config(p)
    assert m.n_params == 8_030_261_248 and m.kv_heads == 8


@pytest.mark.parametrize("text", ["{", "[]", '{"foo": 1}', '{"n_layer": 2}', '{"n_layer": -1, "n_embd": 8, "n_head": 2, "vocab_size": 10}'])
def test_bad_config_json_is_one_line_error(tmp_path, text):
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(ModelError) as exc:
        load_model(str(p))
    assert "\n" not in str(exc.value)


def test_unknown_model_suggests():
    with pytest.raises(ModelError, match="did you mean gpt2-xl"):
        load_model("gpt2-xxl")


def test_config_json_name_is_its_folder_other_files_their_stem(tmp_path):
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "n_positions": 128}
    (tmp_path / "Tiny-GPT").mkdir()
    (tmp_path / "Tiny-GPT" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "qwen-like.json").write_text(json.dumps(cfg))
    assert model_from_hf_config(tmp_path / "Tiny-GPT" / "config.json").name == "Tiny-GPT"
    assert model_from_hf_config(tmp_path / "qwen-like.json").name == "qwen-like"
