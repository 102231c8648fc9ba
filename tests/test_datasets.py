"""The validation datasets load, have the documented sizes, and agree with the raw reference files."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `validation` is not an installed package; run from a checkout
    sys.path.insert(0, str(ROOT))

from advisor.model import llama_like  # noqa: E402
from validation import datasets as ds  # noqa: E402

REFERENCE = next((p for p in (ROOT.parent / "shared" / "reference", Path("/work/shared/reference")) if p.is_dir()), None)
needs_reference = pytest.mark.skipif(REFERENCE is None, reason="raw reference files not present")

DATASET_FILES = [
    "seeds_titan_rtx.yaml", "seeds_dgx_a100.yaml", "vtrain_a100.csv", "vtrain_a100.meta.yaml",
    "a100_nccl_allreduce.csv", "h100_single_gpu.jsonl", "published_runs.yaml", "published_collectives.yaml",
    "multinode_collectives.yaml",
    "published_runs_normalised.csv", "published_runs_skipped.csv", "aiconfigurator_gemm.csv",
    "aiconfigurator_nccl_a100.csv", "deepspeed_engine_probe.txt", "published_runs_modern.yaml",
    "lowprec_runs.yaml", "megatron_bridge_performance.csv", "finetune_runs.yaml", "aiconfigurator_gemm_small.csv",
]
PROFILES = {p.stem for p in (ROOT / "hardware_profiles").glob("*.yaml")}


@pytest.mark.parametrize("loader, n_rows", [
    (ds.load_titan_seed, 3), (ds.load_dgx_seed, 4), (ds.load_vtrain, 1440), (ds.load_nccl_a100, 7 * 1024),
    (ds.load_h100_single, 3), (ds.load_published_runs, 27), (ds.load_published_runs_raw, 59),
    (ds.load_published_collectives, 36), (ds.load_multinode_collectives, 38), (ds.load_aiconfigurator_gemm, 4 * 1296),
    (ds.load_aiconfigurator_nccl_a100, 4 * 3 * 21), (ds.load_aiconfigurator_gemm_small, 4 * 17 * 8 * 8),
])
def test_row_counts(loader, n_rows):
    assert len(loader()) == n_rows


@pytest.mark.parametrize("name", DATASET_FILES)
def test_every_dataset_is_in_sources(name):
    assert (ds.DATA_DIR / name).is_file()
    assert f"`{name}" in (ds.DATA_DIR / "SOURCES.md").read_text()


def test_titan_seed_values():
    """Seed 001's printed train_runtime values (exact copies)."""
    runs = {r.id: r for r in ds.load_titan_seed()}
    assert runs["titan_dp_nvlink"].train_runtime_s == 110.5948
    assert runs["titan_ddp_nvlink"].train_runtime_s == 101.9003
    assert runs["titan_ddp_pcie"].train_runtime_s == 131.4367
    assert runs["titan_ddp_pcie"].hardware_profile == "titan-rtx-pcie"
    assert runs["titan_dp_nvlink"].estimate_kwargs()["data_parallel"] == "dp"
    assert runs["titan_ddp_nvlink"].step_time_s == pytest.approx(101.9003 / 200)


def test_dgx_seed_values_and_readings():
    runs = {r.id: r for r in ds.load_dgx_seed()}
    assert [runs[k].train_time_s for k in ("dgx_gpt2large_ddp", "dgx_gpt2large_fsdp_sgo")] == [357, 267]
    assert [runs[k].train_time_s for k in ("dgx_gpt2xl_ddp", "dgx_gpt2xl_fsdp_sgo")] == [1292, 877]
    # the seed's own claims: 34% and 47% speedups (rounded)
    assert runs["dgx_gpt2large_ddp"].train_time_s / runs["dgx_gpt2large_fsdp_sgo"].train_time_s == pytest.approx(1.34, abs=0.005)
    assert runs["dgx_gpt2xl_ddp"].train_time_s / runs["dgx_gpt2xl_fsdp_sgo"].train_time_s == pytest.approx(1.47, abs=0.005)
    r = runs["dgx_gpt2xl_fsdp_sgo"]
    assert r.estimate_kwargs()["seq"] == 12 and r.estimate_kwargs(reading="block_1024")["seq"] == 1024
    assert r.estimate_kwargs()["fsdp"] == "shard-grad-op" and r.estimate_kwargs()["global_batch"] == 40
    with pytest.raises(KeyError):
        r.estimate_kwargs(reading="block_2048")


