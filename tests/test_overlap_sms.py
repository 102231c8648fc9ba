"""NCCL's thread blocks beside the compute: a collective runs one thread block per runtime channel, each holding an
SM for the whole call (advisor.comm.held_sms), and the data-parallel collectives that overlap the compute take that
share from it (advisor.parallel.data, advisor.parallel.zero3)."""

import pytest
from hypothesis import given, settings, strategies as st

from advisor import comm, estimate
from advisor.hardware import load_hardware

COMPUTE = ("compute/forward", "compute/backward", "compute/recompute")


def _bare(name: str):
    """The profile with no NCCL channels on either link: nothing held."""
    hw = load_hardware(name)
    return hw.model_copy(update={link: getattr(hw, link).model_copy(update={"nccl_channels": None})
                                 for link in ("intra_node", "inter_node")})


def test_channel_counts_follow_nccls_topology_search():
    """reference/nccl_tuning_model.md s.4 and s.7: the A100's NVSwitch ring, 6 channels at 40 GB/s on 240 GB/s of
    NVLink3, duplicated to 12 and doubled at run time: 24 of 108 SMs; across HDR nodes one channel per NIC, doubled:
    16; p4d's four 100 Gb/s NICs: 8. NVLS on sm90: 16 of the H100's 132; H100 rings across nodes 8 -> 16 -> 32.
    sm100 NVLS: 24 inside a node or NVLink domain; its rings across nodes one channel per NIC, doubled at run time
    (16; the further doubling is Hopper's), on 800 Gb/s NICs duplicated first (32)."""
    cases = {("dgx-a100", 8, 8): 24 / 108, ("dgx-a100", 16, 8): 16 / 108, ("aws-p4d", 16, 8): 8 / 108,
             ("aws-p4de", 32, 8): 8 / 108, ("dgx-h100", 8, 8): 16 / 132, ("dgx-h100", 64, 8): 32 / 132,
             ("aws-p5", 16, 8): 32 / 132, ("aws-p6-b200", 8, 8): 24 / 148, ("dgx-b200", 32, 8): 16 / 148,
             ("gb200-nvl72", 72, 4): 24 / 148, ("gb200-nvl72", 144, 4): 16 / 148, ("gb300-nvl72", 8, 4): 24 / 160,
             ("gb300-nvl72", 144, 4): 32 / 160, ("dgx-b300", 16, 8): 32 / 160}
    for (name, n, per_node), share in cases.items():
        assert float(comm.held_sms(n, per_node, load_hardware(name))) == pytest.approx(share), name
    assert float(comm.held_sms(1, 1, load_hardware("dgx-h100"))) == 0.0  # no collective
    for name in ("l4", "titan-rtx-nvlink"):  # no channels derived (or no SM count): not costed
        assert float(comm.held_sms(16, 8, load_hardware(name))) == 0.0, name
    # GCP's TCPX settings fix A3 High's at 8 (NCCL_MIN_NCHANNELS=8 NCCL_MAX_NCHANNELS=8); A3 Mega's TCPXO settings are
    # not sourced: across nodes it holds the node's NVLS 16, never nothing (a review found a network of unknown channels
    # overlapping for free, ranking A3 High's 800 Gb/s ahead of DGX H100's 3,200)
    assert float(comm.held_sms(16, 8, load_hardware("gcp-a3-high"))) == pytest.approx(8 / 132)
    assert float(comm.held_sms(16, 8, load_hardware("gcp-a3-mega"))) == pytest.approx(16 / 132)


