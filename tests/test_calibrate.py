"""advisor.calibrate: readers, link and compute fits on the shipped reference measurements, profile IO."""

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from advisor import calibrate as cal
from advisor.calibrate import compute as calc
from advisor.comm import bus_factor, link_time
from advisor.errors import AdvisorError
from advisor.hardware import PROFILE_DIR, CommFit, load_hardware
from advisor.units import MiB

REF = Path("/work/shared/reference")
A100 = REF / "a100-nccl"
H100 = REF / "h100"
needs_ref = pytest.mark.skipif(not A100.is_dir(), reason="shared reference measurements not mounted")


def test_parse_sizes():
    assert cal.parse_sizes("1K:1M") == [2**k for k in range(10, 21)]
    assert cal.parse_sizes("4M") == [4 * 2**20]
    assert cal.parse_sizes("1K,64KiB,1MB") == [1024, 65536, 2**20]
    for bad in ("1M:1K", "abc", "0:4K"):
        with pytest.raises(AdvisorError):
            cal.parse_sizes(bad)


@needs_ref
def test_nccl_tests_csv_read_with_the_models_bus_factor():
    rows = cal.read_results(A100 / "all_reduce_8gpu.csv")
    assert len(rows) == 1024 and rows[0]["size_bytes"] == 2**20 and rows[0]["n_ranks"] == 8
    # nccl-tests' own busbw column equals our bus factor x size / time (2 decimals printed: 1%)
    raw = np.loadtxt(A100 / "all_reduce_8gpu.csv", delimiter=",", skiprows=1, usecols=(0, 3, 4))
    ours = bus_factor("all_reduce", 8) * raw[:, 0] / (raw[:, 1] * 1e-9) / 1e9
    assert ours == pytest.approx(raw[:, 2], rel=0.01)


@needs_ref
def test_shipped_dgx_a100_fit_reproduces_nccl_tests():
    """The dgx-a100 intra_node.fit came from `advisor calibrate --from reference/a100-nccl`."""
    hw = load_hardware("dgx-a100")
    n, S, t, failed = cal.collective_points(cal.read_results(A100), "intra", "all_reduce")
    assert not failed and set(n) == set(range(2, 9))
    rel = np.abs(link_time("all_reduce", n, S, hw.intra_node) / t - 1)
    big = S >= 4 * MiB
    # The 10% goal (issues #3, #4) at every size from 4 MiB for every ring size, from the fitted formula
    # (LL128 / Simple with 3 MiB-per-rank loops); the 7/8-GPU dips at exactly one loop (21/24 MiB) are what a
    # time that never decreases with size (test_comm) cannot follow closer: 9.9% is the worst point.
    assert rel[big].max() <= 0.10
    assert rel[big].mean() < 0.0115  # 1.11%: the one-protocol fit it replaced had 1.09% at a 12.2% worst point
    assert hw.intra_node.fit.loop_MiB_per_rank == 3.0  # the sawtooth's period: 3n MiB on n GPUs


@needs_ref
@pytest.mark.slow  # ~60 s: the full sweep, 7,168 points, through every start and the minimax polish
def test_refit_of_the_shipped_sweep_from_a_plain_start_meets_the_goal():
    """Issues #3/#4: `advisor calibrate --from reference/a100-nccl` gives a profile within 10% at every size
    from 4 MiB. The fit starts from a base that knows nothing of the A100 (one latency, one efficiency),
    so the shipped numbers are what the fitter finds, not what it was given."""
    hw = load_hardware("dgx-a100")
    n, S, t, _ = cal.collective_points(cal.read_results(A100), "intra", "all_reduce")
    plain = hw.intra_node.model_copy(update={"fit": CommFit(latency_us=20.0, bandwidth_efficiency=0.8)})
    fit, _ = cal.fit_link(plain, "all_reduce", n, S, t, judge_from_bytes=4 * MiB)
    rel = np.abs(link_time("all_reduce", n, S, hw.intra_node.model_copy(update={"fit": fit})) / t - 1)[S >= 4 * MiB]
    assert rel.max() <= 0.10 and rel.mean() < 0.0115
    for k, v in fit.model_dump().items():  # the shipped profile holds this fit (rounded to 6 decimals)
        assert getattr(hw.intra_node.fit, k) == (v if v is None or isinstance(v, str) else pytest.approx(v, rel=1e-3, abs=1e-4)), k


