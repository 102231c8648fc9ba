"""The GPU's own time per GEMM kernel (efficiency.matmul_kernel_floor_us), fitted to NVIDIA aiconfigurator 0.4.0's
GPU-timed thin GEMMs (validation/data/aiconfigurator_gemm_small.csv: fp16 torch_flow, m 1..768), and what it costs:
each further kernel of Transformer Engine's multi-stream grouped GEMM on the busiest stream (advisor.parallel.expert
fixed_times), where the per-call fit of reference/h100/kernels.jsonl (matmul_fixed_us, 23.7 us) holds the host's gap.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from advisor.calibrate import compute as calc
from advisor.compute import linear_pass_times
from advisor.hardware import load_hardware
from advisor.model import load_model
from advisor.parallel import expert
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload
from validation import datasets as ds
from validation.validate_kernels import kernel_floor

# aiconfigurator_gemm_small.csv rows (seconds): (gpu, m, n, k) -> time_s, the wheel's gemm_perf.txt latency / 1000
ROWS = {("h100", 1, 128, 128): 2.863999952872594e-06, ("h100", 32, 1024, 1024): 4.07253329952558e-06,
        ("h200", 1, 128, 128): 2.7744000156720476e-06, ("b200", 1, 128, 128): 3.050666550795237e-06,
        ("a100", 1, 128, 128): 2.628266563018163e-06, ("h100", 512, 4096, 4096): 2.427306572596232e-05}


def test_the_table_times_tiny_gemms_at_a_few_microseconds_on_every_gpu():
    """A 1 x 128 x 128 GEMM takes 2.6-3.1 us on every GPU, a 32 x 1024 x 1024 one 4.1 us on the H100: the GPU alone,
    below the 4 us the profiles' kernel_launch_us gives the host to issue one kernel, and 6-9x below the 23.7 us per
    call the H100 per-call sweep's fit carries."""
    got = {(r.gpu, r.m, r.n, r.k): r.time_s for r in ds.load_aiconfigurator_gemm_small()}
    assert len(got) == 4 * 17 * 8 * 8  # 17 m values below 1024, n and k the powers of two 128..16384
    for key, t in ROWS.items():
        assert got[key] == t, key
    fixed = load_hardware("dgx-h100").efficiency.matmul_fixed_us["bf16"]
    for gpu in ("a100", "h100", "b200", "h200"):
        fastest = min(t for (g, *_), t in got.items() if g == gpu)
        assert 2.4e-6 < fastest < 3.0e-6 and fastest * 1e6 < fixed / 8, gpu


@pytest.mark.parametrize("gpu, floor, profiles", [
    ("a100", 4.4, ("dgx-a100", "aws-p4d", "aws-p4de")),
    ("h100", 3.7, ("dgx-h100", "aws-p5", "gcp-a3-mega")),
    ("b200", 4.1, ("aws-p6-b200", "dgx-b200", "gb200-nvl72")),
    ("h200", 3.4, ("dgx-h200", "aws-p5e", "gcp-a3-ultra")),
])
def test_profiles_ship_the_floor_fitted_to_the_table(gpu, floor, profiles):
    """`python -m validation.validate_kernels`' kernel_floor (advisor.calibrate.compute fit_kernel_floor over 1,088 rows
    a GPU, with the profile's shape terms and M / (M + h0)): one number within 27% of the rows on average, a third
    of the way between the fastest row and 2x it, which every profile of that GPU ships for bf16 and fp16."""
    fitted, rep = kernel_floor(gpu)
    assert fitted == floor and rep.points == 1088 and rep.mean_rel_err < 0.27 and rep.r2 > 0.85
    for prof in profiles:
        eff = load_hardware(prof).efficiency
        assert (eff.matmul_kernel_floor_us["bf16"], eff.matmul_kernel_floor_us["fp16"]) == (floor, floor), prof
        assert eff.matmul_fixed_us["bf16"] == 23.7  # the dense GEMMs' per-call fit is left as it is


