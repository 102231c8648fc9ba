"""Checkpointing policies and offload (issue 16): pinned to the ZeRO-Offload paper's PCIe volume, first-principles CPU
Adam and recompute FLOPs, and invariants (memory never grows when offloading more; host memory bounds a plan)."""

import re

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from advisor import estimate, plan
from advisor.api import PlanError
from advisor.candidates import Candidates
from advisor.cli import cli
from advisor.hardware import load_hardware
from advisor.layout import Offload, Plan
from advisor.model import load_model
from advisor.parallel import offload
from advisor.stack import load_stack
from advisor.training import Recompute, TrainingSetup
from advisor.workload import Workload

LLAMA2_13B = 13_015_864_320  # Hugging Face LlamaForCausalLM meta-device count (tests/test_hf_families.py's rule)


def _one(plan_kw: dict, setup_kw: dict) -> Candidates:
    p, s = Plan(**plan_kw), TrainingSetup(**setup_kw)
    return Candidates.of_plan(p, s, s.grad_accum or 1)


# -- ZeRO-Offload: PCIe bytes per step (Ren et al. 2021, s.4.1) ---------------------------------------------------
def test_zero_offload_moves_4M_bytes_per_step_on_one_gpu():
    # "the fp16 gradients (2M bytes) ... are offloaded to CPU, and fp16 parameters (2M) ... are copied back to GPU":
    # 4M bytes over PCIe per step for M parameters on one GPU, one micro-batch
    c = _one(dict(dp=1, zero=2, offload="optimizer-cpu"), dict(grad_accum=1))
    down, up = offload.pcie_bytes(c, LLAMA2_13B, 2.0)
    assert float(down[0]) == 2 * LLAMA2_13B and float(up[0]) == 2 * LLAMA2_13B
    assert float(down[0] + up[0]) == 4 * LLAMA2_13B


def test_zero_offload_pcie_bytes_split_over_data_parallel_ranks_and_micro_batches():
    # with ZeRO-2 each of dp ranks offloads its 1/dp partition; gradients go down once per micro-batch (DeepSpeed
    # accumulates them on the CPU), the parameters come up once per step
    c = _one(dict(dp=8, zero=2, offload="optimizer-cpu"), dict(grad_accum=4))
    down, up = offload.pcie_bytes(c, LLAMA2_13B / 8, 2.0)
    assert float(down[0]) == pytest.approx(4 * 2 * LLAMA2_13B / 8, rel=1e-12)
    assert float(up[0]) == pytest.approx(2 * LLAMA2_13B / 8, rel=1e-12)


def test_estimate_of_zero_offload_charges_the_cpu_step_and_the_upload():
    # llama2-13b on one H100: the CPU Adam step on M parameters at the profile's rate (dgx-h100: 20.5 G/s, the
    # DDR5 bound 614.4 GB/s / 30 B) plus the 2M-byte parameter upload at 50 GB/s; the gradient copy (2M / 50 GB/s
    # = 0.52 s per micro-batch) hides behind each micro-batch's backward and recomputation (~0.56 s) but for the
    # last layer's share
    e = estimate(model="llama2-13b", hw="dgx-h100", zero=2, offload="optimizer-cpu", recompute="full", global_batch=32,
                 seq=4096, stack="megatron-deepspeed")
    hw = load_hardware("dgx-h100")
    m = e.params
    assert m == LLAMA2_13B
    cpu = m / hw.host.cpu_adam_params_per_s
    upload = 2 * m / hw.host.pcie_bytes_per_s
    last_layer = 32 * 2 * m / hw.host.pcie_bytes_per_s / 40  # 32 micro-batches x one of 40 layers' gradients
    assert cpu == pytest.approx(0.6349, rel=1e-3)
    assert e.breakdown["offload"] == pytest.approx(cpu + upload + last_layer, rel=1e-6)
    assert e.breakdown["optimizer"] == 0.0  # the GPU steps nothing
    # the GPU keeps the half-precision weights only (DeepSpeed's estimate_zero2_model_states_mem_needs: 2 B/param)
    p = e.memory.parts
    assert p["weights"] == pytest.approx(2 * m) and p["gradients"] == 0 and p["optimizer_states"] == 0
    # host: fp32 master, momentum, variance (12 B) and the fp32 gradient partition (4 B) per parameter
    assert e.host_memory_bytes == pytest.approx(16 * m)