def test_fit_recovers_a_known_link():
    """Times made by link_time itself are reproduced by the fit (to 1%) from a plain start."""
    base = load_hardware("dgx-a100").intra_node
    truth = base.model_copy(update={"fit": CommFit(latency_us=12.0, latency_per_hop_us=2.0, bandwidth_efficiency=0.8,
                                                   group_penalty=0.3, half_size_MiB=2.0, half_size_exponent=0.5)})
    n = np.repeat([2.0, 4.0, 8.0], 14)
    S = np.tile(2.0 ** np.arange(16, 30), 3)
    t = link_time("all_reduce", n, S, truth)
    fit, _ = cal.fit_link(base, "all_reduce", n, S, t, judge_from_bytes=0)
    got = link_time("all_reduce", n, S, base.model_copy(update={"fit": fit}))
    assert np.abs(got / t - 1).max() < 0.01


@pytest.mark.slow  # ~4-8 s: a 300-point fit with the minimax polish
def test_fit_recovers_nccl_protocols():
    """LL128's rate and Simple's pipeline fill and loop, made by link_time, are recovered by the fit: each
    protocol wins over a range of the sweep, and the loop's sawtooth has the period the grid proposes."""
    base = load_hardware("dgx-a100").intra_node
    truth_fit = CommFit(latency_us=20.0, latency_per_hop_us=2.0, bandwidth_efficiency=0.85, group_penalty=0.4,
                        half_size_MiB=50.0, half_size_exponent=0.1, loop_MiB_per_rank=3.0, loop_quantization=0.25,
                        simple_fill_MiB_per_rank=1.0, ll128_bandwidth_ratio=0.7)
    truth = base.model_copy(update={"fit": truth_fit})
    sizes = np.r_[np.arange(1, 97), 128, 256, 512, 1024] * MiB  # an nccl-tests sweep, thinned out above 96 MiB
    n = np.repeat([2.0, 4.0, 8.0], len(sizes))
    S = np.tile(sizes, 3)
    t = link_time("all_reduce", n, S, truth)
    fit, stats = cal.fit_link(base, "all_reduce", n, S, t, judge_from_bytes=4 * MiB)
    assert stats["loop_MiB_per_rank"] == 3.0
    got = link_time("all_reduce", n, S, base.model_copy(update={"fit": fit}))
    assert np.abs(got / t - 1).max() < 0.01
    # both protocols are identified, not only the times they make together
    assert fit.ll128_bandwidth_ratio == pytest.approx(0.7, rel=0.05)
    assert fit.simple_fill_MiB_per_rank == pytest.approx(1.0, rel=0.15)
    assert fit.loop_quantization == pytest.approx(0.25, rel=0.15)


def test_fit_with_one_group_size_fixes_the_per_hop_terms():
    base = load_hardware("dgx-a100").intra_node
    S = 2.0 ** np.arange(10, 24)
    n = np.full_like(S, 2.0)
    t = 30e-6 + S / 50e9
    fit, _ = cal.fit_link(base, "all_reduce", n, S, t)
    assert fit.latency_per_hop_us == base.fit.latency_per_hop_us  # not identifiable from one n: kept
    assert np.abs(link_time("all_reduce", n, S, base.model_copy(update={"fit": fit})) / t - 1).max() < 0.02


