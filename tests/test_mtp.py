"""Multi-token prediction as megatron-core 0.19.2 trains it (advisor.mtp; --mtp-layers, Megatron's --mtp-num-layers):
DeepSeek-V3's depth counted from the source's shapes (transformer/multi_token_prediction.py MultiTokenPredictionLayer:
enorm, hnorm, eh_proj 2h -> h without bias, the last decoder layer's kind, final_layernorm; the embedding and the output
layer shared), where it runs (the last pipeline stage), what it costs there, and which stacks refuse it."""

from __future__ import annotations

import pytest

from advisor import estimate, mtp
from advisor.errors import AdvisorError
from advisor.model import load_model

H, V = 7168, 129280  # deepseek-ai/DeepSeek-V3 config.json hidden_size, vocab_size
DSV3 = dict(model="deepseek-v3", hw="gb200-nvl72", gpus=256, tp=1, pp=4, schedule="interleaved", virtual_stages=4, ep=64,
            micro_batch=1, global_batch=8192, seq=4096, precision="mxfp8", stack="megatron-bridge-perf",
            recompute="selective", recompute_modules="mla_up_proj")


def test_deepseek_v3_depth_parameters_from_the_source_shapes():
    """One depth: DeepSeek-V3's routed layer (config.json: MLA q_lora_rank 1536, kv_lora_rank 512, 128 heads of 128 + 64,
    v 128; 256 experts and one shared of 2048, silu-gated; router 256 x h; two RMSNorms and the latents' two) and
    eh_proj 2h x h and three RMSNorms of h. DeepSeek's checkpoint reports 14B MTP weights with its own copies of the
    embedding and head (2 x V x h = 1.85B), which Megatron shares: 11.61B + 1.85B = 13.46B."""
    attention = H * 1536 + 1536 * 128 * 192 + H * (512 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * H
    experts = 257 * 3 * H * 2048 + 256 * H  # routed + shared gated MLPs, the router
    layer = attention + experts + 2 * H + 1536 + 512  # the layer's two norms and the latents' q and kv norms
    assert mtp.params_per_depth(load_model("deepseek-v3")) == layer + 2 * H * H + 3 * H == 11_610_067_968
    assert (11_610_264_064 + 2 * V * H) / 1e9 == pytest.approx(13.46, abs=0.01)


def test_the_depths_layer_is_the_last_decoder_layers_kind():
    """gpt_layer_specs.py get_gpt_mtp_block_spec_for_backend: spec.layer_specs[-1]: DeepSeek-V3's routed layer, not its
    dense first ones; a dense model's only layer."""
    m = load_model("deepseek-v3")
    assert mtp.layer(m).routed and mtp.layer(m).n_params > m.layers[0].n_params
    assert mtp.layer(load_model("llama3-8b")) is load_model("llama3-8b").layer


def test_model_flops_grow_by_the_depths_layer_projection_and_logits():
    """MFU's numerator counts the depth (Megatron-LM training.py num_floating_point_operations; Megatron-Bridge 0.6.2
    training/utils/flop_utils.py:840-846 alike): per token 3 x (the routed layer + 2 x 2h x h + 2 x h x V)."""
    m = load_model("deepseek-v3")
    base, one = (estimate(**DSV3, mtp_layers=d) for d in (0, 1))
    tokens = 8192 * 4096
    layer = sum(mtp.layer(m).flops_per_token(4096).values())
    added = 3 * (layer + 4 * H * H + 2 * H * V) * tokens
    flops = lambda e: e.tflops_per_gpu * 1e12 * e.step_time_s * 256  # noqa: E731
    assert flops(one) - flops(base) == pytest.approx(added, rel=1e-9)
    assert flops(one) / flops(base) == pytest.approx(1.041, abs=1e-3)  # Megatron's 1.0408 (tests/test_latent.py)


def test_the_last_stage_runs_the_depth_and_a_second_head():
    """Every depth on the last pipeline stage (multi_token_prediction.py mtp_on_this_rank): DeepSeek-V3's layout of 4 x 4
    chunks, [E + 4 t] ... [t + mtp + L], leaves the last rank 13 layers and the head, and with MTP 14 and two heads."""
    base, one = (estimate(**DSV3, mtp_layers=d) for d in (0, 1))
    assert "the last 13 and the head" in base.pipeline and "the last 13, 1 MTP and the head" in one.pipeline
    assert one.step_time_s > base.step_time_s


def test_without_a_pipeline_the_depth_adds_a_layers_states_and_a_second_logits():
    """One rank holds everything: the depth's layer, eh_proj and norms in the weights, and 1 + D logits held."""
    kw = dict(model="qwen3-8b", hw="dgx-h100", dp=8, micro_batch=1, global_batch=8, seq=4096, stack="megatron-core")
    base, one = (estimate(**kw, mtp_layers=d) for d in (0, 1))
    m = load_model("qwen3-8b")
    weights = lambda e: e.memory.parts["weights"]  # noqa: E731
    assert weights(one) / weights(base) == pytest.approx((m.n_params + mtp.params_per_depth(m)) / m.n_params, rel=1e-12)
    # the main loss's peak beside the depth's held logits and loss (memory.py: held x (1 + D), the peak + D x held)
    from advisor.hardware import load_hardware
    from advisor.stack import load_stack
    from advisor.training import TrainingSetup
    from advisor.workload import Workload

    t = Workload.of(m, load_hardware("dgx-h100"), load_stack("megatron-core"), TrainingSetup(seq_len=4096)).tables
    held = 4096 * m.vocab * t.logits_held + 4096 * t.logits_held_per_token
    assert one.memory.parts["logits_loss"] - base.memory.parts["logits_loss"] == pytest.approx(held, rel=1e-9)


@pytest.mark.parametrize("kw,message", [
    (dict(model="llama3-8b", stack="hf-trainer"), "stack hf-trainer does not train multi-token prediction: use --stack"),
    (dict(model="gpt2-xl", stack="megatron-core"), "rotary positions only"),
])
def test_stacks_and_models_megatron_does_not_run_it_with_are_refused(kw, message):
    with pytest.raises(AdvisorError, match=message):
        estimate(hw="dgx-h100", dp=8, mtp_layers=1, **kw)


def test_the_text_output_says_the_depths_and_dispatcher_it_costed():
    """--mtp-layers and --moe-dispatcher change the step (a 62nd layer and a second logits here); the text output names
    them, as --json's setup does, so a run costed with them cannot be read as one without (a sweep found neither)."""
    from advisor.render import render_estimate
    from advisor.search import plan

    kw = dict(gpus=4, tp=1, ep=4, zero=1, micro_batch=1, global_batch=4, seq=1024)
    line = render_estimate(estimate("deepseek-v2-lite", "gb200-nvl72", mtp_layers=1, **kw)).splitlines()[1]
    assert line.endswith(", 1 MTP depth")
    assert "MTP" not in render_estimate(estimate("deepseek-v2-lite", "gb200-nvl72", **kw)).splitlines()[1]
    head = plan("deepseek-v2-lite", "gb200-nvl72", gpus=4, global_batch=4, seq=1024, top=1, mtp_layers=2,
                moe_dispatcher="flex", moe_overlap="shared-experts").header()
    assert ", 2 MTP depths, --moe-dispatcher flex, --moe-overlap shared-experts;" in head


# DeepSeek-V3 on 256 GB200 in two 1F1B stages (61 layers: 31 and 30 + the depth), full recompute: the plan whose last
# rank, with the depth, the head, the depth's embedding copy and two logits, holds more than its first
TWO = dict(model="deepseek-v3", hw="gb200-nvl72", gpus=256, dp=128, tp=1, pp=2, ep=64, zero=1, schedule="1f1b",
           micro_batch=4, global_batch=4096, seq=4096, precision="mxfp8", stack="megatron-core", recompute="full")


def test_the_last_stage_holds_eh_proj_the_norms_and_an_embedding_copy():
    """Under a pipeline the last stage builds an embedding for the depths (gpt_model.py:167-175, pre_process or
    mtp_process) beside DeepSeek-V3's untied output layer: V x h more, with eh_proj's 2h x h and three norms of h;
    a tied model's last stage already holds the table (language_module.py:339-357 shared_embedding_or_output_weight)."""
    m = load_model("deepseek-v3")
    assert mtp.last_stage_outside_params(m, 1) == V * H + 2 * H * H + 3 * H == 1_029_460_992
    assert mtp.last_stage_outside_params(m.model_copy(update={"tied_embeddings": True}), 1) == 2 * H * H + 3 * H
    assert mtp.last_stage_outside_params(m, 0) == 0


def test_the_memory_verdict_is_the_fuller_ranks_and_names_it():
    """31 layers on each rank with the depth: the last rank holds the first's layers' states and 1,029,460,992
    parameters more (the embedding copy, eh_proj, the norms: bf16 weights, fp32 main_grad), so its peak is the one
    shown, and it is 6.1 GiB over the first's: beyond plan's 5% headroom of 185.03 GiB (175.78), where the first's
    171.05 GiB was not, so plan no longer ranks it."""
    from advisor import step
    from advisor.units import GiB

    base, one = (estimate(**TWO, mtp_layers=d) for d in (0, 1))
    assert "the memory shown is the first rank's" in base.pipeline and "the memory shown is the last rank's" in one.pipeline
    extra = mtp.last_stage_outside_params(load_model("deepseek-v3"), 1)
    assert one.memory.parts["weights"] - base.memory.parts["weights"] == pytest.approx(2 * extra, rel=1e-9)
    assert one.memory.parts["gradients"] - base.memory.parts["gradients"] == pytest.approx(4 * extra, rel=1e-9)
    w, c = _inputs({**TWO, "mtp_layers": 1})
    first, last = step._first_and_last(w, c)
    total = lambda e: float(e.memory.peak[0] + e.overhead.total[0]) / GiB  # noqa: E731
    assert total(first) < 0.95 * 185.03 < total(last)
    assert float(step.evaluate(w, c).memory.peak[0]) == float(last.memory.peak[0])


def _megatron_last_rank(chunks: list, pp: int, m: int) -> tuple[float, float]:
    """(the most layer-micro-batches pipeline rank pp - 1 holds after a forward, the most after a forward of its last
    chunk, its loss's) replaying megatron-core's interleaved schedule: its own get_schedule_table (identical in 0.16.1
    and 0.19.2) with microbatch_group_size_per_vp_stage = pp (model_parallel_config.py:567-568), (v - 1) pp warm-up
    forwards on rank pp - 1 (schedules.py:937-938), then one forward and one backward a step, backwards in the reverse
    chunk order (get_model_chunk_id, :1217-1222)."""
    from megatron.core.pipeline_parallel.schedules import get_schedule_table

    v = len(chunks)
    table = [chunk for _, chunk in get_schedule_table(m, v, pp)]
    held = peak = at_loss = 0.0
    for k, chunk in enumerate(table):
        held += chunks[chunk]
        peak, at_loss = max(peak, held), max(at_loss, held) if chunk == v - 1 else at_loss
        if k >= (v - 1) * pp:  # steady state and cool-down: backward k - warm-up
            held -= chunks[v - 1 - table[k - (v - 1) * pp]]
    return peak, at_loss


def test_the_last_ranks_activations_in_flight_as_megatron_schedules_them():
    """Rank pp - 1 of an interleaved pipeline holds, at each loss, pp micro-batches of each of its first v - 1 chunks
    and one of its last; past the first pp micro-batches, one of its first chunk in place of the last's. Under the
    DeepSeek-V3 layouts of Megatron-Bridge's recipes (61 layers on 16 chunks: [E + 4 t], [4 t] x 14, [t + mtp + L]) its
    last chunk holds 1 layer and the MTP depth, its others 4: pp 2 x v 8, 32 micro-batches (GB300's row: 4096 / 128):
    2 x 28 + 2 = 58 at its loss, 2 x 28 + 4 = 60 at its peak, where 30 layers x (7 x 2 + 1) / 8 = 56.25 was costed
    as if its chunks were alike. Chunks alike (14 layers, 4 x 4): (3 x 4 + 1) x 3.5 = 3.25 x 14 both; 1F1B one
    micro-batch, GPipe all of them."""
    from advisor.export.megatron import interleaved_layout
    from advisor.layout import Plan, Schedule
    from advisor.parallel import in_flight, pipeline

    layout_mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    codes = pipeline.np.array([Schedule.interleaved.code, Schedule.one_f_one_b.code, Schedule.gpipe.code])
    held, at_loss = in_flight.in_flight_last(14.0, 4, pipeline.np.array([4, 1, 1]), codes, 64)
    assert list(held) == list(at_loss) == [3.25 * 14, 14.0, 64 * 14.0]
    kinds = (layout_mod.LayerType.decoder, layout_mod.LayerType.mtp)
    for (pp, v), want in {(2, 8): (60.0, 58.0), (4, 4): (52.0, 50.0), (8, 2): (36.0, 34.0)}.items():
        text = interleaved_layout(61, Plan(dp=256 // pp, pp=pp, ep=32, zero=1, schedule="interleaved",
                                           virtual_stages=v), mtp=1)
        rank = layout_mod.PipelineParallelLayerLayout(text, pp).layout[pp - 1]  # megatron-core's own parse
        chunks = [float(sum(chunk.count(t) for t in kinds)) for chunk in rank]
        assert chunks == [4.0] * (v - 1) + [2.0], text
        for m in (pp, 2 * pp, 32):
            got = in_flight.in_flight_last(sum(chunks), pp, v, Schedule.interleaved.code, m, chunks[0])
            assert tuple(map(float, got)) == _megatron_last_rank(chunks, pp, m), (pp, v, m)
        assert tuple(map(float, in_flight.in_flight_last(sum(chunks), pp, v, Schedule.interleaved.code, 32, 4.0))) == want
    # the step passes the layout's chunk of ceil(61 / 16) = 4 (GB200's row: pp 4 x v 4, 8192 / 64 = 128 micro-batches)
    from advisor import step
    from advisor.candidates import Mesh

    w, c = _inputs({**DSV3, "mtp_layers": 1})
    mesh = Mesh.of(c, w.hw.gpus_per_node, w.hw.domain_gpus)
    layers = step._held_layers(w, c, mesh, "last")
    assert float(layers[0]) == 14.0  # 13 layers and the depth
    assert tuple(float(x[0]) for x in step._in_flight(w, c, mesh, layers, "last")) == (52.0, 50.0)


def test_hfu_counts_the_depths_rerun_under_full_recompute_only():
    """Full (uniform) recompute checkpoints each depth's eh_proj and layer (multi_token_prediction.py:1415-1423), 'block'
    skips it (:1424-1428): HFU's FLOPs (hardware less model, the same policy over the decoder's layers) grow by the
    depth's forward less its logits a token under full, by nothing under block."""
    from advisor import step
    from advisor.recompute import mix

    m = load_model("deepseek-v3")
    rerun = mtp.forward_flops_per_token(m, 1, 4096) - 2 * H * V
    for policy, added in (("full", rerun), ("block", 0.0)):
        kw = {**TWO, "recompute": policy, **({"recompute_layers": 2} if policy == "block" else {})}
        (w0, c), (w1, _) = _inputs(kw), _inputs({**kw, "mtp_layers": 1})
        pol = mix(c.recompute, c.recompute_k, 31.0, 1.0, m.n_layers)
        (m0, h0), (m1, h1) = (step.flops(w, c, 1.0, pol) for w in (w0, w1))
        assert float((h1 - m1 - (h0 - m0))[0]) == pytest.approx(added, rel=1e-9, abs=1e-3)


def _inputs(kw):
    """(workload, one-row candidates) of an estimate's inputs (as tests/test_pipeline_split.py builds them)."""
    from advisor.api import build_inputs
    from advisor.candidates import Candidates
    from advisor.layout import resolve_grad_accum
    from advisor.workload import Workload

    kw = dict(kw)
    spec, hw, stack, p, setup, _ = build_inputs(kw.pop("model"), kw.pop("hw"), **kw)
    ga, _ = resolve_grad_accum(setup, p)
    return Workload.of(spec, hw, stack, setup), Candidates.of_plan(p, setup, ga)


def test_the_embedding_copys_gradient_is_all_reduced_between_the_end_stages():
    """finalize_model_grads.py:146 all-reduces the embedding's gradient between the first and the last stage wherever
    mtp_num_layers is set, tied or not: DeepSeek-V3's untied table (V x h = 926,679,040 parameters) is synced with MTP
    and not without it."""
    from advisor.candidates import Mesh
    from advisor.parallel import in_flight, pipeline

    (w0, c), (w1, _) = _inputs(TWO), _inputs({**TWO, "mtp_layers": 1})
    mesh = Mesh.of(c, w1.hw.gpus_per_node, w1.hw.domain_gpus)
    (on0, _, _), (on1, size, _) = (pipeline.tied_sync(w, c, mesh, 4.0) for w in (w0, w1))
    assert not bool(on0[0]) and bool(on1[0]) and float(size[0]) == 4.0 * V * H


def test_the_first_rank_costed_apart_holds_no_logits():
    """Where the first and last ranks are costed apart (step._staged), the first's peak took the larger of its own and
    a stand-in for the last stage (one micro-batch of its layers beside the loss's logits, (1 + D) of them with D MTP
    depths), so its memory grew with the depths it does not hold: DeepSeek-V2-Lite on pp 2 under full recompute,
    26.16 / 27.80 / 29.44 GiB at D = 0 / 1 / 2, and at D = 0 the verdict was that figure, over the last rank's own
    24.69. The last rank's own evaluation holds the logits (gpt_model.py:836-878, post_process on the last stage);
    the first's is its checkpoints and a rerun layer's activations, the same whatever D."""
    from advisor import step
    from advisor.units import GiB

    kw = dict(model="deepseek-v2-lite", hw="dgx-h100", stack="megatron-core", gpus=16, pp=2, dp=8, ep=8, zero=1,
              seq=4096, global_batch=64, recompute="full")
    firsts = []
    for d in (0, 1, 2):
        w, c = _inputs({**kw, "mtp_layers": d})
        first, last = step._first_and_last(w, c)
        assert float(first.memory.logits_loss[0]) == 0.0 and float(last.memory.logits_loss[0]) > 0.0
        firsts.append(float(first.memory.peak[0] + first.overhead.total[0]) / GiB)
    assert firsts[0] == firsts[1] == firsts[2]
    base = estimate(**kw)
    assert "the memory shown is the last rank's" in base.pipeline  # 24.69 GiB over the first's own 23.88


def test_the_embedding_sync_of_an_untied_model_names_the_mtp_copy():
    """DeepSeek-V3 unties its embeddings (config.json tie_word_embeddings false); its MTP depths look the embedding up
    on the last stage, whose copy's gradient is all-reduced with the first stage's (megatron-core 0.19.2
    finalize_model_grads.py:146; pipeline.tied_sync). The collectives called it "the tied embeddings' gradient"."""
    kw = dict(gpus=256, pp=8, schedule="interleaved", virtual_stages=2, ep=32, zero=1, global_batch=4096, micro_batch=1,
              seq=4096, precision="mxfp8", stack="megatron-bridge-perf")
    with_mtp = estimate("deepseek-v3", "dgx-b200", mtp_layers=1, **kw).collectives["pp_p2p"]
    # 129,280 x 7,168 bf16 gradients (the megatron-bridge-perf profile reduces in bf16) = 1.73 GiB
    assert "the embedding gradient of the MTP depths' copy on the last stage: all-reduce of 1.73 GiB" in with_mtp
    assert "tied" not in with_mtp and "embedding" not in estimate("deepseek-v3", "dgx-b200", **kw).collectives["pp_p2p"]
    tied = estimate("gpt2-xl", "dgx-h100", gpus=16, pp=2, zero=1, global_batch=64, stack="megatron-core").collectives
    assert "the tied embeddings' gradient all-reduce" in tied["pp_p2p"]  # GPT-2 ties them
