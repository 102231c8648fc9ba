"""Expert parallelism across context-parallel ranks, as megatron-core 0.19.2 lays it (advisor/parallel/expert_layout.py):
the expert grid etp x ep x edp x pp is a second decomposition of the same ranks (parallel_state.py:859-896), so EP is
carved from a stage's dp x cp x tp ranks and an EP group may hold CP peers, each dispatching its own tokens."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from advisor import estimate, plan
from advisor.candidates import Candidates, Mesh, members_per_node
from advisor.errors import AdvisorError
from advisor.layout import Plan
from advisor.training import TrainingSetup

# DeepSeek-V2-Lite: 64 experts of width 1408, top-6, d_model 2048; 8 H100s of one node, seq 8192, ZeRO-1
LITE = dict(model="deepseek-v2-lite", hw="dgx-h100", gpus=8, zero=1, global_batch=64, seq=8192, stack="megatron-core")
STATES = ("weights", "gradients", "optimizer_states")


def test_ep_across_cp_ranks_is_costed_with_the_expert_grid_megatron_core_builds():
    # cp 2, dp 4, tp 1, ep 8: refused before (ep 8 does not divide dp x tp = 4); megatron-core runs it, world 8 %
    # (etp x ep x pp) == 0 (parallel_state.py:874-884), edp = 8 / 8 = 1
    across = estimate(**LITE, cp=2, ep=8)
    assert (across.plan.dp, across.plan.cp, across.plan.ep) == (4, 2, 8) and across.fits
    # the expert grid does not see cp (cp=1 there, :887-896): the model states are those of dp 8 at the same ep,
    # expert states sharded over edp = 1, the dense ones over dp x cp = 8 (distributed_data_parallel.py:218-224)
    flat = estimate(**LITE, cp=1, ep=8)
    assert {k: across.memory.parts[k] for k in STATES} == {k: flat.memory.parts[k] for k in STATES}
    assert across.breakdown["comm/dp_grad"] == pytest.approx(flat.breakdown["comm/dp_grad"], rel=1e-12)
    # the all-to-all carries a rank's own tokens (token_dispatcher.py:698-699): 8192 / cp x top-6 x 2048 x 2 bytes,
    # 96 MiB at cp 2, over the 8 ranks of the node (etp 1: the EP ranks consecutive)
    assert across.collectives["ep"].startswith("all-to-all of 96.00 MiB over 8 GPUs (one node)")
    assert flat.collectives["ep"].startswith("all-to-all of 192.00 MiB over 8 GPUs (one node)")
    # the step's all-to-all bytes are the same (16 micro-batches of half the tokens): the time within latency
    assert across.breakdown["comm/ep_alltoall"] == pytest.approx(flat.breakdown["comm/ep_alltoall"], rel=0.05)
    # ep 4 at cp 2 (EP inside dp x tp, edp 2) holds each expert on twice the ranks: 27 layers costed as routed
    # (expert.py docstring) x 64 experts x 3 x 2048 x 1408 x 2 bytes x (1/4 - 1/8) more weights
    half = estimate(**LITE, cp=2, ep=4)
    assert half.memory.parts["weights"] - across.memory.parts["weights"] == pytest.approx(
        27 * 64 * 3 * 2048 * 1408 * 2 / 8, rel=1e-9)


def test_ep_beyond_a_stage_and_stacks_that_carve_ep_from_dp_x_tp_are_refused_in_one_line():
    with pytest.raises(AdvisorError) as err:
        estimate(**LITE, cp=2, ep=16)
    words = str(err.value)
    assert "ep x etp does not divide dp x cp x tp" in words and "dp x cp x tp = 8" in words and "\n" not in words
    # DeepSpeed-MoE's groups come from the data-parallel ranks (deepspeed 0.9.5 utils/groups.py:225-229)
    with pytest.raises(AdvisorError) as err:
        estimate(**{**LITE, "stack": "megatron-deepspeed"}, cp=2, ep=8)
    words = str(err.value)
    assert "megatron-deepspeed carves EP from the data- and tensor-parallel ranks, not the context-parallel ones" in words
    assert "dp x tp = 4" in words and "\n" not in words


def test_torchtitan_carves_ep_from_its_fsdp_cp_and_tp_ranks_too():
    # torchtitan 0.3.0 distributed/parallel_dims.py:277-279, :336-339: efsdp = dp_shard x cp x tp / ep = 4 x 2 / 8 = 1,
    # ep innermost in its sparse mesh; advisor refused it with megatron-core's reason before
    e = estimate(**{**LITE, "stack": "torchtitan", "zero": 3}, cp=2, ep=8, etp=1)
    assert (e.plan.cp, e.plan.ep) == (2, 8)
    assert e.collectives["ep"].startswith("all-to-all of 96.00 MiB over 8 GPUs (one node)")


def test_the_search_tries_ep_across_cp_ranks():
    found = plan("deepseek-v2-lite", "dgx-h100", gpus=8, cp=2, seq=8192, global_batch=64, stack="megatron-core", top=5)
    assert any(p.plan.ep > p.plan.dp * p.plan.tp for p in found.plans)


# (world, tp, cp, pp, ep, etp): EP inside a node beside CP, with TP and etp, over a pipeline, and across nodes
LAYOUTS = [(8, 1, 2, 1, 8, 1), (8, 1, 4, 1, 4, 1), (16, 2, 2, 1, 8, 1), (16, 2, 4, 1, 4, 2), (16, 1, 2, 2, 8, 1),
           (32, 1, 2, 1, 16, 1)]
GPUS_PER_NODE = 8

_RANKS = '''
import json, sys, typing
typing.override = getattr(typing, "override", lambda f: f)  # 3.12's no-op decorator, for Python 3.11
from megatron.core.parallel_state import RankGenerator
out = []
for world, tp, cp, pp, ep, etp in json.load(sys.stdin):
    dense = RankGenerator(tp=tp, ep=1, dp=world // (tp * cp * pp), pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    experts = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    out.append({"cp": dense.get_ranks("cp"), "pp": dense.get_ranks("pp"), "ep": experts.get_ranks("ep"),
                "edp": experts.get_ranks("dp"), "tp_ep": experts.get_ranks("tp-ep"), "pp_experts": experts.get_ranks("pp")})
print(json.dumps(out))
'''


def _one(x) -> float:
    return float(np.asarray(x, dtype=float).reshape(-1)[0])


def _per_node(group: list[int]) -> int:
    """Members of a group on the node of its first rank."""
    return sum(r // GPUS_PER_NODE == group[0] // GPUS_PER_NODE for r in group)


@pytest.mark.slow  # ~15 s: imports megatron-core 0.19.2's parallel_state in a subprocess
def test_expert_groups_are_megatron_cores_rank_generator_groups():
    """advisor's expert mesh (Mesh.of: ep, edp and their ranks per node, which place the all-to-all and the expert
    gradient reduction on NVLink or the network) against the groups megatron-core 0.19.2's own RankGenerator builds
    for the dense and the expert grid (parallel_state.py:859-896, the default order "tp-cp-ep-dp-pp")."""
    root = os.environ.get("ADVISOR_MEGATRON_LM") or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                                 ".megatron-lm")
    if not os.path.isfile(os.path.join(root, "megatron", "core", "parallel_state.py")):
        pytest.skip("set ADVISOR_MEGATRON_LM to megatron-core 0.19.2's tree (tests/test_export_stacks.py docstring)")
    run = subprocess.run([sys.executable, "-c", _RANKS], input=json.dumps(LAYOUTS), capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])},
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    groups = json.loads(run.stdout.strip().splitlines()[-1])
    for (world, tp, cp, pp, ep, etp), g in zip(LAYOUTS, groups):
        dp = world // (tp * cp * pp)
        p = Plan(dp=dp, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, sp=tp > 1, zero=1)
        mesh = Mesh.of(Candidates.of_plan(p, TrainingSetup(seq_len=8192, global_batch=dp * 8), 8), GPUS_PER_NODE)
        assert g["pp"] == g["pp_experts"]  # megatron-core asserts it (:904-907): the stages hold the same ranks
        assert (_one(mesh.ep), _one(mesh.edp)) == (len(g["ep"][0]), len(g["edp"][0])), (world, tp, cp, pp, ep, etp)
        assert _one(mesh.edp) == dp * cp * tp / (ep * etp)
        assert _one(mesh.ep_per_node) == _per_node(g["ep"][0])
        edp_per_node, stride = _one(members_per_node(GPUS_PER_NODE, mesh.ep * mesh.etp, mesh.edp)), ep * etp  # expert.py _edp
        if stride < GPUS_PER_NODE:
            assert edp_per_node == _per_node(g["edp"][0])
        else:  # one rank a node, every stride / g nodes: advisor's share below 1 (candidates.members_per_node)
            assert edp_per_node == GPUS_PER_NODE / stride and _per_node(g["edp"][0]) == 1
            assert {b - a for a, b in zip(g["edp"][0], g["edp"][0][1:])} <= {stride}  # (edp 1: no second rank)
        if (ep * etp) % (tp * cp) == 0:  # the EP x ETP ranks take in whole CP groups: CP peers exchange tokens
            assert all(any(set(c) <= set(e) for e in g["tp_ep"]) for c in g["cp"]), (world, tp, cp, pp, ep, etp)