@needs_ref
def test_h100_kernels_and_optimizer_fit_match_the_shipped_efficiencies():
    hw = load_hardware("dgx-h100")
    rows = cal.read_results(H100 / "kernels.jsonl") + cal.read_results(H100 / "optim.jsonl")
    eff, lines = calc.fit_efficiency(rows, hw)
    assert eff.memory_bandwidth == pytest.approx(2906.7 / 3350, abs=0.002)  # best copy / datasheet
    assert eff.optimizer_bandwidth["adamw"] == pytest.approx(0.27, abs=0.02)  # 28 B/param, median over sizes
    assert eff.optimizer_bandwidth["adamw-fused"] == pytest.approx(0.726, abs=0.03)
    # 41 bf16 shapes; the 4 at the ~35 us floor (1024^3, 1024x768x2304 ...) time the host and are left out
    assert any(line.startswith("matmul bf16: 37 points") and "4 host-bound points" in line for line in lines)
    # the profile ships exactly what the fit gives (max, half_dim, fixed time per kernel; fused attention)
    assert eff.matmul_max["bf16"] == pytest.approx(hw.efficiency.matmul_max["bf16"], abs=0.001)
    assert eff.matmul_half_dim["bf16"] == pytest.approx(hw.efficiency.matmul_half_dim["bf16"], abs=1.0)
    assert eff.matmul_fixed_us["bf16"] == pytest.approx(hw.efficiency.matmul_fixed_us["bf16"], abs=0.1)
    assert eff.attention_max == pytest.approx(hw.efficiency.attention_max, abs=0.001)
    assert eff.attention_half_sd == pytest.approx(hw.efficiency.attention_half_sd, rel=0.001)
    # the fitted GEMM model reproduces every GPU-bound bf16 shape within 15% (the fit's report: 13.1%),
    # through the same gemm_time the estimates use
    from advisor.compute import gemm_time

    fitted = hw.model_copy(update={"efficiency": eff})
    for r in rows:
        if r["kind"] == "matmul" and r["math"] == "bf16" and r["time_s"] > calc.HOST_FLOOR_FACTOR * 34.6e-6:
            pred = gemm_time(fitted, "bf16", 2.0 * r["m"] * r["n"] * r["k"], r["n"], r["k"])
            assert float(pred) == pytest.approx(r["time_s"], rel=0.15), r


def test_matmul_fit_recovers_a_known_fixed_time_and_skips_the_host_floor():
    hw = load_hardware("dgx-h100")
    peak = hw.gpu.peak_flops_per_s("bf16")
    rows = []
    for m, k, n in [(4096, 768, 2304), (16384, 768, 3072), (4096, 4096, 4096), (8192, 8192, 8192),
                    (16384, 1600, 6400), (1024, 8192, 32768), (4096, 1024, 1024)]:
        gpu = 2.0 * m * k * n / (peak * 0.7 * n / (n + 90.0) * k / (k + 90.0)) + 20e-6
        rows.append({"kind": "matmul", "math": "bf16", "m": m, "k": k, "n": n, "time_s": gpu, "status": "ok"})
    rows += [{"kind": "matmul", "math": "bf16", "m": 256, "k": 256, "n": 256, "time_s": 15e-6, "status": "ok"}]
    mx, half, fixed, rep = calc.fit_matmul(rows, hw)["bf16"]
    assert (mx, half, fixed) == (pytest.approx(0.7, abs=0.002), pytest.approx(90.0, abs=1.0), pytest.approx(20.0, abs=0.2))
    assert rep.points == 7 and "1 host-bound" in rep.note


def test_results_jsonl_torn_last_line_kept_rest(tmp_path):
    p = tmp_path / "r.jsonl"
    row = '{"kind": "collective", "link": "intra", "collective": "all_reduce", "n_ranks": 2, "size_bytes": 1024, "time_s": 1e-4, "status": "ok"}'
    p.write_text(row + "\n" + row + "\n" + '{"kind": "coll')
    assert len(cal.read_results(p)) == 2
    p.write_text('{"kind": "coll\n' + row + "\n")
    with pytest.raises(AdvisorError, match=":1:"):
        cal.read_results(p)


