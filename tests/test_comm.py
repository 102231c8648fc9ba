"""Communication model: nccl-tests bus factors, monotonicity, topology."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from advisor.comm import Collective, bus_factor, collective_time, link_time
from advisor.hardware import load_hardware

A100 = load_hardware("dgx-a100")


def test_bus_factors_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n.
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 8) == pytest.approx(1.0)


@given(n=st.integers(2, 1024), size=st.floats(1e3, 1e10))
def test_allreduce_bandwidth_term_is_rs_plus_ag(n, size):
    assert bus_factor("all_reduce", n) == pytest.approx(bus_factor("reduce_scatter", n) + bus_factor("all_gather", n))


@given(n=st.integers(2, 8), s1=st.floats(1e3, 1e9), s2=st.floats(1e3, 1e9))
def test_time_grows_with_bytes(n, s1, s2):
    lo, hi = sorted((s1, s2))
    assert link_time("all_reduce", n, hi, A100.intra_node) >= link_time("all_reduce", n, lo, A100.intra_node) - 1e-12


def test_single_rank_or_zero_bytes_cost_nothing():
    assert collective_time("all_reduce", 1, 1e9, A100, 1) == 0.0
    assert collective_time("all_reduce", 8, 0, A100, 8) == 0.0


def test_across_nodes_slower_than_inside():
    inside = collective_time("all_reduce", 8, 1e9, A100, 8)
    across = collective_time("all_reduce", 16, 1e9, A100, 8)
    one_per_node = collective_time("all_reduce", 16, 1e9, A100, 1)
    assert inside < across < one_per_node


def test_more_bandwidth_never_slower():
    fast = A100.model_copy(update={"intra_node": A100.intra_node.model_copy(update={"bandwidth_GBps": 600.0})})
    for size in (1e6, 1e8, 1e9):
        assert collective_time("all_reduce", 8, size, fast, 8) <= collective_time("all_reduce", 8, size, A100, 8)


def test_pcie_slower_than_nvlink():
    nv, pcie = load_hardware("titan-rtx-nvlink"), load_hardware("titan-rtx-pcie")
    assert collective_time("all_reduce", 2, 5e8, pcie, 2) > 3 * collective_time("all_reduce", 2, 5e8, nv, 2)