def test_a_profile_without_a_floor_falls_back_to_the_fixed_time():
    eff = load_hardware("titan-rtx-nvlink").efficiency
    assert eff.matmul_kernel_floor_us == {} and eff.kernel_floor_us("fp16") == eff.matmul_fixed_us["fp16"] == 23.7


def test_calibrate_from_fits_the_floor_from_gpu_timed_rows_only(tmp_path):
    """Rows marked "timing": "cuda_graph" fit matmul_kernel_floor_us and stay out of the per-call matmul fit: a file
    of the H100's thin rows alone refits the floor, 3.7 us, and keeps the base's matmul_max, half dim and fixed time."""
    rows = [{"kind": "matmul", "m": r.m, "n": r.n, "k": r.k, "math": "fp16", "time_s": r.time_s, "timing": "cuda_graph"}
            for r in ds.load_aiconfigurator_gemm_small() if r.gpu == "h100"]
    src = tmp_path / "thin.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    from advisor.cli_calibrate import calibrate

    out = tmp_path / "floor.yaml"
    res = CliRunner().invoke(calibrate, ["--from", str(src), "--base", "dgx-h100", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "matmul kernel floor fp16: 1088 points" in res.output
    got, base = load_hardware(out).efficiency, load_hardware("dgx-h100").efficiency
    assert got.matmul_kernel_floor_us["fp16"] == 3.7
    assert (got.matmul_max, got.matmul_half_dim, got.matmul_fixed_us) == (base.matmul_max, base.matmul_half_dim,
                                                                         base.matmul_fixed_us)
    assert calc.fit_matmul(rows, load_hardware("dgx-h100")) == {}


DSV3 = load_model("deepseek-v3")  # 256 routed experts of width 2048, top-8
H100 = load_hardware("dgx-h100")


def _w(stack) -> Workload:
    return Workload.of(DSV3, H100, stack, TrainingSetup(seq_len=4096, precision="bf16-mixed"))


def test_deepseek_v3_at_ep_1_pays_one_fixed_time_and_63_kernel_floors_a_pass():
    """256 local experts on TE's 4 streams: 64 GEMMs on the busiest stream, one per-call fixed time (23.7 us) and 63
    kernel floors (3.7 us): 256.8 us a forward pass of each routed linear where 64 fixed times (1,516.8 us) were
    costed; backward (dgrad, wgrad) twice that, over one grouped kernel's."""
    core = load_stack("megatron-core")
    one = core.model_copy(update={"engine": core.engine.model_copy(update={"moe_gemm_streams": 0})})
    w, w1 = _w(core), _w(one)
    for lin in (x for x in DSV3.layer.linears if x.copies > 1):
        assert expert.gemm_calls(w, lin, 1) == (64.0, 256.0) and expert.fixed_times(w, lin, 1) == (1.0, 63.0)
        fwd, bwd, _ = linear_pass_times(w, lin, 4096.0, 1, expert.gemm_shape(w, lin, 4096.0, 1, 1, 1))
        fwd1, bwd1, _ = linear_pass_times(w1, lin, 4096.0, 1, expert.gemm_shape(w1, lin, 4096.0, 1, 1, 1))
        assert fwd - fwd1 == pytest.approx(63 * 3.7e-6, rel=1e-9)
        assert bwd - bwd1 == pytest.approx(2 * 63 * 3.7e-6, rel=1e-9)


def test_one_gemm_per_expert_from_python_pays_the_fixed_time_on_each():
    """megatron-core without --moe-grouped-gemm runs SequentialMLP, each expert's GEMM issued from Python: 256 fixed
    times a pass at ep 1, no floor."""
    core = load_stack("megatron-core")
    w = _w(core.model_copy(update={"engine": core.engine.model_copy(update={"moe_grouped_gemm": False})}))
    lin = next(x for x in DSV3.layer.linears if x.copies > 1)
    assert expert.fixed_times(w, lin, 1) == (256.0, 0.0)