def test_failed_sizes_are_reported_not_dropped():
    rows = [{"kind": "collective", "link": "intra", "collective": "all_reduce", "n_ranks": 2,
             "size_bytes": 2.0**k, "time_s": 2e-5 + 2.0**k / 40e9, "status": "ok"} for k in range(12, 26)]
    rows.append({"kind": "collective", "link": "intra", "collective": "all_reduce", "n_ranks": 2,
                 "size_bytes": 2.0**30, "status": "failed", "error": "CUDA out of memory"})
    hw, lines = cal.calibrate_profile(rows, load_hardware("dgx-a100"), "t", {"date": "x"})
    text = "\n".join(lines)
    assert "failed sizes 1" in text and "CUDA out of memory" in text
    assert "inter-node link: not measured (one node" in text
    assert hw.inter_node == load_hardware("dgx-a100").inter_node


def test_write_profile_refuses_shipped_and_is_atomic(tmp_path):
    hw = load_hardware("dgx-a100")
    with pytest.raises(AdvisorError, match="shipped"):
        cal.write_profile(hw, PROFILE_DIR / "dgx-a100.yaml")
    out = cal.write_profile(hw.model_copy(update={"name": "mine"}), tmp_path / "mine.yaml", "# header\n")
    assert load_hardware(out).name == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["mine.yaml"]  # no temporary file left behind


