"""Interleaved pipelines whose chunks do not divide the layers: Megatron's --pipeline-model-parallel-layout, as
Megatron-Bridge's DeepSeek-V3 and Kimi-K2 recipes write it (megatron-bridge 0.6.2 recipes/deepseek/h100/deepseek_v3.py
set_deepseek_v3_pipeline_model_parallel_layout: 61 layers on 16 chunks as [E + 4 t], [4 t] x 14, [t + mtp + L])."""

from __future__ import annotations

import numpy as np
import pytest

from advisor import api
from advisor.errors import AdvisorError
from advisor.export.megatron import interleaved_layout, layout_chunks
from advisor.layout import Plan
from advisor.model import load_model
from advisor.parallel import in_flight, pipeline


def test_layout_fills_only_where_no_chunk_is_empty():
    assert bool(pipeline.layout_fills(61, 16))  # 15 x 4 + 1
    assert bool(pipeline.layout_fills(32, 6))  # 5 x 6 + 2
    assert not bool(pipeline.layout_fills(32, 24))  # 23 x 2 = 46 >= 32: chunks left empty
    assert bool(pipeline.layout_fills(64, 16))  # an even division


def test_busiest_rank_holds_v_chunks_of_the_rounded_up_size():
    """DeepSeek-V3 on pp 4 x v 4: the first rank's chunks 0, 4, 8, 12 hold 4 layers each (the recipe's layout);
    pp 2 x v 8: 8 chunks of 4, 32 layers (ceil(61 / 2) = 31 would undercount)."""
    spec = load_model("deepseek-v3")
    assert float(pipeline.layers_per_stage(spec, np.array(4.0), np.array(4.0))) == 16
    assert float(pipeline.layers_per_stage(spec, np.array(2.0), np.array(8.0))) == 32
    assert float(pipeline.layers_per_stage(spec, np.array(4.0))) == 16  # 1F1B: ceil(61 / 4)


def test_deepseek_layout_string_is_the_recipes():
    """The flag parses, with megatron-core's own parser, to the chunks the recipe lists (less its MTP layer, which
    advisor's DeepSeek-V3 has not)."""
    layout_mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    plan = Plan(dp=16, pp=4, ep=64, etp=1, zero=1, schedule="interleaved", virtual_stages=4)
    text = interleaved_layout(61, plan)
    assert text == "Et*4|(t*4|)*14t*1L"
    assert layout_chunks(61, plan) == [4] * 15 + [1]
    parsed = layout_mod.PipelineParallelLayerLayout.parse_str_to_list(text)
    recipe = [["embedding"] + ["decoder"] * 4] + [["decoder"] * 4] * 14 + [["decoder", "loss"]]
    assert [[str(t.name) for t in chunk] for chunk in parsed] == recipe


def test_a_stack_without_layouts_refuses_them_in_one_line():
    kw = dict(model="deepseek-v3", hw="gb200-nvl72", gpus=256, pp=4, schedule="interleaved", virtual_stages=4, ep=64,
              etp=1, zero=1, micro_batch=1, global_batch=4096, seq=4096, precision="mxfp8", recompute="selective")
    est = api.estimate(stack="megatron-core", **kw)
    assert est.step_time_s > 0
    with pytest.raises(AdvisorError, match="interleaves only layers that divide pp x virtual stages"):
        api.estimate(stack="megatron-deepspeed", **{**kw, "precision": "bf16-mixed"})
    with pytest.raises(AdvisorError, match="a layer in every chunk"):
        api.estimate(stack="megatron-core", **{**kw, "pp": 8, "virtual_stages": 8, "gpus": 512})


def test_rank_0_holds_what_megatron_schedules_and_never_more_than_every_micro_batch():
    """Rank 0 of an interleaved pipeline warms up 2 (pp - 1) + (v - 1) pp chunk-micro-batches and runs one more forward
    before its first backward (megatron-core 0.19.2 schedules.py:937-938): pp v + pp - 1 chunks at its peak, all m v
    where m = pp leaves every micro-batch in the warm-up (:949-951): pp 2 x v 3, m = 2, 4 layers a chunk: 6 chunks,
    24 layers, not 7 x 4 = 28. Replayed: the warm-up's forwards, then one forward and one backward a step (chunks alike)."""
    from advisor.layout import Schedule

    def replay(pp: int, v: int, m: int) -> float:
        warmup = min(2 * (pp - 1) + (v - 1) * pp, m * v)
        held = peak = 0
        for k in range(m * v):
            held += 1
            peak = max(peak, held)
            if k >= warmup:
                held -= 1
        return 4.0 * peak  # 4 layers a chunk

    for pp, v, m in ((2, 3, 2), (2, 3, 4), (4, 4, 4), (4, 4, 8), (8, 2, 8), (8, 2, 16), (2, 8, 32)):
        got = in_flight.in_flight_layers(4 * pp * v, np.array(pp), np.array(v), Schedule.interleaved.code, np.array(m))
        assert float(got) == replay(pp, v, m), (pp, v, m)
    assert float(in_flight.in_flight_layers(24, np.array(2), np.array(3), Schedule.interleaved.code, np.array(2))) == 24.0


def test_a_step_s_first_micro_batch_casts_the_weights_in_full_on_every_stage_the_fill_passes():
    """Transformer Engine quantises the weights once a step, on the first micro-batch (megatron-core passes
    is_first_microbatch; advisor.weight_casts share), and every stage the pipeline's fill passes runs that first
    micro-batch, its full cast included, before it sends it on: the fill does not shrink with more micro-batches.
    DeepSeek-V3 in FP8 on 32 GB200s, pp 4 x dp 8 without EP (every expert's weights on each rank: 0.116 s of casts
    a step on its 16-layer rank, 2 F(1) - F(2) of the forward below): the bubble was (pp - 1) / m of that, so one
    micro-batch more made the step shorter (m 1 -> 2: 2.524 -> 2.514 s). Its 256 local experts' GEMMs at the B200's
    kernel floor leave the host's launches the longer side of each micro-batch (host_overhead 0.041 s at m 1): the
    fill's first micro-batch then lasts the longer of the host's issuing and the GPU's work with the full cast
    (advisor.parallel.pipeline fill), not the host's plus a cast it hides."""
    from advisor import estimate

    kw = dict(gpus=32, tp=1, pp=4, dp=8, zero=1, micro_batch=1, seq=1024, precision="fp8-delayed",
              recompute="selective", stack="megatron-core")
    runs = {m: estimate("deepseek-v3", "gb200-nvl72", grad_accum=m, **kw) for m in (1, 2, 8)}
    cast = 2 * runs[1].breakdown["compute/forward"] - runs[2].breakdown["compute/forward"]
    assert cast == pytest.approx(0.116, abs=0.001)
    assert runs[1].breakdown["host_overhead"] == pytest.approx(0.041, abs=0.001)
    for m in (2, 8):
        assert runs[m].breakdown["pipeline_bubble"] == pytest.approx(runs[1].breakdown["pipeline_bubble"], rel=1e-9)
    assert runs[1].step_time_s < runs[2].step_time_s < runs[8].step_time_s