def test_fsdp_gathers_take_their_sms_from_the_compute_they_overlap():
    """Llama 3 8B under FSDP on 64 A100s (torchtitan's mid-2024 A100 table): the gathers and reduce-scatters cross
    nodes and run beside most of the step. Holding 16 of 108 SMs while they run adds to the exposed collectives, never
    to the compute parts, and at most the held share of the step the collectives run beside."""
    kw = dict(model="llama3-8b", gpus=64, zero=3, micro_batch=1, seq=8192, recompute="selective", stack="torchtitan-0.2")
    held, bare = estimate(hw=load_hardware("dgx-a100"), **kw), estimate(hw=_bare("dgx-a100"), **kw)
    assert [held.breakdown[k] for k in COMPUTE] == [bare.breakdown[k] for k in COMPUTE]
    extra = held.breakdown["comm/zero_params"] - bare.breakdown["comm/zero_params"]
    assert 0.02 * bare.step_time_s < extra <= 16 / 108 * bare.step_time_s
    assert held.step_time_s == pytest.approx(bare.step_time_s + extra, rel=1e-9)


def test_ddp_bucket_all_reduces_hold_the_nvswitch_rings_sms():
    """GPT-2 XL under DDP on one DGX A100: the bucketed all-reduce beside the backward holds NCCL's 24 ring channels."""
    kw = dict(model="gpt2-xl", gpus=8, micro_batch=4, stack="hf-trainer")
    held, bare = estimate(hw=load_hardware("dgx-a100"), **kw), estimate(hw=_bare("dgx-a100"), **kw)
    extra = held.breakdown["comm/dp_grad"] - bare.breakdown["comm/dp_grad"]
    assert 0.0 < extra <= 24 / 108 * bare.breakdown["compute/backward"]


@pytest.mark.parametrize("name, channels", [("dgx-h100", 16), ("aws-p6-b200", 32)])
def test_an_nvls_tree_all_reduce_holds_the_nvls_channels(name, channels):
    """reference/nccl_tuning_model.md s.7 (ncclNvlsTuning): NVLS runs 16 channels on sm90 and 32 on sm100 across
    nodes (the summary's SM100 NVLS-tree overrides by NIC bandwidth are not given: B200's is unverified); the rings
    across nodes 32 (H100) and 16 (B200). An all-reduce NCCL runs as an NVLS-tree (the tree across
    nodes where the NVSwitch reduces) holds the former, an all-gather the ring's; DDP's bucket across two nodes says
    which it holds."""
    from advisor.comm import network

    hw = load_hardware(name)
    assert float(comm.held_sms(16, 8, hw, network.TREE)) == pytest.approx(channels / hw.gpu.sm_count)
    assert float(comm.held_sms(16, 8, hw, network.RING)) == pytest.approx(hw.inter_node.nccl_channels / hw.gpu.sm_count)
    est = estimate(model="llama3-8b", hw=name, gpus=16, zero=0, micro_batch=1, seq=4096, recompute="full",
                   stack="hf-trainer")
    assert "NVLS-tree across nodes" in est.collectives["dp_grad"]
    assert f"holding {channels} of {hw.gpu.sm_count} SMs" in est.collectives["dp_grad"]


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["dgx-a100", "dgx-h100", "aws-p4d", "gb200-nvl72"]), nodes=st.sampled_from([1, 2, 4]),
       zero=st.sampled_from([0, 1, 2, 3]), micro_batch=st.sampled_from([1, 2, 4]),
       stack=st.sampled_from(["torchtitan-0.2", "megatron-core", "deepspeed", "hf-trainer"]))
def test_held_sms_never_shorten_a_step(name, nodes, zero, micro_batch, stack):
    """Whatever the plan, the SMs a collective holds only lengthen the step, by no more than their share of it."""
    hw = load_hardware(name)
    if zero < 2 and stack == "torchtitan-0.2":
        zero = 3  # torchtitan shards with FSDP2 (ZeRO-1 only under a pipeline; no DDP of its own without one)
    kw = dict(model="llama3-8b", gpus=nodes * hw.gpus_per_node, zero=zero, micro_batch=micro_batch, seq=4096,
              recompute="full", stack=stack)
    held, bare = estimate(hw=hw, **kw), estimate(hw=_bare(name), **kw)
    tree = comm.NVLS_TREE_CHANNELS[hw.gpu.block_scaling] / hw.gpu.sm_count if hw.intra_node.nvls else 0.0
    share = max(float(comm.held_sms(kw["gpus"], hw.gpus_per_node, hw)), float(comm.held_sms(8, 8, hw)), tree)
    assert bare.step_time_s <= held.step_time_s <= bare.step_time_s * (1.0 + share) + 1e-12


