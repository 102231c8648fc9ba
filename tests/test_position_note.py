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