def test_first_principles_cpu_adam_time():
    # the node's CPU shared by its ranks: 8 ranks each stepping 1e9 parameters at 20.5 G/s for the node take 8/20.5 s
    w = Workload.of(load_model("llama2-7b"), load_hardware("dgx-h100"), load_stack("megatron-deepspeed"), TrainingSetup())
    assert float(offload.cpu_step_time(w, 1e9, 8)) == pytest.approx(8 / 20.5, rel=1e-12)
    # FSDP's CPU step is torch's foreach AdamW, 5x slower than the fused kernel per core (measured, offload.py)
    wt = Workload.of(load_model("llama2-7b"), load_hardware("dgx-h100"), load_stack("torchtitan"), TrainingSetup())
    assert float(offload.cpu_step_time(wt, 1e9, 8)) == pytest.approx(8 / 20.5 * 0.70 / 0.14, rel=1e-12)


# -- the single-GPU branch of the seeds' decision tree is costed ------------------------------------------------
def test_llama2_13b_on_one_h100_gets_ranked_offload_plans():
    res = plan("llama2-13b", "dgx-h100", gpus=1, top=5)
    assert res.plans, "no plan fits"
    steps = [p.estimate.step_time_s for p in res.plans]
    assert steps == sorted(steps) and all(s > 0 for s in steps)
    assert all(p.estimate.plan.offload is not Offload.none for p in res.plans)
    assert res.tree["rule"].startswith("ZeRO + CPU offload")  # (then the fine-tuning methods: advisor.finetune)


def test_cli_plan_single_gpu_lists_offload_plans():
    out = CliRunner().invoke(cli, ["plan", "--model", "llama2-13b", "--hw", "dgx-h100", "--gpus", "1", "--top", "3"])
    assert out.exit_code == 0, out.output
    assert "offload" in out.output and "no plan fits" not in out.output


def test_a_profile_without_a_host_side_gets_no_offload_plans_and_says_why():
    out = CliRunner().invoke(cli, ["plan", "--model", "llama2-13b", "--hw", "titan-rtx-pcie", "--gpus", "1", "--explain"])
    assert "has no host side" in out.output
    with pytest.raises(PlanError, match="no host side"):
        estimate(model="gpt2", hw="titan-rtx-pcie", zero=2, offload="optimizer-cpu")


# -- host memory as a constraint --------------------------------------------------------------------------------
def test_offloaded_states_beyond_host_memory_are_rejected_with_a_reason():
    # 13B with ZeRO-Offload needs 16 B/param = 208 GB of host memory: a 128 GiB host cannot hold it
    small = load_hardware("dgx-h100").model_copy(update={"host": load_hardware("dgx-h100").host.model_copy(
        update={"memory_GiB": 128.0})})
    e = estimate(model="llama2-13b", hw=small, zero=2, offload="optimizer-cpu", recompute="full", global_batch=8, seq=4096,
                 stack="megatron-deepspeed")
    assert not e.fits and e.memory.fits  # the GPU would hold it; the host does not
    res = plan("llama2-13b", small, gpus=1, top=5, stack="megatron-deepspeed")
    assert res.rejected.get("offloaded states exceed host memory", 0) > 0
    assert all(p.estimate.host_memory_bytes <= 128 * 2**30 for p in res.plans)
    # NVMe offload holds the states on the drives: only the fp32 gradient partition stays in host memory
    assert any(p.estimate.plan.offload.value.endswith("nvme") for p in res.plans)


# -- memory never grows when offloading more -------------------------------------------------------------------
def test_offloading_more_frees_gpu_memory_llama2_7b_on_8():
    kw = dict(model="llama2-7b", hw="dgx-h100", gpus=8, micro_batch=1, grad_accum=2, seq=4096, stack="megatron-deepspeed")
    p = [estimate(zero=3, offload=o, **kw).memory.peak_bytes for o in ("none", "optimizer-cpu", "params-cpu")]
    assert p[0] > p[1] > p[2]


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["gpt2-medium", "llama2-7b", "llama3-8b"]), dp=st.sampled_from([1, 2, 8]),
       mb=st.sampled_from([1, 2]), rc=st.sampled_from(["none", "full", "selective"]))
