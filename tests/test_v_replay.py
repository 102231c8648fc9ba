"""The V schedules as torch 2.13 runs them. ScheduleZBVZeroBubble builds its action lists for max(2 pp - 1, n)
micro-batches and blanks those of micro-batches n and beyond (torch/distributed/pipelining/schedules.py:3269-3394),
refusing no count; ScheduleDualPipeV raises under 2 pp (:3439-3443) and runs its main steps as OVERLAP_F_B actions,
one sub-action after the other, their sends after both (:2632-2636, :1493-1505). advisor.parallel.v_replay ports the
lists and replays them, and bubble_time costs both schedules' bubbles so."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, ScheduleZBVZeroBubble, _ComputationType

from advisor import estimate
from advisor.errors import AdvisorError
from advisor.parallel import v_replay as V

KIND = {_ComputationType.FORWARD: V.F, _ComputationType.BACKWARD_INPUT: V.I, _ComputationType.BACKWARD_WEIGHT: V.W,
        _ComputationType.FULL_BACKWARD: V.B}


def _torch_order(cls, pp: int, n: int) -> dict:
    """torch's own pipeline_order, built over stand-in stages of rank 0 (its constructor reads these fields)."""
    stages = [SimpleNamespace(stage_index=s, num_stages=2 * pp, group_size=pp, group_rank=0, submod=torch.nn.Linear(1, 1),
                              is_first=s == 0, is_last=s == 2 * pp - 1) for s in (0, 2 * pp - 1)]
    return cls(stages, n, loss_fn=lambda out, target: out).pipeline_order


def _ours(a) -> tuple:
    """A torch action as the port writes it: (type, stage, micro-batch), an OVERLAP_F_B as its sub-actions'."""
    return tuple((KIND[x.computation_type], x.stage_index, x.microbatch_index) for x in (a.sub_actions or (a,)))


@pytest.mark.parametrize("pp", [2, 3, 4, 5])
def test_port_matches_torchs_action_lists_for_every_count(pp):
    for n in range(1, 2 * pp + 2):  # torch builds every one of them: no count is refused
        order = _torch_order(ScheduleZBVZeroBubble, pp, n)
        for rank in range(pp):
            theirs = tuple(_ours(a)[0] for a in order[rank] if a is not None)
            assert V.rank_actions(pp, n, rank) == theirs, (pp, n, rank)
    for n in range(2 * pp, 4 * pp + 2):
        order = _torch_order(ScheduleDualPipeV, pp, n)
        for rank in range(pp):
            assert V.dualpipev_steps(pp, n, rank) == tuple(_ours(a) for a in order[rank] if a is not None), (pp, n, rank)


def test_replay_by_hand():
    """One micro-batch crosses the 2 pp stages forward and back, then rank 0 runs its last W: with F = I = W = 1 on
    pp = 4, 8 F + 8 I + the W at the V's turn (rank 3 runs 4W0 before 3I0) + the last W = 18, a rank's work 6, so 12
    idle; two fewer per micro-batch added, down to the steady state's 3 = (pp - 1)(F + I - W), where the paper's
    (pp - 1)(F + I - 2W) = 0 is below any schedule's (rank 3 starts 3 F late, with a rank's work to do)."""
    assert float(V.span(4, 1, 1.0, 1.0, 1.0)) == 18.0
    assert float(V.span(4, 8, 1.0, 1.0, 1.0)) == 51.0
    assert [float(V.idle(4, n, 1.0, 1.0, 1.0)) for n in range(1, 11)] == [12, 10, 8, 6, 4, 3, 3, 3, 3, 3]
    # vectorised over rows, each its own F, I, W; a chunk's first forward longer by its weight casts
    assert V.idle(4, 1, np.array([1.0, 2.0]), np.array([1.0, 2.0]), np.array([1.0, 2.0])).tolist() == [12.0, 24.0]
    assert float(V.idle(4, 1, 1.0, 1.0, 1.0, first=0.5)) == 12.0 + 8 * 0.5  # all 8 stages' first forwards in line


