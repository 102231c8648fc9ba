"""Fine-tuning runs (validation/data/finetune_runs.yaml, a verbatim copy of the reference file): litgpt's resource
tables (LoRA and QLoRA on 1-4 A100-SXM4-40GB), the PEFT README's memory table, Hugging Face's Llama 2 70B FSDP blog.

Each row is estimated as its user would ask: its model's shape (Hugging Face config of the model named), its
method (``--method lora|qlora``, rank, targets as the source names them, ``--lora-library litgpt`` for litgpt's
rows, whose lit-gpt finetune/lora.py @8641822 sets lora_dropout 0.05), its precision (bf16-true: ``bf16``), micro
batch and sequence, its plan (one GPU; FSDP full shard with activation checkpointing on several). Compared: peak
memory in the row's own counter (litgpt: max_memory_allocated / 1e9; PEFT's TorchTracemalloc: bytes / 2**20 shown
as "GB", i.e. GiB), and the verdict: every OOM row must be "does not fit", every run that ran "fits".

Time: litgpt's "time for 1k iterations" is over Alpaca's samples, whose lengths vary (the rows' seq_len is the
longest sample, forced into the first iteration); the source does not state the mean length, so the prediction at
the longest sample is an upper bound, and the ratio is reported, not scored as a match. Rows the cost model
cannot describe (encoder-decoder T5 models, litgpt's LLaMA-Adapter, DeepSpeed's parameter offload, statements
without a per-GPU configuration) are counted as rejected with the reason.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Any

import yaml

from advisor.model import ModelSpec, load_model, model_from_hf_dict
from validation.datasets import DATA_DIR
from validation.report import DatasetReport, Point, _estimate, _report

# Hugging Face configs of the models the rows name (the model cards' config.json, the shapes the rows state)
CONFIGS: dict[str, Any] = {
    "microsoft/phi-1_5": {"model_type": "phi", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                          "num_attention_heads": 32, "vocab_size": 51200, "partial_rotary_factor": 0.5,
                          "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "stabilityai/stablelm-base-alpha-3b": {"model_type": "gpt_neox", "hidden_size": 4096, "intermediate_size": 16384,
                                           "num_hidden_layers": 16, "num_attention_heads": 32, "vocab_size": 50688,
                                           "rotary_pct": 0.25, "max_position_embeddings": 4096,
                                           "use_parallel_residual": True, "tie_word_embeddings": False},
    "meta-llama/Llama-2-7b-hf": "llama2-7b", "meta-llama/Llama-2-13b-hf": "llama2-13b",
    "meta-llama/Llama-2-70b-chat-hf": "llama2-70b", "meta-llama/Llama-2-70b-hf": "llama2-70b",
    "tiiuae/falcon-40b": {"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128,
                          "num_kv_heads": 8, "vocab_size": 65024, "new_decoder_architecture": True, "parallel_attn": True,
                          "bias": False, "alibi": False},
    "bigscience/bloomz-7b1": {"model_type": "bloom", "hidden_size": 4096, "n_layer": 30, "n_head": 32,
                              "vocab_size": 250880},
}
HARDWARE = {"NVIDIA A100-SXM4-40GB": "mosaicml-a100-40gb", "NVIDIA A100 80GB": "dgx-a100"}
LITGPT_DROPOUT = 0.05  # lit-gpt finetune/lora.py @8641822: lora_dropout = 0.05
# the resource tables' lit-gpt (8641822) with bitsandbytes 0.41.1: its NF4 dequantisation into fp16 (stack_profiles/)
LITGPT_STACK = "litgpt-2023"
T5_FAMILY = ("t0", "mt0", "t5", "flan-t5")  # the rows' encoder-decoder models (bigscience/T0_3B, bigscience/mt0-xxl)
PEFT_SEQ = 64  # the rows' note: the clm example's max_length 64 (bloomz)


def load_finetune_runs() -> list[dict]:
    return yaml.safe_load((DATA_DIR / "finetune_runs.yaml").read_text())


@lru_cache(maxsize=None)  # the specs are frozen: build each model once per run
def model_spec(name: str) -> ModelSpec | None:
    cfg = CONFIGS.get(name)
    if cfg is None:
        return None
    return load_model(cfg) if isinstance(cfg, str) else model_from_hf_dict(dict(cfg), name)


def _targets(text: str, spec: ModelSpec) -> str:
    """The run's LoRA targets: litgpt's query and value, else PEFT's default for the family (advisor.peft_modules:
    PEFT's own mapping, query_key_value for BLOOM) where the row states none."""
    from advisor.peft_modules import default_targets

    return "q_proj,v_proj" if "query,value" in text or "query and value" in text else default_targets(spec)