def test_vtrain_plans_are_consistent():
    for row in ds.load_vtrain():
        assert row.dp * row.tp * row.pp == row.gpus
        assert row.global_batch % (row.micro_batch * row.dp) == 0
        assert row.gpus in (2, 4, 8)


@needs_reference
def test_vtrain_matches_raw():
    with open(REFERENCE / "vtrain" / "ground_truth_single.csv", encoding="utf-8-sig") as fh:
        raw = [r for r in csv.reader(fh) if r and not r[0].startswith("#")]
    rows = ds.load_vtrain()
    assert len(raw) == len(rows)
    for r, row in zip(raw, rows):
        assert [int(x) for x in r[:10]] == [row.gpus, row.global_batch, row.micro_batch, row.d_model, row.n_heads,
                                           row.n_layers, row.seq_len, row.tp, row.dp, row.pp]
        assert row.iter_time_s == pytest.approx(float(r[10]) / 1e3, rel=1e-12)  # ms -> s, float round-off only


@needs_reference
@pytest.mark.parametrize("n", range(2, 9))
def test_nccl_matches_raw(n):
    with open(REFERENCE / "a100-nccl" / f"all_reduce_{n}gpu.csv") as fh:
        raw = list(csv.reader(fh))[1:]
    rows = [r for r in ds.load_nccl_a100() if r.n_gpus == n]
    assert len(rows) == len(raw) == 1024
    for r, row in zip(raw, rows):
        assert (row.size_bytes, row.count) == (int(r[0]), int(r[1]))
        assert row.time_s_run1 == pytest.approx(float(r[3]) / 1e9, rel=1e-12)
        assert row.busbw_GBps_run2 == float(r[6])
        assert min(row.time_s_run1, row.time_s_run2) <= row.time_s <= max(row.time_s_run1, row.time_s_run2)


def test_nccl_first_row():
    """all_reduce_2gpu.csv line 2: 1048576 B, 44210 ns / 23.72 GB/s and 45100 ns / 23.25 GB/s."""
    row = ds.load_nccl_a100()[0]
    assert (row.n_gpus, row.size_bytes, row.time_s_run1, row.time_s_run2) == (2, 1048576, 44210e-9, 45100e-9)
    assert row.busbw_GBps == pytest.approx(23.485)


@needs_reference
def test_h100_matches_raw():
    raw = [json.loads(x) for x in (REFERENCE / "h100" / "train_examples.jsonl").read_text().splitlines()]
    raw = [r for r in raw if r["kind"] == "train"]
    for r, row in zip(raw, ds.load_h100_single(), strict=True):
        assert row.step_time_s == pytest.approx(r["fwd_bwd_s"] + r["opt_step_s"], rel=1e-12)
        assert (row.peak_mem_bytes, row.params, row.micro_batch, row.seq_len) == (r["peak_mem"], r["params"], r["batch"], r["seq"])


def test_h100_rows_map_to_advisor_names():
    rows = {r.model: r for r in ds.load_h100_single()}
    assert rows["gpt2"].precision == "fp32" and rows["llama-1b"].precision == "bf16-mixed"
    for row in rows.values():
        assert row.model_spec().n_params == row.params
        assert row.estimate_kwargs()["hw"] in PROFILES


@pytest.mark.parametrize("kv_heads, d_ff", [(8, 6656), (32, 5632)])
def test_llama_1b_shape_gives_measured_param_count(kv_heads, d_ff):
    """953,223,168 = the measured `params` of llama-1b; both shapes match (SOURCES.md: not identifiable)."""
    spec = llama_like("llama-1b", n_layers=16, d_model=2048, n_heads=32, n_kv_heads=kv_heads, d_ff=d_ff,
                      vocab=32000, max_positions=2048, tied=False)
    assert spec.n_params == 953_223_168