@pytest.mark.parametrize("stack", ["torchtitan-0.2", "hf-trainer", "deepspeed", "megatron-core"])
@pytest.mark.parametrize("name, zero", [("dgx-a100", 3), ("dgx-h100", 2), ("dgx-h100", 1)])
def test_turning_overlap_off_never_makes_a_step_faster(stack, name, zero):
    """overlap_grad_reduce=False serialises what overlap hides; the SMs an overlapped collective holds never make
    the overlapped step slower than the serial one (a review found ZeRO-2/3 costed faster with overlap off)."""
    if stack == "torchtitan-0.2" and zero == 1:
        return  # torchtitan shards only the optimizer under a pipeline
    kw = dict(model="llama3-8b", hw=name, gpus=64, zero=zero, micro_batch=1, seq=8192, recompute="selective", stack=stack)
    assert estimate(overlap_grad_reduce=True, **kw).step_time_s <= estimate(overlap_grad_reduce=False, **kw).step_time_s


def test_held_sms_of_many_distinct_groups_equals_one_at_a_time():
    """A search's arrays are costed once per distinct (n, per_node) from advisor.distinct's threshold on: 30,000
    distinct groups (a review found the first version recursing for ever there) give what each gives alone."""
    import numpy as np

    hw = load_hardware("dgx-h100")
    n = np.arange(1.0, 30001.0)
    many = comm.held_sms(n, 8, hw)
    assert many.shape == n.shape
    for i in (0, 7, 8, 15, 29999):
        assert many[i] == pytest.approx(float(comm.held_sms(n[i], 8, hw)))
    assert (many[0], many[7], many[8]) == (0.0, pytest.approx(16 / 132), pytest.approx(32 / 132))


def test_deepspeed_host_work_per_call_holds_no_sms():
    """DeepSpeed 0.3's coordinator (megatron-deepspeed's zero3_calls) spends host time on every call, slicing per rank
    in Python, while its fetch blocks; no NCCL thread block runs then. With every call all host (its collective free)
    the held SMs add nothing; with the same seconds all collective they add at most the held share of them."""
    import numpy as np

    from advisor.compute import LayerTimes
    from advisor.model import load_model
    from advisor.parallel import zero3
    from advisor.stack import load_stack
    from advisor.training import TrainingSetup
    from advisor.workload import Workload

    stack = load_stack("megatron-deepspeed")
    w = Workload.of(load_model("gpt2-xl"), load_hardware("dgx-a100"), stack, TrainingSetup(seq_len=1024, micro_batch=1))
    n = len(w.layer.module_weights())
    lt = LayerTimes(*(np.array([t]) for t in (4e-3, 1e-3, 1e-3, 6e-3, 12e-3, 0.0)))
    calls = {k: [np.array([2e-3])] * n for k in ("gather_s", "reduce_s")}
    one = dict(gathered=[np.array([1.0])] * n, root_gather_s=np.array([0.0]), root_reduce_s=np.array([0.0]))
    host = zero3.SubModuleCalls(**calls, **one, gather_comm_s=[np.array([0.0])] * n, reduce_comm_s=[np.array([0.0])] * n)
    coll = zero3.SubModuleCalls(**calls, **one)
    z, layers, rerun = stack.engine.zero3_calls, np.array([1.0]), np.array([0.0])
    bare = np.add(*zero3.exposed(w, z, lt, layers, rerun, host, 0.0))
    assert np.add(*zero3.exposed(w, z, lt, layers, rerun, host, 0.25)) == pytest.approx(bare)
    held = np.add(*zero3.exposed(w, z, lt, layers, rerun, coll, 0.25))
    assert bare < held <= bare + 0.25 * 2 * n * 2 * 2e-3 + 1e-12  # gathers (two passes) and reduce-scatters