def test_memory_never_grows_when_offloading_more(model, dp, mb, rc):
    kw = dict(model=model, hw="dgx-h100", gpus=dp, dp=dp, micro_batch=mb, grad_accum=2, seq=1024, recompute=rc,
              stack="megatron-deepspeed")
    peaks = [estimate(zero=z, offload=o, **kw).memory.peak_bytes
             for z, o in ((3, "none"), (3, "optimizer-cpu"), (3, "params-cpu"))]
    assert peaks[0] >= peaks[1] >= peaks[2]
    z2 = [estimate(zero=2, offload=o, **kw).memory.peak_bytes for o in ("none", "optimizer-cpu")]
    assert z2[0] >= z2[1]


# -- checkpointing policies ---------------------------------------------------------------------------------------
def _e(**kw):
    base = dict(model="llama2-7b", hw="dgx-h100", gpus=8, zero=1, micro_batch=1, global_batch=16, seq=4096,
                stack="megatron-deepspeed")
    return estimate(**{**base, **kw})


def test_block_over_every_layer_is_full_and_none_when_zero_layers_are_left():
    full, block = _e(recompute="full"), _e(recompute="block", recompute_layers=32)
    assert block.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    assert block.memory.peak_bytes == pytest.approx(full.memory.peak_bytes, rel=1e-12)


def test_block_sits_between_none_and_full():
    none, full = _e(recompute="none"), _e(recompute="full")
    for k in (4, 16, 28):
        b = _e(recompute="block", recompute_layers=k)
        assert full.memory.peak_bytes <= b.memory.peak_bytes <= none.memory.peak_bytes
        assert none.step_time_s <= b.step_time_s <= full.step_time_s


def test_every_k_reruns_floor_L_over_k_layers():
    # every 3rd of 32 layers checkpointed: floor(32/3) = 10 layers' forward rerun (torchtitan's ac_freq rule)
    none, full = _e(recompute="none", stack="torchtitan-0.2", zero=3), _e(recompute="full", stack="torchtitan-0.2", zero=3)
    ek = _e(recompute="every-k", recompute_layers=3, stack="torchtitan-0.2", zero=3)
    rerun_full = full.hfu * full.step_time_s - none.hfu * none.step_time_s * 0  # hardware FLOPs scale with hfu x time
    flops = lambda e: e.hw_tflops_per_gpu * e.step_time_s  # noqa: E731  (per GPU, TFLOP per step)
    model = flops(none)
    assert flops(ek) - model == pytest.approx((flops(full) - model) * 10 / 32, rel=1e-9)
    assert rerun_full > 0
    assert ek.breakdown["compute/recompute"] == pytest.approx(full.breakdown["compute/recompute"] * 10 / 32, rel=1e-9)


def test_uniform_groups_keep_one_input_per_group():
    # --recompute-method uniform --recompute-num-layers 4: 8 of 32 inputs kept, 4 layers live while one group reruns
    one, four = _e(recompute="full"), _e(recompute="full", recompute_layers=4)
    assert four.breakdown["compute/recompute"] == pytest.approx(one.breakdown["compute/recompute"], rel=1e-12)
    assert four.memory.parts["activations"] != one.memory.parts["activations"]


def test_activation_offload_costs_the_copies_and_no_recompute():
    none, off = _e(recompute="none", stack="hf-trainer", zero=0), _e(recompute="offload", stack="hf-trainer", zero=0)
    assert off.breakdown.get("compute/recompute", 0.0) == 0.0
    assert off.breakdown["offload"] > 0 and off.memory.parts["activations"] < none.memory.parts["activations"]


