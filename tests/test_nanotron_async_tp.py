"""nanotron 0.4's tp_linear_async_communication (the PyPI wheel's nanotron/parallel/tensor_parallel/functional.py), as
the nanotron profile runs it under sequence parallelism when asked (--tp-overlap linear-async:
advisor/parallel/linear_async.py; off by default, as nanotron's) and as its export writes it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

import advisor
from advisor import comm
from advisor.cli import cli
from advisor.comm import Collective
from advisor.errors import AdvisorError
from advisor.hardware import load_hardware
from advisor.model.layer import Split
from advisor.parallel import linear_async, tensor

H100 = load_hardware("dgx-h100")
MiB = 2.0 ** 20
# a Llama layer's sub-blocks, as the layer table names them: q/k/v and gate_up column-parallel, o_proj and down_proj
# row-parallel, their inputs d_model 4096 and q_dim 4096, d_ff 14336 (Llama 3 8B's config.json)
LINEARS = [SimpleNamespace(name="attention/qkv", copies=1, split=Split.column, n_in=4096),
           SimpleNamespace(name="attention/out", copies=1, split=Split.row, n_in=4096),
           SimpleNamespace(name="mlp/up", copies=1, split=Split.column, n_in=4096),
           SimpleNamespace(name="mlp/down", copies=1, split=Split.row, n_in=14336)]
KW = dict(model="llama3-8b", hw="dgx-h100", gpus=8, tp=8, sp=True, stack="nanotron", micro_batch=1, seq=8192)


def _share(hw, g: dict, tp: float = 8.0, tokens: float = 8192.0):
    tp, tokens = np.array([tp]), np.array([tokens])  # one plan, as a search's vectors hold it
    w = SimpleNamespace(layer=SimpleNamespace(linears=LINEARS), hw=hw, act_bytes=2.0)
    act = tokens * 4096 * 2.0  # the [s, b, h] bf16 activation each layer gathers: 64 MiB
    ag = comm.collective_time(Collective.all_gather, tp, act, hw, tp)
    rs = comm.collective_time(Collective.reduce_scatter, tp, act, hw, tp)
    return (float(linear_async.linear_async_share(w, g, ag, ag, rs, tp, tokens, tp)[0]), float(ag[0]), float(rs[0]))


def test_only_the_row_linears_forward_reduce_scatter_stays_exposed_behind_long_gemms():
    """Behind GEMMs long enough, with no SMs held (a GPU without sm_count): the column linear's forward gather hides
    behind its own shard's GEMM (functional.py:161-206), its backward re-gather and reduce-scatter behind dgrad and
    wgrad (:283-331), the row linear's output-gradient gather behind its shard's dgrad and the extra input-gradient
    gather behind wgrad (:415-458); the row linear's forward reduce-scatter is synchronous (:375-378): one of the
    layer's four gather + reduce-scatter pairs' reduce-scatters, RS / (4 (AG + RS)) per sub-block of two pairs."""
    hw = H100.model_copy(update={"gpu": H100.gpu.model_copy(update={"sm_count": None})})
    long = {n.name: 1.0 for n in LINEARS}  # a second each: every collective of 64 MiB is far shorter
    share, ag, rs = _share(hw, long)
    assert share == pytest.approx(2 * rs / (2 * (2 * ag + 2 * rs)), rel=1e-9)
    assert share == pytest.approx(0.25, rel=0.05)  # ag ~ rs on NVLink: a quarter of the layer's TP time
    # no GEMM to hide behind: all exposed, and what the async path adds over the synchronous one (2 AG + 2 RS a
    # sub-block, differentiable_all_gather's backward a reduce-scatter): the column input re-gathered from its saved
    # shard (:283) and the row linear's input gradient gathered (:439), 4096 and 14336 wide over 8 ranks
    none, *_ = _share(hw, {n.name: 0.0 for n in LINEARS})
    extra = sum(float(comm.collective_time(Collective.all_gather, 8, 8192 * n / 8 * 2.0, hw, 8)) for n in (4096, 14336))
    assert none == pytest.approx((2 * (3 * ag + 2 * rs) + extra) / (2 * (2 * ag + 2 * rs)), rel=1e-9)
    assert none > 1.3  # slower than none at all: 35% more TP time


def test_llama3_8b_share_on_h100_by_hand():
    """Llama 3 8B's attention block on TP 8 over one H100 node, each GEMM written out: forward max(AG, G_col / 8 +
    AG h) - G_col / 8 + RS, backward the same pairs beside G_row / 8 (the row dgrad runs on the rank's own shard,
    functional.py:417), G_row (wgrad, beside the 8 MiB input-gradient gather, :439-454) and G_col twice, h the SMs
    NCCL holds (advisor.comm.held_sms: 16 channels of the H100's 132 SMs)."""
    # the forward GEMM seconds advisor.compute gives these linears at 8192 tokens on TP 8 (gate and up summed)
    g = {"attention/qkv": 107e-6, "attention/out": 83e-6, "mlp/up": 408e-6, "mlp/down": 204e-6}
    share, ag, rs = _share(H100, g)
    h = float(comm.held_sms(8, 8, H100))
    assert h == pytest.approx(16 / 132)

    def beside(c, x):
        return max(c, x + c * h) - x

    exposed = 0.0
    for col, row, n_in in ((107e-6, 83e-6, 4096), (408e-6, 204e-6, 14336)):
        extra = float(comm.collective_time(Collective.all_gather, 8, 8192 * n_in / 8 * 2.0, H100, 8))
        exposed += beside(ag, col / 8) + rs + beside(ag, row / 8) + beside(extra, row) + beside(ag, col) + beside(rs, col)
    assert share == pytest.approx(exposed / (2 * (2 * ag + 2 * rs)), rel=1e-9)
    assert 0.5 < share < 1.0


def test_off_by_default_and_costed_when_asked(monkeypatch):
    """By default (nanotron's own, tp_linear_async_communication false: config/parallelism_config.py:43-44) the TP
    collectives run exposed; --tp-overlap linear-async costs every layer's four pairs at the share, the compute
    unchanged."""
    seen = []
    real = tensor.linear_async_share
    monkeypatch.setattr(tensor, "linear_async_share", lambda *a: seen.append(real(*a)) or seen[-1])
    off = advisor.estimate(**KW)
    assert not seen  # the default never calls it
    on = advisor.estimate(**KW, tp_overlap="linear-async")
    share = float(np.ravel(seen[0])[0])
    ag = float(comm.collective_time(Collective.all_gather, 8, 64 * MiB, H100, 8))
    rs = float(comm.collective_time(Collective.reduce_scatter, 8, 64 * MiB, H100, 8))
    saved = 32 * 4 * (ag + rs) * (1.0 - share)  # 32 layers, one micro-batch
    assert off.breakdown["comm/tp"] - on.breakdown["comm/tp"] == pytest.approx(saved, rel=1e-6)
    for part in ("compute/forward", "compute/backward"):
        assert on.breakdown[part] == pytest.approx(off.breakdown[part], rel=1e-12)
    assert len(seen) == 1


@pytest.mark.parametrize("overlap, written", [(None, False), ("none", False), ("linear-async", True)])
def test_the_export_writes_what_the_estimate_costs(overlap, written):
    """tp_linear_async_communication is ParallelismArgs' (config/parallelism_config.py:33); false leaves the column
    linears saving their gathered input (functional.py:352-359), which the export says; true warns that 0.4's async
    row linear gathers input gradients computed with the wrong weight shard (functional.py:417, :439)."""
    out = advisor.launch_config(**{k: v for k, v in KW.items()}, format="nanotron", tp_overlap=overlap)
    cfg = yaml.safe_load(out.text)
    assert cfg["parallelism"]["tp_linear_async_communication"] is written
    assert cfg["parallelism"]["tp_mode"] == "REDUCE_SCATTER"
    assert ("save their all-gathered input" in out.text) is not written
    assert ("input gradients for the other ranks' rows are wrong" in out.text.replace("\n# ", " ")) is written


def test_asked_where_it_cannot_run_is_one_line():
    """Under ALL_REDUCE nanotron's row linear raises (tensor_parallel/nn.py:133-134): --no-sp with it is refused; a
    stack whose profile does not run it says which it runs."""
    with pytest.raises(AdvisorError, match="--tp-overlap linear-async pipelines .* runs without SP"):
        advisor.estimate(**{**KW, "sp": False}, tp_overlap="linear-async")
    with pytest.raises(AdvisorError, match="^stack megatron-core does not overlap its TP collectives with linear-async: "
                                           "use --tp-overlap none or userbuffers$"):
        advisor.estimate(**{**KW, "stack": "megatron-core"}, tp_overlap="linear-async")
    r = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--hw", "dgx-h100", "--tp", "8", "--sp",
                                 "--stack", "nanotron", "--tp-overlap", "linear-async"])
    assert r.exit_code == 0 and "issued async_op beside a GEMM" in r.output, r.output