@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
def test_the_steady_state_idles_alike_from_2pp_on(pp):
    """bubble_time replays 2 pp micro-batches for any more (pipeline._v_replayed): each schedule's idle is the same for
    every count from 2 pp (ZB-V's from 2 pp - 1) to 4 pp, whatever F, I, W and first casts (random ones: seed 0)."""
    rng = np.random.default_rng(0)
    f, b, w, first = (rng.uniform(0.1, 3.0, 64) for _ in range(4))
    for schedule, lo in ((V.ZBV, 2 * pp - 1), (V.DUALPIPEV, 2 * pp)):
        ref = V.idle(pp, 2 * pp, f, b, w, first, schedule)
        for n in range(lo, 4 * pp + 1):
            assert V.idle(pp, n, f, b, w, first, schedule) == pytest.approx(ref, rel=1e-12, abs=1e-9), (schedule, n)


def test_dualpipev_as_torch_runs_it_idles_twice_zbv():
    """With F = I = W = 1 a chunk, torch's DualPipeV idles 2 (pp - 1): its overlapped F and B run one after the other
    and send only after both, so a forward reaches the next rank a B + W later than ZB-V's, which idles pp - 1; the
    DeepSeek-V3 report's (PP/2 - 1)(F&B + B - 3W) = 0 assumes the pair overlaps (Table 2). F = 1, I = 2, W = 1 (the
    recomputation in I): 4 pp - 5 against ZB-V's 2 (pp - 1)."""
    for pp in (2, 4, 8):
        assert float(V.idle(pp, 4 * pp, 1.0, 1.0, 1.0, schedule=V.DUALPIPEV)) == 2 * (pp - 1)
        assert float(V.idle(pp, 4 * pp, 1.0, 1.0, 1.0)) == pp - 1
        assert float(V.idle(pp, 4 * pp, 1.0, 2.0, 1.0, schedule=V.DUALPIPEV)) == 4 * pp - 5
        assert float(V.idle(pp, 4 * pp, 1.0, 2.0, 1.0)) == 2 * (pp - 1)


KW = dict(model="llama3-8b", hw="dgx-h100", gpus=8, pp=4, dp=2, micro_batch=1, seq=8192, stack="torchtitan")


def test_estimate_costs_trimmed_zbv_between_its_steady_state_and_gpipe():
    """Llama 3 8B on pp = 4 (torchtitan): ZB-V's bubble grows as the micro-batches fall below 2 pp - 1 = 7, and a single
    micro-batch, which ZB-V runs with its W passes off the critical path, idles less than GPipe's."""
    steady = estimate(**KW, grad_accum=8, schedule="zb-v").breakdown["pipeline_bubble"]
    four = estimate(**KW, grad_accum=4, schedule="zb-v").breakdown["pipeline_bubble"]
    one = estimate(**KW, grad_accum=1, schedule="zb-v").breakdown["pipeline_bubble"]
    gpipe = estimate(**KW, grad_accum=1, schedule="gpipe").breakdown["pipeline_bubble"]
    assert steady < four < one < gpipe
    assert estimate(**KW, grad_accum=7, schedule="zb-v").breakdown["pipeline_bubble"] == pytest.approx(steady, rel=1e-12)
    assert estimate(**KW, grad_accum=64, schedule="zb-v").breakdown["pipeline_bubble"] == pytest.approx(steady, rel=1e-12)


def test_dualpipev_keeps_torchs_refusal():
    """torch 2.13's ScheduleDualPipeV raises below 2 x pp micro-batches (pipelining/schedules.py:3439-3443): said once,
    in torchtitan's words with the figures and the fix, not also as the general rule (two reasons for one refusal)."""
    with pytest.raises(AdvisorError) as exc:
        estimate(**KW, grad_accum=4, schedule="dualpipev")
    assert str(exc.value) == ("invalid plan: torchtitan's dualpipev schedule runs 4 micro-batches a step on 8 pipeline "
                              "stages (pp=4), where torch.distributed.pipelining needs at least 8: set --grad-accum 8 or "
                              "more (--global-batch 16), or lower --pp")