def test_megatron_offloads_the_first_k_layers_behind_the_others():
    """Transformer Engine 2.13's CPU offload (pytorch/cpu_offload.py, DefaultOffloadSynchronizer) under Megatron's
    --cpu-offloading-num-layers k: layers 0..k-1 copied on a side stream, layer i's due by the end of layer L - k + i,
    so the GPU keeps L - k layers' activations, and a pass lasts at least f + k x copy (f a layer's compute)."""
    from types import SimpleNamespace

    from advisor.recompute import kept_per_token, mix

    m = mix(np.array([Recompute.offload.code]), np.array([12]), np.array([32.0]), 1, 32, first_k=True)
    assert float(m.offloaded[0]) == pytest.approx(12 / 32)
    assert float(kept_per_token(m, 100.0, 5.0, 40.0)[0]) == pytest.approx(100.0 * 20 / 32)
    # every layer where the stack offloads them all (save_on_cpu): nothing kept on the GPU
    every = mix(np.array([Recompute.offload.code]), np.array([12]), np.array([32.0]), 1, 32)
    assert float(kept_per_token(every, 100.0, 5.0, 40.0)[0]) == 0.0
    w = SimpleNamespace(stack=SimpleNamespace(engine=SimpleNamespace(activation_offload="first_k")))
    # 32 layers of 1 s forward and 2 s backward, copies of 3 s: forward 1 + 12 x 3 - 32 = 5 s exposed, backward none
    def copies(policy, copy_s):
        return [float(x[0]) for x in offload.activation_copies(w, policy, np.array([copy_s]), np.array([32.0]),
                                                                np.array([32.0]), np.array([64.0]))]

    assert copies(m, 3.0) == pytest.approx([5.0, 0.0])
    assert copies(m, 2.0) == [0.0, 0.0]  # copies shorter than the layers between: hidden
    w.stack.engine.activation_offload = "every_layer"  # on the compute stream: every copy both ways, in full
    assert copies(every, 3.0) == pytest.approx([3.0 * 32, 3.0 * 32])


def test_megatron_cpu_offloading_is_refused_where_megatron_refuses_it():
    # megatron-core 0.19 transformer_config.py: no pipeline parallelism, fewer layers than the model's
    kw = dict(model="llama3-8b", hw="dgx-h100", stack="megatron-core", micro_batch=1, global_batch=64, seq=8192,
              recompute="offload")
    with pytest.raises(PlanError, match="CPU offloading runs without pipeline parallelism: --pp 1"):
        estimate(gpus=8, pp=2, recompute_layers=8, **kw)
    with pytest.raises(PlanError, match="offloads fewer layers than the model's 32: --recompute-layers below 32"):
        estimate(gpus=8, recompute_layers=32, **kw)
    half = estimate(gpus=8, zero=1, recompute_layers=16, **kw)
    none = estimate(gpus=8, zero=1, **{**kw, "recompute": "none"})
    # the GPU keeps half the layers' activations, the host the rest; nothing reruns
    assert half.memory.parts["activations"] == pytest.approx(none.memory.parts["activations"] / 2, rel=0.05)
    assert half.breakdown.get("compute/recompute", 0.0) == 0.0 and half.host_memory_bytes > 0


def test_the_ranking_shows_how_many_layers_megatron_offloads():
    """A search offloads half the layers in megatron-core (advisor/space.py block_layers: 16 of Llama 3 8B's 32);
    the table said only 'offload', and estimate's --recompute offload (k = 1: one layer offloaded) then gave the same
    step but 8 GiB more activations on each GPU (on 16 A100 40GB: headroom 64 MiB against the row's 8.4 GiB). The
    row now says offload(16), which --recompute-layers 16 reproduces; hf-trainer offloads every layer: no k."""
    from advisor.render import policy

    assert policy(TrainingSetup(recompute="offload", recompute_layers=16), "megatron-core") == "offload(16)"
    assert policy(TrainingSetup(recompute="offload", recompute_layers=16), "hf-trainer") == "offload"
    out = CliRunner().invoke(cli, ["plan", "--model", "llama3-8b", "--hw", "dgx-h100", "--gpus", "8", "--stack",
                                   "megatron-core", "--seq", "32768", "--global-batch", "16", "--top", "40"]).output
    policies = [m.group(1) for line in out.splitlines() if (m := re.search(r" (offload\S*) +[\d.]+ s ", line))]
    assert policies and set(policies) == {"offload(16)"}, out


def test_a_stack_runs_only_the_policies_its_profile_lists():
    with pytest.raises(PlanError, match="does not run every-k checkpointing"):
        _e(recompute="every-k", recompute_layers=2)  # megatron-deepspeed: none, selective, full, block
    with pytest.raises(PlanError, match="does not offload"):
        _e(zero=3, offload="params-cpu", stack="llm-foundry", recompute="none")


