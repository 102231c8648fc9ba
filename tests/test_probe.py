"""advisor probe (issue 15): the attribution of measured tensors to the layer's dimensions, on numbers and on a toy
module whose saves are known; the probe against PyTorch's own memory tracker; and the shipped profiles re-probed
from the libraries they were measured on (skipped, with the pip command, where a library is not installed)."""

from __future__ import annotations

import importlib.util

import pytest

from advisor.probe.solve import FREE_CONFIGS, PER_LAYER, TIED_CONFIGS, Dims, ProbeError, attribute, check_configs

torch = pytest.importorskip("torch")

FORM = ("d_model", "d_ff", "q_dim", "kv_dim", "heads", "d_head", "constant")


def _sizes(fn, configs=FREE_CONFIGS):
    return [fn(c) for c in configs]


@pytest.mark.parametrize("fn, want", [
    (lambda c: c.d_model, {"d_model": 1}),
    (lambda c: 2 * c.d_ff, {"d_ff": 2}),
    (lambda c: c.heads * c.d_head + 2 * c.kv_heads * c.d_head, {"q_dim": 1, "kv_dim": 2}),  # a fused q/k/v output
    (lambda c: c.heads, {"heads": 1}),  # flash attention's log-sum-exp
    (lambda c: c.heads * c.s, {"scores": 1}),  # eager attention's s x s scores
    (lambda c: c.d_head / 2, {"d_head": 0.5}),  # a rotary table shared by the b = 2 sequences
    (lambda c: 1, {"constant": 1}),  # a norm's statistics
])
def test_each_size_is_attributed_to_what_it_is_made_of(fn, want):
    assert attribute(_sizes(fn), FREE_CONFIGS) == pytest.approx(want)


def test_a_per_layer_tensor_is_not_a_per_token_quantity():
    # a bias gradient (d_ff elements per layer) and a weight read by an element-wise op (d_model x d_ff)
    assert PER_LAYER in attribute(_sizes(lambda c: c.d_ff / c.tokens), FREE_CONFIGS)
    assert PER_LAYER in attribute(_sizes(lambda c: c.d_model * c.d_ff / c.tokens), FREE_CONFIGS)


def test_a_size_made_of_three_dimensions_is_refused():
    with pytest.raises(ProbeError, match="no sum of one or two"):
        attribute(_sizes(lambda c: c.d_model + c.d_ff + c.heads * c.d_head), FREE_CONFIGS)


def test_configs_that_tie_two_dimensions_are_refused():
    check_configs(FREE_CONFIGS, FORM)
    check_configs(TIED_CONFIGS, tuple(t for t in FORM if t != "q_dim"))
    with pytest.raises(ProbeError, match="q_dim proportional to d_model|equal dimensions"):
        check_configs(TIED_CONFIGS, FORM)  # GPT-2's q_dim is d_model on every config
    with pytest.raises(ProbeError, match="three configs"):
        check_configs(FREE_CONFIGS[:2], FORM)
    twice = tuple(Dims(2 * c.d_model, 2 * c.d_ff, c.heads, c.kv_heads, c.d_head, c.vocab, c.s) for c in FREE_CONFIGS)
    with pytest.raises(ProbeError):
        check_configs((FREE_CONFIGS[0], twice[0], FREE_CONFIGS[1]), FORM)


class _Block(torch.nn.Module):
    """Known saves, fp32: the input (4 h, read by two linears: one storage), a fused q/k/v output squared (4 (q + 2kv),
    saved by the product), the up projection's output (4 f, GELU's input); GELU's output is not saved (sum)."""

    def __init__(self, d: Dims):
        super().__init__()
        self.qkv = torch.nn.Linear(d.d_model, d.heads * d.d_head + 2 * d.kv_heads * d.d_head, bias=False)
        self.up = torch.nn.Linear(d.d_model, d.d_ff, bias=False)

    def forward(self, x):
        a = self.qkv(x)
        return x + ((a * a).sum(-1, keepdim=True) + torch.nn.functional.gelu(self.up(x)).sum(-1, keepdim=True))