def test_llama_1b_recorded_shape():
    row = next(r for r in ds.load_h100_single() if r.model == "llama-1b")
    assert (row.shape.n_layers, row.shape.d_model, row.shape.n_heads, row.shape.n_kv_heads, row.shape.d_ff) == (16, 2048, 32, 32, 5632)
    assert row.model_spec().n_params == 953_223_168


def test_published_rows_cover_every_raw_row_once():
    kept = {r.source_id for r in ds.load_published_runs()}
    skipped = ds.load_published_skipped()
    raw = [r["id"] for r in ds.load_published_runs_raw()]
    assert not kept & set(skipped)
    assert sorted(kept | set(skipped)) == sorted(raw)
    assert all(reason for reason in skipped.values())


def test_published_rows_are_consistent_with_raw():
    raw = {r["id"]: r for r in ds.load_published_runs_raw()}
    for row in ds.load_published_runs():
        src = raw[row.source_id]
        assert row.dp * row.tp * row.pp == row.gpus == src["hardware"]["num_gpus"]
        assert row.micro_batch * row.dp * row.grad_accum == row.global_batch == src["batch"]["global_batch_seqs"]
        assert row.hardware_profile in PROFILES
        assert row.step_time_s is not None and row.step_time_s > 0
        if row.measured_tflops_per_gpu is not None:
            assert row.measured_tflops_per_gpu == src["measured"]["achieved_tflops_per_gpu"]
            assert row.flops_accounting == "with_recompute"
        published = src["model"]["params_billion"]
        if published:  # the dims rebuild the published size (GPT-style, tied, learned positions)
            assert row.model_spec().n_params / 1e9 == pytest.approx(published, abs=0.05)
        if row.schedule == "interleaved":
            assert row.n_layers % (row.pp * row.virtual_stages) == 0 and row.grad_accum % row.pp == 0


def test_published_spot_values():
    rows = {r.source_id: r for r in ds.load_published_runs()}
    r = rows["megatron_sc21_t1_1008.0B"]  # SC21 Table 1 last row: 3072 GPUs, 163 TFLOP/s, tp8 pp64
    assert (r.gpus, r.tp, r.pp, r.dp, r.measured_tflops_per_gpu) == (3072, 8, 64, 6, 163)
    assert rows["korthikanti_t5_175B_seqpar_selective"].measured_step_time_s == 13.75
    assert rows["korthikanti_t5_175B_seqpar_selective"].recompute == "selective"
    assert rows["korthikanti_t5_175B_seqpar_selective"].sp


@needs_reference
@pytest.mark.parametrize("name", ["published_runs.yaml", "published_collectives.yaml", "published_runs_modern.yaml",
                                  "multinode_collectives.yaml", "lowprec_runs.yaml",
                                  "megatron_bridge_performance.csv"])
def test_published_copies_are_verbatim(name):
    assert (ds.DATA_DIR / name).read_bytes() == (REFERENCE / name).read_bytes()


@pytest.mark.parametrize("loader", [ds.load_titan_seed, ds.load_dgx_seed, ds.load_vtrain, ds.load_h100_single,
                                    ds.load_published_runs])
def test_estimate_kwargs_use_the_estimator_vocabulary(loader):
    allowed = {"model", "hw", "gpus", "dp", "tp", "pp", "zero", "fsdp", "sp", "schedule", "virtual_stages",
               "micro_batch", "global_batch", "grad_accum", "seq", "precision", "attention", "recompute",
               "optimizer", "data_parallel", "overlap_grad_reduce", "stack"}
    for row in loader()[:50]:
        kw = row.estimate_kwargs()
        assert set(kw) <= allowed
        assert kw["hw"] in PROFILES
        assert kw["precision"] in {"fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp8-mixed"}
        assert kw["recompute"] in {"none", "selective", "full"}
        assert kw["dp"] * kw["tp"] * kw["pp"] == kw["gpus"]