def test_search_picks_a_cheaper_policy_than_full_where_it_fits():
    # Llama 3 8B at 8K on 8 H100 in torchtitan: every-k (k = 2) plans are in the ranking where they fit
    res = plan("llama3-8b", "dgx-h100", gpus=8, seq=8192, stack="torchtitan", top=40)
    policies = {p.estimate.setup.recompute for p in res.plans}
    assert Recompute.every_k in policies or Recompute.none in policies


def test_policy_and_offload_survive_the_plan_round_trip():
    c = _one(dict(dp=2, zero=3, offload="params-nvme"), dict(recompute="block", recompute_layers=5))
    assert c.plan(0).offload is Offload.params_nvme
    s = c.setup(0, TrainingSetup())
    assert s.recompute is Recompute.block and s.recompute_layers == 5


# -- calibrate: the host side this machine can measure -------------------------------------------------------------
@pytest.mark.slow  # the first fused CPU AdamW step initialises for ~5 s
def test_cpu_adam_rate_is_measured_with_torch():
    torch = pytest.importorskip("torch")  # noqa: F841
    from advisor.calibrate.host import cpu_adam_params_per_s

    rate = cpu_adam_params_per_s(n_params=1_000_000, iters=2, threads=1)
    # one core steps 1e7..1e10 parameters a second: ~28-30 bytes a parameter against a core's 1-100 GB/s
    assert 1e7 < rate < 1e10