class _Toy(torch.nn.Module):
    def __init__(self, d: Dims, n: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def _toy_adapter():
    from advisor.probe.adapter import Adapter, Case, Family

    class Toy(Adapter):
        stack, library = "toy", "torch"
        families = {"toy": Family("tests/test_probe.py _Block", "gelu")}
        default_family = "toy"
        policies = ("none",)

        def build(self, family, dims, n_layers, mode, attention, policy, emulate=True):
            model = _Toy(dims, n_layers)
            x = torch.randn(dims.b, dims.s, dims.d_model, requires_grad=True)
            return Case(model, lambda: model(x), dims.tokens)

    return Toy()


def test_the_toy_blocks_saves_come_out_as_their_forms():
    from advisor.probe.core import probe

    p = probe(_toy_adapter())
    (saved,) = p.saved
    # x (made in the previous block, its output: 4 h), a (4 (q + 2kv)), up's output (4 f); the block's own output is
    # the next block's x (4 h); everything else is freed. No norm here: d_model is `sequence`, the rest `split`.
    assert saved["layer"] == {"split": {"d_ff": 4, "q_dim": 4, "kv_dim": 8}, "sequence": {"d_model": 4}}
    assert saved["outside_layers"] == {}
    (host,) = p.host
    assert host["forward_ops"] > 0 and host["backward_ops"] > 0


def _memtracker_layer_bytes(case, layer_module) -> int:
    """Activation bytes a layer leaves alive after its forward, by PyTorch's own tracker."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState

    mt = MemTracker()
    mt.track_external(case.model)
    with mt:
        case.forward()
        snaps = mt.memory_tracking[layer_module].snapshots
        act = [s[torch.device("cpu")][_MemRefType.ACT] for s in (snaps[_ModState.PRE_FW][-1], snaps[_ModState.POST_FW][-1])]
    return act[1] - act[0]


def _probe_layer_bytes(adapter, case) -> float:
    from advisor.probe.measure import run_step

    step = run_step(case.model, case.forward, case.tokens, case.backward_context)
    return sum(t.per_token * case.tokens for t in step.alive if adapter.layer_of(t.made_in) == 1)


def _agreement(adapter, family, mode="mixed", attention="sdpa"):
    d = adapter.configs(family)[0]
    torch.manual_seed(0)
    case = adapter.build(family, d, 3, mode, attention, "none")
    layer = next(m for n, m in case.model.named_modules() if n.endswith("layers.1") or n.endswith("h.1"))
    tracked = _memtracker_layer_bytes(case, layer)
    torch.manual_seed(0)
    probed = _probe_layer_bytes(adapter, adapter.build(family, d, 3, mode, attention, "none"))
    if mode == "mixed" and adapter.stack == "hf-trainer":
        # the tracker also counts autocast's cached bf16 copies of the layer's linear weights, which the profile
        # leaves to advisor/optimizer.py (autocast's weight casts): 2 bytes per weight
        probed += 2 * sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    return probed, tracked


def test_the_probe_agrees_with_pytorchs_memory_tracker_on_the_toy():
    probed, tracked = _agreement(_toy_adapter(), "toy")
    assert probed == pytest.approx(tracked, rel=0.03)  # the 3%


def _needs(module: str, pip: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} not installed: {pip}")


@pytest.mark.slow
@_needs("transformers", "pip install transformers==5.23.0")
@pytest.mark.parametrize("family, mode", [("llama", "mixed"), ("gpt2", "fp32")])
def test_the_probe_agrees_with_pytorchs_memory_tracker_on_hf_layers(family, mode):
    from advisor.probe import adapter_for

    probed, tracked = _agreement(adapter_for("hf-trainer"), family, mode)
    assert probed == pytest.approx(tracked, rel=0.03)  # the 3%


@pytest.mark.slow
@_needs("torchtitan", "pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro docstring-parser typeguard triton")
def test_the_probe_agrees_with_pytorchs_memory_tracker_on_torchtitans_block():
    from advisor.probe import adapter_for

    probed, tracked = _agreement(adapter_for("torchtitan"), "llama")
    assert probed == pytest.approx(tracked, rel=0.03)  # the 3%


def _total(b, layer) -> float:
    from advisor.stack import LayerBytes, PerLayerBytes

    v = LayerBytes.of(b if isinstance(b, PerLayerBytes) else PerLayerBytes(**b), layer)
    return v.split + v.sequence + v.whole


# the configs validation/probes/activation_probe.py measured the shipped hf-trainer numbers on (h 256, 4 heads of 64)
OLD_PROBE_LAYERS = {"llama": (256, 688, 4, 2, 64, "swiglu", "rmsnorm"), "gpt2": (256, 1024, 4, 4, 64, "gelu", "layernorm")}


@pytest.mark.slow
@_needs("transformers", "pip install transformers==5.23.0")
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_hf_trainer_reprobed_reproduces_its_profile(family):
    """The hf-trainer adapter against the numbers the old probes shipped, on the old probes' layer: what a layer
    saves within 0.1% (every mode and attention), under full recomputation within 2% (the shipped figure adds 10 bytes
    per token of state the allocator timeline saw), element-wise bytes within 0.1%, aten ops per sdpa layer within 2%.
    Not compared: outside_layers (the shipped one is an older hand formula over the allocator timeline, logits
    excluded: 17h + 8 d_head for Llama under autocast where the probe finds 8h + 4 d_head + 4), eager attention's
    per-score traffic (the shipped one is (eager - sdpa) per score, the probe's only the score-sized tensors), and
    eager's ops per layer (the shipped 123 counts the 23 ops that build the mask, once per forward, in the layer)."""
    from advisor.model.catalogue import gpt2_like, llama_like
    from advisor.probe import adapter_for
    from advisor.probe.core import probe
    from advisor.stack import load_stack

    h, f, heads, kv, dh, mlp, norm = OLD_PROBE_LAYERS[family]
    spec = (gpt2_like("old-probe", 2, h, heads, d_ff=f) if family == "gpt2"
            else llama_like("old-probe", 2, h, heads, kv, f, 32000, 4096))
    layer = spec.layer
    assert (layer.d_head, layer.mlp.value, layer.norm.value) == (dh, mlp, norm)
    shipped, p = load_stack("hf-trainer"), probe(adapter_for("hf-trainer"), family)
    # one head entry per attention kernel, each reachable: the first entry that matches is taken (advisor.stack.Entry)
    head_keys = [(e["attention"], e["mlp"]) for e in p.host_outside_layers]
    assert sorted(head_keys) == [("eager", mlp), ("sdpa", mlp)], head_keys
    for e in p.saved:
        if e.get("compile") == "compiled":  # the compiled entries, number for number, below
            continue
        s = next(x for x in shipped.memory.saved if x.matches(e["mode"], e["attention"], mlp))
        # within 0.1%: GPT-2 in pure bf16 under sdpa saves 4 bytes per token less than shipped (constant 12 vs 8)
        assert _total(e["layer"], layer) == pytest.approx(_total(s.layer, layer), rel=1e-3), e
        assert e["layer"].get("scores", 0) == s.layer.scores
        assert _total(e["full_recompute"], layer) == pytest.approx(_total(s.full_recompute, layer), rel=0.02), e
    for e in p.elementwise:
        compiled = e.get("compile") == "compiled"
        s = next(x for x in shipped.kernels.elementwise if x.matches(e["mode"], "sdpa", mlp, e.get("compile", "eager")))
        for phase in ("forward", "backward"):
            if compiled:  # probed by this probe: number for number
                assert e[phase] == getattr(s, phase).model_dump(exclude_defaults=True), (e, phase)
            else:
                assert _total(e[phase], layer) == pytest.approx(_total(getattr(s, phase), layer), rel=1e-3), (e, phase)
    for e in p.saved:  # the compiled saves (Llama: advisor.probe.compiled), number for number
        if e.get("compile") == "compiled":
            s = next(x for x in shipped.memory.saved if x.matches(e["mode"], e["attention"], mlp, "compiled"))
            for key in ("layer", "full_recompute"):
                assert e[key] == getattr(s, key).model_dump(exclude_defaults=True), (e["mode"], key)
    for e in p.host:
        if e.get("compile") == "compiled":
            s = next(x for x in shipped.kernels.host if x.matches(e["mode"], "sdpa", mlp, "compiled"))
            assert (e["forward_ops"], e["backward_ops"]) == (s.forward_ops, s.backward_ops), e["mode"]
    sdpa = next(e for e in p.host if e["attention"] == "sdpa" and e.get("compile") != "compiled")
    s = next(x for x in shipped.kernels.host if x.matches("fp32", "sdpa", mlp))
    # within 2%: GPT-2 issues one op more each way here (76/99 vs 75/98) than in host_overhead.py's b = 1, s = 8 run
    assert sdpa["forward_ops"] == pytest.approx(s.forward_ops, rel=0.02)
    assert sdpa["backward_ops"] == pytest.approx(s.backward_ops, rel=0.02)


@pytest.mark.slow
@_needs("torchtitan", "pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro docstring-parser typeguard triton")
def test_torchtitan_reprobed_matches_its_shipped_profile():
    """stack_profiles/torchtitan.yaml's probed entries are what the probe measures today, number for number: eager,
    and compiled (advisor.probe.compiled: the block and the loss as torch.compile hands them to Inductor)."""
    from advisor.probe import adapter_for
    from advisor.probe.core import probe
    from advisor.probe.fragment import fragment
    from advisor.stack import load_stack

    shipped = load_stack("torchtitan")
    frag = fragment(probe(adapter_for("torchtitan")), shipped)
    (head,) = frag["kernels"]["host_outside_layers"]
    assert (head["forward_ops"], head["backward_ops"]) == (shipped.kernels.host_outside_layers[0].forward_ops,
                                                           shipped.kernels.host_outside_layers[0].backward_ops)
    def ours(section, how):
        (e,) = [e for e in section if e.get("compile", "eager") == how]
        return e

    def theirs(entries, how="compiled"):
        return next(e for e in entries if e.matches("mixed", "sdpa", "swiglu", how))

    for how in ("eager", "compiled"):
        host, s_host = ours(frag["kernels"]["host"], how), theirs(shipped.kernels.host, how)
        assert (host["forward_ops"], host["backward_ops"]) == (s_host.forward_ops, s_host.backward_ops), how
        ew, s_ew = ours(frag["kernels"]["elementwise"], how), theirs(shipped.kernels.elementwise, how)
        assert ew["forward"] == s_ew.forward.model_dump(exclude_defaults=True), how
        assert ew["backward"] == s_ew.backward.model_dump(exclude_defaults=True), how
        saved, s_saved = ours(frag["memory"]["saved"], how), theirs(shipped.memory.saved, how)
        for key in ("layer", "full_recompute", "selective"):
            assert saved[key] == getattr(s_saved, key).model_dump(exclude_defaults=True), (how, key)
        assert saved["outside_layers"] == s_saved.outside_layers
    # the compiled loss, per logit (its chunked peak, peak / 8, is the profile's own arithmetic)
    (loss,), (logits,) = frag["kernels"]["loss"], frag["memory"]["logits"]
    s_loss = theirs(shipped.kernels.loss)
    assert (loss["forward"], loss["backward"]) == (s_loss.forward, s_loss.backward) == (2, 4)
    assert (logits["held"], logits["peak"]) == (2, 4)
    assert theirs(shipped.memory.logits).peak == logits["peak"] / 8


def test_probe_cli_refuses_an_unknown_stack_and_a_missing_library_in_one_line(monkeypatch):
    from click.testing import CliRunner

    from advisor.cli import cli
    from advisor.probe.adapters.hf import HFTrainer

    r = CliRunner().invoke(cli, ["probe", "--stack", "nope"])
    assert r.exit_code != 0 and "no probe for stack 'nope'" in str(r.exception or r.output)
    monkeypatch.setattr(HFTrainer, "library", "no-such-distribution-xyz")
    r = CliRunner().invoke(cli, ["probe", "--stack", "hf-trainer"])
    assert "not installed: pip install transformers==5.23.0" in str(r.exception)
    assert "\n" not in str(r.exception)


@pytest.mark.slow
@_needs("megatron", "pip install megatron-core==0.16.1")
def test_megatron_core_local_spec_probe_agrees_with_the_hand_derived_te_layer():
    """megatron-core's local spec (the one that builds on CPU) probed, against what stack_profiles/megatron-core.yaml
    derives by hand for its Transformer Engine layers: the fused bias-SwiGLU MLP keeps 6f (its input and fc2's input),
    the GELU MLP 4f, a fully recomputed layer its 2h input (GPT's under dropout too: its masks are drawn again in
    the recomputation), and GPT's attention q, k, v and its output (8 where kv = q = o). Not compared, because the
    local spec is not TE: its norms are torch's (more saved than TE's fused LayerNormLinear), its attention unfused
    (the s x s scores), and it expands grouped K and V to every head. Run after other tests, the GPT layer once
    counted a second h-sized tensor that only a reference cycle held (advisor/probe/measure.py collects them)."""
    from advisor.probe import adapter_for
    from advisor.probe.core import probe
    from advisor.stack import load_stack

    shipped = load_stack("megatron-core")
    for family, mlp, d_ff in (("llama", "swiglu", 6), ("gpt", "gelu", 4)):
        p = probe(adapter_for("megatron-core"), family)
        (e,) = [x for x in p.saved if x["mode"] == "mixed"]
        te = next(x for x in shipped.memory.saved if x.matches("mixed", "sdpa", mlp))
        assert e["layer"]["split"]["d_ff"] == te.layer.split["d_ff"] == d_ff
        assert e["full_recompute"] == te.full_recompute.model_dump(exclude_defaults=True) == {"sequence": {"d_model": 2}}
        table = te.layer.split["q_dim"] + te.layer.split["o_dim"]  # q and the output linear_proj keeps
        if family == "gpt":
            # the output at o_dim (heads x d_v, q_dim but under MLA)
            assert e["layer"]["split"]["q_dim"] == sum(te.layer.split[d] for d in ("q_dim", "o_dim", "kv_dim")) == 8
            # the core_attn checkpoint (selective) keeps q, k, v as views of linear_qkv's output: nothing more
            assert e["selective"]["split"]["q_dim"] == 8 and _checkpointed("gpt2-xl") == 0.0
        else:
            # under it the RoPE'd q and k beside the whole fused output the value is a view of (advisor.memory
            # checkpointed_qkv_kept): 2 q + 2 kv bytes more than the table's q, k, v, in its numbers 6 q_dim + 6 kv_dim
            sel = e["selective"]["split"]
            assert (sel["q_dim"], sel["kv_dim"]) == (table + 2, te.layer.split["kv_dim"] + 2) == (6, 6)
            assert _checkpointed("llama3-8b") == 2 * 4096 + 2 * 1024  # 32 and 8 heads of 128 (config.json)


def _checkpointed(model: str) -> float:
    from advisor.hardware import load_hardware
    from advisor.memory import checkpointed_qkv_kept
    from advisor.model import load_model
    from advisor.stack import load_stack
    from advisor.training import TrainingSetup
    from advisor.workload import Workload

    setup = TrainingSetup(seq_len=1024, precision="bf16", stack="megatron-core", recompute="selective")
    w = Workload.of(load_model(model), load_hardware("dgx-h100"), load_stack("megatron-core"), setup)
    return float(checkpointed_qkv_kept(w, 1))


def test_torchtitans_sequence_parallel_norm_outputs_are_saved_gathered():
    """torchtitan's TP plan hands each SequenceParallel norm's output to PrepareModuleInput(Replicate): the
    column-parallel linears save the all-gathered copy, the whole sequence on every TP rank (0.3.0
    models/common/decoder_sharding.py, 0.2.2 apply_tp), so the probe files those bytes as `whole`, not `sequence`;
    a row-parallel GEMM's output is its partial sum (whole) as eager autograd keeps it, but the reduced shard where
    torch.compile's partitioner keeps it (it never recomputes a collective)."""
    from advisor.probe.adapters.torchtitan import Torchtitan
    from advisor.probe.measure import Tensor
    from advisor.stack import load_stack

    tt = Torchtitan()
    norm = Tensor(2.0, 1, "layers.1.attention_norm", "mul", "layers.1.attention_norm", output=True)
    assert tt.split(norm, "d_model", "none") == "whole"  # its output; a composite norm's fp32 copies stay `sequence`
    assert tt.split(Tensor(4.0, 1, norm.module, "_to_copy", norm.made_in), "d_model", "none") == "sequence"
    assert tt.split(Tensor(2.0, 1, "layers.1", "add", "layers.1"), "d_model", "none") == "sequence"
    assert tt.split(Tensor(4.0, 1, "layers.1.ffn_norm", "rsqrt", "layers.1.ffn_norm"), "constant", "none") == "sequence"
    wo = Tensor(2.0, 1, "layers.1.attention.wo", "mm", "layers.1.attention.wo")
    assert tt.split(wo, "d_model", "selective") == "whole"
    assert tt.split(Tensor(2.0, 1, wo.module, "mm", wo.made_in, compiled=True), "d_model", "none") == "sequence"
    for stack in ("torchtitan", "torchtitan-0.2"):
        for e in load_stack(stack).memory.saved:  # eager and compiled: the two norms' outputs, 2 bytes each a token
            assert e.layer.whole == {"d_model": 4} and e.layer.sequence["d_model"] == 4, (stack, e.compile)


@pytest.mark.slow
@_needs("torchtitan", "pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro docstring-parser typeguard triton")
def test_torchtitan_01_reprobed_matches_its_shipped_profile():
    """stack_profiles/torchtitan-0.1.yaml's eager entries are the probe of torchtitan's block with torch's composite
    rms_norm (no fused-kernel emulation), number for number: 73 + 123 aten ops a block, the norms' fp32 copies saved
    and moved. Its per-op selective table is torchtitan-0.2's derivation (wk recomputed), not compared."""
    from advisor.probe import adapter_for
    from advisor.probe.core import probe
    from advisor.probe.fragment import fragment
    from advisor.stack import load_stack

    shipped = load_stack("torchtitan-0.1")
    frag = fragment(probe(adapter_for("torchtitan-0.1")), shipped)
    (host,), (head,) = frag["kernels"]["host"], frag["kernels"]["host_outside_layers"]
    s_host, s_head = shipped.kernels.host[0], shipped.kernels.host_outside_layers[0]
    assert (host["forward_ops"], host["backward_ops"]) == (s_host.forward_ops, s_host.backward_ops) == (73, 123)
    assert (head["forward_ops"], head["backward_ops"]) == (s_head.forward_ops, s_head.backward_ops)
    (ew,), (saved,) = frag["kernels"]["elementwise"], frag["memory"]["saved"]
    s_ew, s_saved = shipped.kernels.elementwise[0], shipped.memory.saved[0]
    assert ew["forward"] == s_ew.forward.model_dump(exclude_defaults=True)
    assert ew["backward"] == s_ew.backward.model_dump(exclude_defaults=True)
    for key in ("layer", "full_recompute"):
        assert saved[key] == getattr(s_saved, key).model_dump(exclude_defaults=True), key
    assert saved["outside_layers"] == s_saved.outside_layers
    # against the fused kernel (torchtitan's profile): the same block but for its norms
    fused = load_stack("torchtitan").kernels.elementwise[0]
    assert fused.forward.split == s_ew.forward.split and s_ew.forward.sequence["d_model"] > 4 * fused.forward.sequence["d_model"]
