"""validation/validate_multinode.py: why the multi-node points from 64 MiB miss (issue 19).

Two sweeps of one system that disagree by more than the goal's 15% cannot both be met by one model; a sweep whose
busbw falls as its size doubles changed NCCL algorithm, protocol or channels. Both are read from the measurements
(validation/data/multinode_collectives.yaml), so the model's own misses are what is left.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `validation` is not an installed package; run from a checkout
    sys.path.insert(0, str(ROOT))

from advisor.units import MiB  # noqa: E402
from validation import datasets as ds  # noqa: E402
from validation import validate_multinode as vm  # noqa: E402


@pytest.fixture(scope="module")
def entries():
    return {e["id"]: e for e in ds.load_multinode_collectives()}


def test_the_eks_all_reduce_is_two_times_the_same_systems_newer_sweep(entries):
    """awsome-distributed-training's README: the EKS excerpt (NCCL 2.18.5) takes 995.8 us at 64 MiB and 1950 us at
    128 MiB where the 16 GiB block takes 600.9 and 869.5 (busbw 126.3 / 129.0 vs 209.2 / 289.2 GB/s): 1.66x and
    2.24x, beyond the 1.35x within which one prediction can be 15% from both. They meet at 2 GiB (437.8 vs 443.7)."""
    got = vm.apart(entries)["aws_p5_2node_all_reduce_eks"]
    assert sorted(s / MiB for s in got) == [64, 128, 256, 512, 1024]
    assert got[64 * MiB] == pytest.approx(209.2 / 126.3, rel=0.01) and got[128 * MiB] == pytest.approx(289.2 / 129.0, rel=0.01)
    assert min(got.values()) > vm.APART == pytest.approx(1.15 / 0.85)


def test_the_reference_sweeps_agree_with_a_third(entries):
    """crazyguitar's 2-node all-reduce (NCCL 2.27.7) is within 6% of the README's at every size from 64 MiB (825 vs
    870 us at 128 MiB, 1381 vs 1468 at 256): the README is the reference the EKS excerpt is held against."""
    assert "aws_p5_efa_all_reduce_2node_crazyguitar" not in vm.apart(entries)
    assert vm._agree(entries, "aws_p5_efa_all_reduce_2node_crazyguitar", "aws_p5_2node_all_reduce_readme") < 6.5


def test_dstacks_a3_high_all_gather_is_bounded_past_the_pinned_reference(entries):
    """cluster-toolkit's A3 High all-gather pins NCCL_ALGO=Ring, NCCL_PROTO=Simple and 8 channels and reaches 70.9 GB/s
    busbw at 512 MiB, its largest size; dstack's plateaus at ~50 from 128 MiB to 8 GiB. Past 512 MiB the reference
    takes at most its last busbw's time: dstack's is >= 1.41x it there (70.9 / 50.2 at 8 GiB)."""
    got = vm.apart(entries)["dstack_a3high_2node_all_gather"]
    assert vm._pinned(entries["gcp_a3high_all_gather_2node_clustertoolkit_tcpx"])
    assert not vm._pinned(entries["dstack_a3high_2node_all_gather"])
    assert sorted(s / MiB for s in got) == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert got[8192 * MiB] == pytest.approx(70.87 / 50.17, rel=0.01) and got[128 * MiB] < vm.APART < got[256 * MiB]


def test_dips_are_the_p5_all_gathers_at_16_MiB_a_rank(entries):
    """crazyguitar's p5 all-gathers lose busbw where each rank's share reaches 16 MiB, on 2, 4 and 8 nodes alike
    (234.5 -> 215.6 GB/s at 256 MiB on 16 GPUs, 253.4 -> 220.6 at 512 MiB on 32, 261.3 -> 224.5 at 1 GiB on 64),
    and the A4X all-gather at 64 MiB (391.1 -> 328.6); the all-reduces of the same runs do not."""
    got = vm.dips(entries)
    assert {k: sorted(s / MiB for s in v) for k, v in got.items()} == {
        "aws_p5_efa_all_gather_2node_crazyguitar": [256], "aws_p5_efa_all_gather_4node_crazyguitar": [512],
        "aws_p5_efa_all_gather_8node_crazyguitar": [1024], "gcp_a4x_gb200_mnnvl_all_gather": [64]}
    assert got["aws_p5_efa_all_gather_8node_crazyguitar"][1024 * MiB] == pytest.approx(224.5 / 261.3, rel=0.01)


def test_every_miss_has_one_cause():
    """The misses from 64 MiB are counted once each, under 'apart', 'dip' or 'model' (time and ratio alike)."""
    d = vm.validate_multinode()
    e = d.extra
    assert sum(e[f"misses_from_64MiB_{c}"] for c in ("apart", "dip", "model")) == e["points_from_64MiB"] - e["within_15pct_from_64MiB"]
    assert sum(e[f"ag_ar_ratio_misses_{c}"] for c in ("apart", "dip", "model")) == e["ag_ar_ratio_points"] - e["ag_ar_ratio_within_15pct"]
    assert e["misses_from_64MiB_apart"] >= 11  # the EKS excerpt's 5 and dstack's A3 High all-gather's 6, at least