def test_calibrate_host_without_a_gpu_says_it_cannot_measure_the_copy(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the copy is measured")
    import advisor.calibrate.host as h

    monkeypatch.setattr(h, "cpu_adam_params_per_s", lambda n=0, iters=3, threads=None: 7e8)
    out = CliRunner().invoke(cli, ["calibrate", "--host", "--base", "dgx-h100", "--out", str(tmp_path / "me.yaml")])
    assert out.exit_code == 0, out.output
    assert "cannot be measured here (no GPU visible)" in out.output
    hw = load_hardware(str(tmp_path / "me.yaml"))
    assert hw.host.cpu_adam_Gparams_per_s == 0.7 and hw.host.pcie_GBps == 50.0
    bad = CliRunner().invoke(cli, ["calibrate", "--host", "--base", "titan-rtx-pcie", "--out", str(tmp_path / "x.yaml")])
    assert bad.exit_code != 0 and "base profile has no host side" in str(bad.exception)  # one line (exit 2 via main)


def test_host_profiles_are_sourced():
    for name in ("dgx-a100", "dgx-h100"):
        host = load_hardware(name).host
        assert host is not None and host.source and host.has_nvme
        assert host.cpu_adam_Gparams_per_s < host.cpu_cores * 0.70 + 1e-9  # memory-bound, below the cores' rate
    assert np.isclose(load_hardware("dgx-h100").host.cpu_adam_Gparams_per_s, 614.4 / 30, rtol=0.01)


@settings(max_examples=200, deadline=None)
@given(n_layers=st.integers(1, 128), pp=st.sampled_from([1, 2, 4, 8]), v=st.sampled_from([1, 2]),
       k=st.integers(1, 64), full=st.floats(1.0, 1e6), ckpt=st.floats(0.0, 1.0))
def test_checkpointing_more_layers_never_keeps_more(n_layers, pp, v, k, full, ckpt):
    """block k+1 keeps no more than block k, every-k no more than every-(k+1); all between full and none; the
    rerun share is what each policy's rule says (advisor/recompute.py)."""
    from advisor.recompute import kept_per_token, mix

    layers = max(n_layers / pp, 1.0)
    checkpointed = ckpt * full  # a checkpointed layer keeps at most what it would without
    keep = lambda code, kk: float(kept_per_token(mix(code, kk, layers, v, n_layers), full, checkpointed, full))  # noqa: E731
    b, e = Recompute.block.code, Recompute.every_k.code
    assert keep(b, k + 1) <= keep(b, k) + 1e-9 * full
    assert keep(e, k) <= keep(e, k + 1) + 1e-9 * full
    for code, kk in ((b, k), (e, k)):
        assert keep(Recompute.full.code, 1) - 1e-9 * full <= keep(code, kk) <= keep(Recompute.none.code, 1) + 1e-9 * full
    m = mix(e, k, layers, v, n_layers)
    assert float(m.full) == (n_layers // k) / n_layers


# -- Megatron's optimizer CPU offload (megatron-core's HybridDeviceOptimizer) ------------------------------------
MEGATRON_OFFLOAD = dict(model="llama3-8b", hw="dgx-h100", gpus=8, dp=8, zero=1, micro_batch=1, global_batch=64, seq=4096,
                        recompute="selective", stack="megatron-core")


def test_megatron_optimizer_offload_keeps_the_gradient_buffer_and_steps_once_a_step():
    """hybrid_optimizer.py: the distributed optimizer's shard moves at step time only: its fp32 main gradients down,
    torch's fused CPU AdamW (fused=True: the host's vectorised rate), its parameters up (2 bytes), one after another;
    the GPU keeps its weights and the whole gradient buffer, the states leave."""
    on, off = estimate(offload="optimizer-cpu", **MEGATRON_OFFLOAD), estimate(**MEGATRON_OFFLOAD)
    assert on.memory.parts["gradients"] == off.memory.parts["gradients"] > 0
    assert on.memory.parts["weights"] == off.memory.parts["weights"]
    assert on.memory.parts["optimizer_states"] == 0 < off.memory.parts["optimizer_states"]
    hw = load_hardware("dgx-h100")
    shard = load_model("llama3-8b").n_params / 8  # no experts: the whole model over the 8 ranks
    pcie, rate = hw.host.pcie_bytes_per_s, hw.host.cpu_adam_params_per_s
    expected = shard * 4.0 / pcie + shard * 8 / rate + shard * 2.0 / pcie  # fp32 main grads; 8 ranks share the CPUs
    assert on.breakdown["offload"] == pytest.approx(expected, rel=1e-6)
    assert on.breakdown["optimizer"] == 0.0 < off.breakdown["optimizer"]


def test_megatron_optimizer_offload_runs_under_the_distributed_optimizer_only():
    with pytest.raises(PlanError, match="megatron-core offloads the optimizer under its distributed optimizer only: "
                                        "--zero 1"):
        estimate(offload="optimizer-cpu", **{**MEGATRON_OFFLOAD, "zero": 2})
    with pytest.raises(PlanError, match="megatron-core does not offload params-cpu"):
        estimate(offload="params-cpu", **{**MEGATRON_OFFLOAD, "zero": 3})


def test_one_gpu_auto_plans_offload_as_deepspeed_does():
    """The seeds' single-GPU branch: ZeRO + CPU offload, DeepSpeed's, in hf-trainer (megatron-core's offload would keep
    13B's 52 GB of fp32 gradients on the GPU)."""
    res = plan("llama2-13b", "dgx-h100", gpus=1, top=3)
    assert res.plans and all(p.estimate.setup.stack == "hf-trainer" for p in res.plans)


def test_calibrate_refuses_options_it_would_ignore(tmp_path):
    """--host measures the host side only: a sweep's options beside it were silently dropped (--from a file that did
    not even parse), and --nproc 0 started the default workers while -2 was refused."""
    from _robust import run_main

    out = str(tmp_path / "me.yaml")
    code, _, err = run_main(["calibrate", "--out", out, "--host", "--from", "bad.jsonl", "--no-compute"])
    assert code == 2 and err == ("error: --host measures the host side only (CPU Adam, pinned copies, memory, cores): "
                                 "drop --from, --no-compute, or drop --host for the collectives\n")
    for n in ("0", "-2"):
        code, _, err = run_main(["calibrate", "--out", out, "--nproc", n])
        assert code == 2 and err.startswith(f"error: --nproc {n}: collectives need at least 2 ranks (leave --nproc out")
    # a refit runs no sweep: its options are refused too, and --nproc there is not a rank count to check
    for extra in (["--nproc", "4", "--sizes", "1K:2K"], ["--nproc", "1"]):
        code, _, err = run_main(["calibrate", "--out", out, "--from", "f.jsonl", *extra])
        assert code == 2 and err.startswith(f"error: --from refits saved measurements, it runs no sweep: drop {extra[0]}")
    assert not (tmp_path / "me.yaml").exists()
