"""A RoPE model run beyond the positions it was trained to (config.json's max_position_embeddings: Llama 3 8B's 8,192,
transformers' LlamaConfig of Meta-Llama-3-8B) is noted, not refused (people extend a context); learned positions
(GPT-2's n_positions 1,024) refuse it, as before."""

from __future__ import annotations

import pytest

from advisor import estimate, plan
from advisor.errors import AdvisorError
from advisor.render import render_estimate, render_plan

NOTE = ("positions: --seq 16,384 exceeds the 8,192 positions llama3-8b was trained to (max_position_embeddings, RoPE); "
        "advisor costs the sequence as given, with the RoPE its config sets (extending the context, a larger RoPE base "
        "or a rope_scaling, is the run's to set)")


def test_estimate_notes_a_sequence_beyond_ropes_trained_positions():
    e = estimate(model="llama3-8b", hw="dgx-h100", gpus=8, zero=3, seq=16384)
    assert e.positions == NOTE and NOTE in render_estimate(e).splitlines()
    at = estimate(model="llama3-8b", hw="dgx-h100", gpus=8, zero=3, seq=8192)
    assert at.positions == "" and "positions:" not in render_estimate(at)


def test_plan_notes_it_once():
    found = plan("llama3-8b", "dgx-h100", seq=16384, top=2)
    assert found.notes().count(NOTE) == 1
    assert "exceeds the 8,192 positions" in render_plan(found, width=1000)
    assert not any(n.startswith("positions:") for n in plan("llama3-8b", "dgx-h100", seq=8192, top=1).notes())


def test_learned_positions_still_refuse():
    with pytest.raises(AdvisorError, match="--seq 2048 exceeds gpt2-xl's 1024 learned positions; use --seq <= 1024"):
        estimate(model="gpt2-xl", hw="dgx-h100", gpus=1, seq=2048)


# ALiBi adds a per-head bias by distance and no position table (ModelSpec.position_params is 0 for it), so a longer
# sequence runs: transformers' BloomModel builds the bias from the attention mask, any length
# (transformers/models/bloom/modeling_bloom.py:61-89, :518); its MptModel builds it config.max_seq_len long
# (models/mpt/modeling_mpt.py:317) and a 32-token input on max_seq_len 16 raised "The size of tensor a (32) must match
# the size of tensor b (16)" (transformers in this venv, on CPU). BLOOM's trained length is its config's seq_length
# (bigscience/bloom: 2048), MPT's its max_seq_len (mosaicml/mpt-7b: 2048).
ALIBI = ("positions: --seq 8,192 exceeds the 2,048 positions {name} was trained to ({key}, ALiBi); ALiBi biases each "
         "head's scores by distance and has no table of positions, so it runs longer sequences than it was trained on "
         "(how well it extrapolates is the run's to check); advisor costs the sequence as given")
MPT = (ALIBI.format(name="mpt-7b", key="max_seq_len") + ", but transformers' MptModel builds the bias only max_seq_len "
       "long and fails on a longer sequence: set max_seq_len to 8,192 or more in the config (it adds no weights)")


@pytest.mark.parametrize("model,note", [("bloom-176b", ALIBI.format(name="bloom-176b", key="seq_length")), ("mpt-7b", MPT)])
def test_alibi_models_are_noted_beyond_their_trained_length(model, note):
    """Before, an ALiBi model at --seq 8192 got no note at all (RoPE's alone was said)."""
    e = estimate(model=model, hw="dgx-h100", gpus=8, zero=3, seq=8192, recompute="full")
    assert e.positions == note and note in render_estimate(e).splitlines()
    assert estimate(model=model, hw="dgx-h100", gpus=8, zero=3, seq=2048, recompute="full").positions == ""


def test_plan_notes_alibi_once():
    found = plan("mpt-7b", "dgx-h100", seq=8192, top=2)
    assert found.notes().count(MPT) == 1