def test_nccl_without_gpus_is_one_line_error(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from advisor.cli_calibrate import calibrate

    res = CliRunner().invoke(calibrate, ["--backend", "nccl", "--out", str(tmp_path / "x.yaml")])
    assert isinstance(res.exception, AdvisorError) and "needs CUDA GPUs" in str(res.exception)


def test_missing_torch_is_one_line_error(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    from advisor.cli_calibrate import calibrate

    res = CliRunner().invoke(calibrate, ["--out", str(tmp_path / "x.yaml")])
    assert isinstance(res.exception, AdvisorError) and "pip install 'advisor[calibrate]'" in str(res.exception)


@needs_ref
@pytest.mark.slow  # ~4-10 s: a 96-point fit through the CLI
def test_cli_refit_from_nccl_tests_subset(tmp_path):
    """`--from` a folder of nccl-tests CSVs (every 32nd size, to stay fast) writes a loadable profile."""
    src = tmp_path / "csv"
    src.mkdir()
    for k in (2, 4, 8):
        lines = (A100 / f"all_reduce_{k}gpu.csv").read_text().splitlines()
        (src / f"all_reduce_{k}gpu.csv").write_text("\n".join([lines[0]] + lines[1::32]) + "\n")
    from advisor.cli_calibrate import calibrate

    out = tmp_path / "a100.yaml"
    res = CliRunner().invoke(calibrate, ["--from", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "intra-node all_reduce (n=2,4,8): 96 points" in res.output
    hw = load_hardware(out)
    assert hw.calibration["refit_from"] == str(src)
    n, S, t, _ = cal.collective_points(cal.read_results(src), "intra", "all_reduce")
    rel = np.abs(link_time("all_reduce", n, S, hw.intra_node) / t - 1)
    assert rel[S >= 4 * MiB].max() < 0.12


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_world_rows_fit_the_network_through_the_multi_node_paths(algorithm):
    """All-reduces over every GPU of 2 and 4 nodes, made by comm.collective_time with a known inter-node fit,
    are reproduced (to 2%) by the profile `calibrate_profile` fits from them (the intra link held), and the
    fit names the algorithm NCCL ran across nodes (two node counts tell a ring from a tree)."""
    from advisor.comm import collective_time

    base = load_hardware("dgx-a100")
    truth_link = base.inter_node.model_copy(update={"fit": CommFit(latency_us=30.0, latency_per_hop_us=8.0,
                                                                   bandwidth_efficiency=0.7, half_size_MiB=12.0,
                                                                   half_size_exponent=0.4, algorithm=algorithm)})
    truth = base.model_copy(update={"inter_node": truth_link})
    n = np.repeat([16.0, 32.0], 12)
    S = np.tile(2.0 ** np.arange(20, 32), 2)
    t = collective_time("all_reduce", n, S, truth, 8)
    rows = [{"kind": "collective", "link": "world", "collective": "all_reduce", "n_ranks": int(a), "per_node": 8,
             "size_bytes": int(b), "time_s": float(c), "status": "ok"} for a, b, c in zip(n, S, t)]
    hw, lines = cal.calibrate_profile(rows, base, "t", {"date": "x"})
    assert any("inter-node profile fit from world all_reduce" in ln for ln in lines)
    got = collective_time("all_reduce", n, S, hw, 8)
    assert np.abs(got / t - 1).max() < 0.02
    assert hw.intra_node == base.intra_node and hw.inter_node.fit.algorithm == algorithm


def test_world_row_without_per_node_is_one_line_error(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"kind": "collective", "link": "world", "collective": "all_reduce", "n_ranks": 16, '
                 '"size_bytes": 1048576, "time_s": 0.001}\n')
    with pytest.raises(AdvisorError, match="per_node"):
        cal.read_results(p)


def test_one_gpu_per_node_rows_fit_that_gpus_share_of_the_network():
    """A sweep over one GPU per node measures one GPU's NIC share; the fitted profile must reproduce it when
    advisor.comm gives that GPU 1/gpus_per_node of the node's network, not all of it."""
    base = load_hardware("dgx-a100")
    share = 1.0 / base.gpus_per_node
    truth = base.inter_node.model_copy(update={"fit": CommFit(latency_us=20.0, latency_per_hop_us=5.0,
                                                              bandwidth_efficiency=0.8, half_size_MiB=4.0,
                                                              half_size_exponent=0.5)})
    n = np.repeat([2.0, 4.0], 12)
    S = np.tile(2.0 ** np.arange(20, 32), 2)
    t = link_time("all_reduce", n, S, truth, share)
    rows = [{"kind": "collective", "link": "inter", "collective": "all_reduce", "n_ranks": int(a),
             "size_bytes": int(b), "time_s": float(c), "status": "ok"} for a, b, c in zip(n, S, t)]
    hw, _ = cal.calibrate_profile(rows, base, "t", {"date": "x"})
    got = link_time("all_reduce", n, S, hw.inter_node, share)
    assert np.abs(got / t - 1).max() < 0.02


@needs_ref
@pytest.mark.slow  # ~6-13 s: two fits through the CLI
def test_cli_from_repeated_reads_every_source(tmp_path):
    """`--from` twice (an nccl-tests folder and the H100 optimizer file) fits from both, not the last one only."""
    src = tmp_path / "csv"
    src.mkdir()
    lines = (A100 / "all_reduce_8gpu.csv").read_text().splitlines()
    (src / "all_reduce_8gpu.csv").write_text("\n".join([lines[0]] + lines[1::64]) + "\n")
    optim = H100 / "optim.jsonl"
    from advisor.cli_calibrate import calibrate

    out = tmp_path / "both.yaml"
    res = CliRunner().invoke(calibrate, ["--from", str(src), "--from", str(optim), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "intra-node all_reduce (n=8)" in res.output and "optimizer adamw-fused" in res.output
    assert load_hardware(out).calibration["refit_from"] == f"{src}, {optim}"


def test_low_latency_path_is_fitted_below_one_mib():
    """Times made by link_time with a known low-latency path (14 us, 0.3 of the link) over 8 B .. 512 KiB and a
    bulk fit above are reproduced from the small sizes alone (to 2%), with the bulk fit held."""
    base = load_hardware("dgx-h100").intra_node
    truth = base.model_copy(update={"fit": CommFit(**{**base.fit.model_dump(), "ll_latency_us": 14.0,
                                                         "ll_bandwidth_ratio": 0.3})})
    S = 2.0 ** np.arange(3, 20)
    n = np.full_like(S, 8.0)
    t = link_time("all_reduce", n, S, truth)
    link, rep = cal.fit_low_latency(base, "all_reduce", n, S, t)
    assert rep.max_rel_err < 0.02
    assert link.fit.ll_latency_us == pytest.approx(14.0, rel=0.05)
    assert cal.fit_low_latency(base, "all_reduce", n[-3:], S[-3:], t[-3:]) is None  # fewer than 4 sizes


def test_world_fit_from_one_collective_predicts_the_others():
    """Issue 19: a profile fitted from one collective across nodes predicts the others. All-reduce, all-gather and
    all-to-all over every GPU of 2 and 4 nodes, made by comm.collective_time with a known network: the fit is taken
    from the all-reduce and the report says how it predicts the all-gather (the same NICs) and the all-to-all
    (each GPU's own): within 2%, as they were made by the same network. The sweep measures all four collectives."""
    from advisor.calibrate.microbench import COLLECTIVES as MEASURED, BenchConfig, measurement_plan
    from advisor.comm import collective_time

    assert set(MEASURED) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    assert {c for link, _, c, _ in measurement_plan(BenchConfig(sizes=[1 << 20]), 16, 8) if link == "world"} >= set(MEASURED)
    base = load_hardware("dgx-h100")
    truth = base.model_copy(update={"inter_node": base.inter_node.model_copy(update={"fit": CommFit(
        latency_us=12.0, latency_per_hop_us=10.0, bandwidth_efficiency=0.8, half_size_MiB=6.0, half_size_exponent=0.4)})})
    n = np.repeat([16.0, 32.0], 10)
    S = np.tile(2.0 ** np.arange(22, 32), 2)
    rows = [{"kind": "collective", "link": "world", "collective": coll, "n_ranks": int(a), "per_node": 8,
             "size_bytes": int(b), "time_s": float(c), "status": "ok"}
            for coll in ("all_reduce", "all_gather", "all_to_all")
            for a, b, c in zip(n, S, collective_time(coll, n, S, truth, 8))]
    hw, lines = cal.calibrate_profile(rows, base, "t", {"date": "x"})
    assert any("inter-node profile fit from world all_reduce" in ln for ln in lines)
    for coll in ("all_gather", "all_to_all"):
        line = next(ln for ln in lines if f"world {coll} predicted by the all_reduce fit" in ln)
        assert float(line.split("max error ")[1].split("%")[0]) < 2.0, line


def _overlap(link, n, size, compute, coll, both, sms, per_node=None):
    row = {"kind": "overlap", "link": link, "collective": "all_gather", "n_ranks": n, "size_bytes": size,
           "compute_s": compute, "collective_s": coll, "time_s": both, "sm_count": sms, "status": "ok"}
    return dict(row, per_node=per_node) if per_node else row


def test_overlap_rows_fit_the_sms_nccl_holds():
    """A GEMM loop that outlasts an all-gather started beside it ends later than alone by the collective's time x the
    share of the SMs NCCL's thread blocks held (advisor.comm.beside). On an H100 (132 SMs): a 30 ms loop that takes
    31.2 ms beside a 10 ms all-gather in the node lost 12% of it: 15.8 -> 16 channels (NVLS on sm90, the profile's);
    32.4 ms beside one across nodes: 24% -> 32. A size where the loop ended first says nothing and is left out; the
    fitted profile costs the share through advisor.comm.held_sms. On CPU (no SM count) the share is only reported."""
    from advisor.comm import held_sms

    base = load_hardware("dgx-h100").model_copy(update={"intra_node": load_hardware("dgx-h100").intra_node.model_copy(
        update={"nccl_channels": None})})
    rows = [_overlap("intra", 8, s, 0.030, 0.010, 0.0312, 132) for s in (64 * MiB, 128 * MiB, 256 * MiB)]
    rows += [_overlap("intra", 8, 512 * MiB, 0.010, 0.020, 0.0205, 132),  # the loop ended first: left out
             _overlap("world", 16, 256 * MiB, 0.030, 0.010, 0.0324, 132, per_node=8)]
    hw, lines = cal.calibrate_profile(rows, base, "t", {"date": "x"})
    assert (hw.intra_node.nccl_channels, hw.inter_node.nccl_channels) == (16, 32)
    assert any("intra-node overlap: a GEMM loop ends 12.0% of the all-gather's time later beside it (3 sizes from 64 MiB)"
               ": NCCL holds 16 of 132 SMs (nccl_channels None -> 16)" in ln for ln in lines), lines
    assert float(held_sms(8, 8, hw)) == pytest.approx(16 / 132) and float(held_sms(16, 8, hw)) == pytest.approx(32 / 132)
    assert {"intra_node.nccl_channels", "inter_node.nccl_channels"} <= set(hw.calibration["fitted"])
    cpu = [dict(r, sm_count=None) for r in rows[:3]]
    with pytest.raises(AdvisorError, match="no usable measurements"):  # a share without SMs fits nothing
        cal.calibrate_profile(cpu, base, "t", {"date": "x"})
    _, lines = cal.calibrate_profile(cpu + rows[-1:], base, "t", {"date": "x"})
    assert any("no SMs to count (not a GPU): nccl_channels kept from the base profile" in ln for ln in lines)
    # noise is no count: a loop faster beside the gather than alone (a share below 0), or one that lost more than the
    # gather's whole time (above 1), keeps the base's channels and says so; failed sizes are reported
    for both in (0.0290, 0.0420):
        noisy = [_overlap("intra", 8, 64 * MiB, 0.030, 0.010, both, 132), rows[-1],
                 dict(_overlap("intra", 8, 128 * MiB, 0.030, 0.010, both, 132), status="failed", error="CUDA out of memory")]
        hw, lines = cal.calibrate_profile(noisy, load_hardware("dgx-h100"), "t", {"date": "x"})
        assert hw.intra_node.nccl_channels == 16 and any("(noise): nccl_channels kept" in ln for ln in lines)
        assert any("1 size(s) failed, the first with: CUDA out of memory" in ln for ln in lines)
    # an NVL72 rack: a world group of 8 GPUs on 4-GPU trays stays on the rack's NVLink, not the network
    gb = load_hardware("gb200-nvl72")
    hw, lines = cal.calibrate_profile([_overlap("world", 8, 256 * MiB, 0.030, 0.010, 0.0324, 148, per_node=4),
                                   _overlap("intra", 4, 256 * MiB, 0.030, 0.010, 0.0318, 148)], gb, "t", {"date": "x"})
    assert (hw.intra_node.nccl_channels, hw.inter_node.nccl_channels) == (27, gb.inter_node.nccl_channels)  # 18% of 148
    assert any("1 row(s) of at most 72 GPUs left out: they ran inside one NVLink domain" in ln for ln in lines)


@pytest.mark.parametrize("change, message", [
    ({"sm_count": "132"}, "sm_count='132'"), ({"sm_count": 0}, "sm_count=0"), ({"compute_s": None}, "'compute_s'"),
    ({"collective_s": -1.0}, "collective_s=-1.0"), ({"n_ranks": 1}, "at least 2 ranks"), ({"link": "rack"}, "unknown link"),
    ({"collective": "all_reduce"}, "times an all-gather"), ({"link": "inter"}, "not 'all_gather' over 'inter'"),
    ({"collective_s": 1e-12}, "compute_s and collective_s must be at least")])
def test_overlap_rows_are_checked(tmp_path, change, message):
    import json

    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(dict(_overlap("intra", 8, 64 * MiB, 0.03, 0.01, 0.031, 132), **change)) + "\n")
    with pytest.raises(AdvisorError, match=message.replace("(", r"\(")):
        cal.read_results(p)


def _alpha_beta_rows(path: Path, busbw_GBps: float, latency_us: float = 15.0, n: int = 8) -> Path:
    """An 8-rank all-reduce sweep, 64 KiB to 1 GiB, timed t = latency + 2(n-1)/n S / busbw (nccl-tests' bus factor)."""
    import json

    rows = [{"kind": "collective", "link": "intra", "collective": "all_reduce", "n_ranks": n, "size_bytes": 2.0 ** e,
             "time_s": latency_us * 1e-6 + 2 * (n - 1) / n * 2.0 ** e / (busbw_GBps * 1e9), "status": "ok"}
            for e in range(16, 31)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("busbw_GBps, refused", [(2000.0, True), (450.0, False)])
def test_busbw_beyond_twice_the_base_link_is_refused(tmp_path, busbw_GBps, refused):
    """dgx-a100's NVLink is 300 GB/s: an in-switch reduction (NVLS) may beat it (450 GB/s: the link is widened), but
    never by 2x (each byte crosses the link once instead of 2(n-1)/n times): 2,000 GB/s is a unit slip or another
    system's sweep, refused in one line, where it was written as a 2 TB/s NVLink."""
    from advisor.cli_calibrate import calibrate

    src, out = _alpha_beta_rows(tmp_path / "r.jsonl", busbw_GBps), tmp_path / "p.yaml"
    res = CliRunner().invoke(calibrate, ["--from", str(src), "--out", str(out), "--base", "dgx-a100"])
    if refused:
        assert isinstance(res.exception, AdvisorError) and not out.exists()
        assert "measured busbw 1968.6 GB/s is more than 2x the base profile's 300.0 GB/s link" in str(res.exception)
        assert len(str(res.exception).splitlines()) == 1
    else:
        assert res.exit_code == 0, res.output
        assert "link bandwidth set to" in res.output
        assert load_hardware(out).intra_node.bandwidth_GBps > 300.0


def test_written_link_is_judged_with_its_low_latency_path(tmp_path):
    """A sweep the alpha-beta model makes (15 us + bytes at 240 GB/s busbw) is reproduced by the written profile at
    every size; the main path's line alone reads 108% off at 4 MiB, so the report adds the profile as written."""
    from advisor.cli_calibrate import calibrate

    src, out = _alpha_beta_rows(tmp_path / "r.jsonl", 240.0), tmp_path / "p.yaml"
    res = CliRunner().invoke(calibrate, ["--from", str(src), "--out", str(out), "--base", "dgx-a100"])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if "as written" in x]
    assert "max error 0.0%" in line and "max over all sizes 0.0%" in line
    n, S, t, _ = cal.collective_points(cal.read_results(src), "intra", "all_reduce")
    assert np.abs(link_time("all_reduce", n, S, load_hardware(out).intra_node) / t - 1).max() < 0.005


def test_world_rows_alone_are_not_called_one_node(tmp_path):
    """A sweep of world rows only (16 ranks, 8 a node) measured two nodes: the inter-node line says the world rows are
    fitted, where it said 'one node: only intra-node links measured'."""
    import json

    src = _alpha_beta_rows(tmp_path / "r.jsonl", 20.0, latency_us=30.0, n=16)
    src.write_text("".join(json.dumps(dict(json.loads(x), link="world", per_node=8)) + "\n"
                           for x in src.read_text().splitlines()))
    _, lines = cal.calibrate_profile(cal.read_results(src), load_hardware("dgx-a100"), "w", {})
    (line,) = [x for x in lines if x.startswith("inter-node link: not measured")]
    assert "the world rows are fitted below" in line and "one node" not in line
    assert any(x.startswith("inter-node profile fit from world all_reduce") for x in lines)