def estimate_kwargs(run: dict) -> tuple[dict | None, str]:
    """(advisor.estimate's options for a run, or None, and the reason it cannot be estimated)."""
    m, t, hw, method = run["model"], run["training"], run["hardware"], run["method"]
    spec = model_spec(m["name"])
    if spec is None:
        if m["name"].lower().split("/")[-1].startswith(T5_FAMILY):
            return None, f"{m['name']}: an encoder-decoder (T5), not a decoder the cost model describes"
        return None, f"{m['name']}: a statement without the model's shape, micro-batch or GPU: nothing to estimate"
    if method["kind"] not in ("full", "lora", "qlora"):
        return None, "LLaMA-Adapter (prefix adapters) is not costed"
    if hw["gpu"] not in HARDWARE or not isinstance(t.get("micro_batch_per_gpu"), int):
        return None, "no per-GPU configuration stated"
    if "DeepSpeed" in str(t["offload"]):
        return None, "DeepSpeed ZeRO-3 parameter offload to CPU is not costed"
    litgpt = "lit-gpt" in str(t["framework"])
    seq = t["seq_len"] if isinstance(t["seq_len"], int) else PEFT_SEQ
    p = str(t["precision"])
    precision = "fp32" if p.startswith("fp32") else "bf16" if "bf16-true" in p else "bf16-mixed"
    n = hw["num_gpus"]
    kw: dict[str, Any] = dict(model=spec, hw=HARDWARE[hw["gpu"]], gpus=n, micro_batch=t["micro_batch_per_gpu"],
                              seq=seq, precision=precision, recompute="full" if t["activation_checkpointing"] else "none",
                              stack=LITGPT_STACK if litgpt else "hf-trainer", grad_accum=1)
    if n > 1:
        kw["fsdp"] = "full-shard"
    if method["kind"] != "full":
        kw.update(method=method["kind"], lora_rank=method["lora_rank"], lora_targets=_targets(str(method["target_modules"]), spec))
        if litgpt:
            kw.update(lora_library="litgpt", lora_dropout=LITGPT_DROPOUT)
        if method["kind"] == "qlora":
            kw.update(quant="nf4", double_quant="double quant" in str(method["quantization"]) and "no double" not in
                      str(method["quantization"]), paged="Paged" in str(t["optimizer"]))
    return kw, ""


def counter_scale(run: dict) -> float:
    """Bytes per unit of the row's memory counter: litgpt divides by 1e9; PEFT's b2mb by 2**20 (shown as GB)."""
    return 1e9 if "/1e9" in str(run["measured"]["memory_counter"]) else 2.0 ** 30


def validate_finetune() -> DatasetReport:
    runs = load_finetune_runs()
    rejected: Counter = Counter()
    points: list[Point] = []
    verdicts, time_ratios = [], []
    iteration_s: dict[str, tuple[float, float]] = {}  # id -> (predicted, measured) seconds per iteration
    for run in runs:
        kw, why = estimate_kwargs(run)
        if kw is None:
            rejected[why] += 1
            continue
        est = _estimate(kw, rejected)
        if est is None:
            continue
        me = run["measured"]
        if me.get("oom") is not None:
            verdicts.append(est.fits == (not me["oom"]))
        if me.get("peak_memory_gb") is not None:
            scale = counter_scale(run)
            points.append(Point(label=run["id"], kind=kw.get("method", "full"), predicted=est.memory.peak_bytes / scale,
                                measured=float(me["peak_memory_gb"])))
        if me.get("time_1k_iterations_min"):
            measured = float(me["time_1k_iterations_min"]) * 60 / 1000
            time_ratios.append(est.step_time_s / measured)
            iteration_s[run["id"]] = (est.step_time_s, measured)
    report = _report("finetune", "fine-tuning runs: full, LoRA, QLoRA (litgpt, PEFT, HF blog)", "peak memory (GB)",
                     len(runs), points, rejected)
    report.extra["verdicts_right_pct"] = 100.0 * sum(verdicts) / max(len(verdicts), 1)
    report.extra["verdicts_compared"] = float(len(verdicts))
    if time_ratios:
        report.extra["time_at_longest_over_measured_min"] = min(time_ratios)
        report.extra["time_at_longest_over_measured_max"] = max(time_ratios)
    # what QLoRA adds to LoRA's iteration on the same row (the same samples): dequantisation, which does not depend on the
    # sequence, so the unknown mean length cancels out of the difference
    deq = [(iteration_s[q][0] - iteration_s[lo][0], iteration_s[q][1] - iteration_s[lo][1])
           for q in iteration_s if "_nf4" in q and (lo := q.replace("_nf4dq_", "_bf16_").replace("_nf4_", "_bf16_")) in iteration_s]
    if deq:
        report.extra["qlora_minus_lora_s_predicted_over_measured_min"] = min(p / m for p, m in deq)
        report.extra["qlora_minus_lora_s_predicted_over_measured_max"] = max(p / m for p, m in deq)
        report.extra["qlora_minus_lora_max_error_pct"] = max(abs(p / m - 1.0) for p, m in deq) * 100.0
    report.notes.append("time: litgpt's 1k-iteration times average Alpaca's varying lengths (not stated); predictions "
                        "at the longest sample are an upper bound, reported as ratios, not scored")
    return report