def test_without_it_the_column_linears_keep_their_gathered_inputs():
    """--tp-overlap none: the synchronous column linear all-gathers (differentiable_all_gather) and F.linear saves the
    gathered input (functional.py:352-359), where the async one saved its sequence shard (:144): q/k/v's and gate_up's
    inputs, 2 bf16 bytes of d_model 4096 each, whole instead of 1/8, over Llama 3 8B's 32 layers and 8192 tokens:
    4 x 4096 x 7/8 x 8192 x 32 bytes = 3.5 GiB more a GPU (engine.gathered_inputs_bytes 4)."""
    on, off = advisor.estimate(**KW, tp_overlap="linear-async"), advisor.estimate(**KW)
    extra = off.memory.parts["activations"] - on.memory.parts["activations"]
    assert extra == pytest.approx(4 * 4096 * (1 - 1 / 8) * 8192 * 32, rel=1e-9)
    assert extra / 2 ** 30 == pytest.approx(3.5)
    # TP without SP gathers nothing: no change (ALL_REDUCE mode runs no async linear, models/llama.py:172)
    a, b = advisor.estimate(**{**KW, "sp": False}), advisor.estimate(**{**KW, "sp": False}, tp_overlap="none")
    assert a.memory.parts["activations"] == b.memory.parts["activations"]
