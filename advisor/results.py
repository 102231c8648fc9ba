"""Typed results: what ``advisor estimate`` and each row of ``advisor plan`` report for one plan.

``Estimate.model_dump()`` is exactly what ``advisor estimate --json`` prints; the time breakdown's parts sum
to ``step_time_s`` and the memory parts to ``memory.peak_bytes``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from pydantic import BaseModel, ConfigDict

from advisor.hardware import Hardware
from advisor.layout import Layout, Plan
from advisor.model import ModelSpec, PositionKind
from advisor.parallel.expert import moe_note
from advisor.step import Evaluation
from advisor.training import TrainingSetup


class Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class MemoryReport(Result):
    peak_bytes: float
    parts: dict[str, float]
    overhead_bytes: float
    overhead: dict[str, float]
    capacity_bytes: float
    headroom_bytes: float
    fits: bool


class Estimate(Result):
    model: str
    hw: str
    stack: str
    params: int
    world_size: int
    nodes: int
    plan: Plan
    setup: TrainingSetup
    layout: Layout
    label: str
    grad_accum: int
    global_batch: int
    tokens_per_step: int
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    mfu: float  # model FLOPs per step / (step time x GPUs x peak)  (advisor.step: FLOPs)
    hfu: float  # hardware FLOPs (recomputation, eager attention's masked half) / (step time x GPUs x peak)
    tflops_per_gpu: float
    hw_tflops_per_gpu: float
    fits: bool
    memory: MemoryReport
    breakdown: dict[str, float]
    dominant: str
    usd_per_million_tokens: Optional[float] = None  # when the profile has a price per GPU-hour
    trainable_params: Optional[int] = None  # what the optimizer trains (advisor.finetune; all of them for full)
    # the link or NCCL algorithm each of the plan's collectives runs on, at one call's size (advisor.picks; estimate
    # only: a search's rows leave it empty)
    collectives: dict[str, str] = {}
    stack_rule: Optional[str] = None  # --stack auto: the rule that chose the stack (advisor.api.AUTO_RULE)
    # host memory per node that offloaded states and activations take (advisor/parallel/offload.py); a plan that
    # needs more than the profile's host memory does not fit
    host_memory_bytes: float = 0.0
    # mixture of experts: active parameters and how routing is costed (advisor.parallel.expert.moe_note); "" if dense
    moe: str = ""
    # how the layers sit on the pipeline ranks and which rank set the step (advisor.step.stage_note): estimate only
    pipeline: str = ""
    # a RoPE model's sequence beyond its trained positions (position_note); "" within them
    positions: str = ""


def position_note(spec: ModelSpec, seq: int) -> str:
    """A note where a RoPE or ALiBi model runs a sequence beyond the positions it was trained to (ModelSpec.max_positions,
    from config.json): not an error, as learned positions are (advisor.api.check_seq), since neither has a table of
    positions: people extend a RoPE model's context, and ALiBi's distance bias extrapolates; "" otherwise."""
    if spec.position is PositionKind.learned or seq <= spec.max_positions:
        return ""
    head = f"positions: --seq {seq:,} exceeds the {spec.max_positions:,} positions {spec.name} was trained to"
    if spec.position is PositionKind.rotary:
        return (f"{head} (max_position_embeddings, RoPE); advisor costs the sequence as given, with the RoPE its config "
                "sets (extending the context, a larger RoPE base or a rope_scaling, is the run's to set)")
    alibi = (f"{head} ({ALIBI_LENGTH_KEY.get(spec.family, 'max_position_embeddings')}, ALiBi); ALiBi biases each head's "
             "scores by distance and has no table of positions, so it runs longer sequences than it was trained on "
             "(how well it extrapolates is the run's to check); advisor costs the sequence as given")
    if spec.family == "mpt":  # transformers/models/mpt/modeling_mpt.py:317 builds the bias max_seq_len long
        return (f"{alibi}, but transformers' MptModel builds the bias only max_seq_len long and fails on a longer "
                f"sequence: set max_seq_len to {seq:,} or more in the config (it adds no weights)")
    return alibi


# the config.json key of an ALiBi family's trained length (advisor/model/families/gpt.py: mpt, bloom, falcon's default)
ALIBI_LENGTH_KEY = {"mpt": "max_seq_len", "bloom": "seq_length"}


def dominant_part(breakdown: dict[str, float]) -> str:
    return max(breakdown, key=lambda k: breakdown[k])


def trainable_params(spec: ModelSpec, ft) -> int:
    from advisor.finetune import trainable_params as count

    return count(spec, ft)


def make_estimate(spec: ModelSpec, hw: Hardware, stack: str, plan: Plan, setup: TrainingSetup, world: int,
                  grad_accum: int, out: Evaluation, i: int = 0, collectives: Optional[dict] = None) -> Estimate:
    """Row ``i`` of an evaluation as a typed Estimate."""
    breakdown = {k: float(v[i]) for k, v in out.time.parts().items()}
    step = sum(breakdown.values())
    mem_parts = {k: float(v[i]) for k, v in out.memory.parts().items()}
    peak = sum(mem_parts.values())
    over = {k: float(v[i]) for k, v in out.overhead.parts().items()}
    cap = hw.gpu.memory_bytes
    host_need = float(np.broadcast_to(out.host_bytes, np.shape(out.tokens))[i])
    gpu_fits = peak + sum(over.values()) <= cap
    fits = gpu_fits and bool(host_fits(hw, host_need))
    tokens = float(out.tokens[i])
    hw_flops = float(out.hw_flops[i])
    peak_flops = hw.gpu.peak_flops_per_s(setup.precision.math)
    return Estimate(
        model=spec.name, hw=hw.name, stack=stack, params=spec.n_params, world_size=world,
        nodes=int(-(-world // hw.gpus_per_node)), plan=plan, setup=setup, layout=plan.layout(hw.gpus_per_node, world),
        label=plan.label(), grad_accum=grad_accum, global_batch=setup.micro_batch * grad_accum * plan.dp,
        tokens_per_step=int(tokens), step_time_s=step, tokens_per_s=tokens / step,
        samples_per_s=tokens / setup.seq_len / step,
        mfu=float(out.model_flops[i]) / (step * world * peak_flops),
        hfu=hw_flops / (step * world * peak_flops),
        tflops_per_gpu=float(out.model_flops[i]) / (step * world) / 1e12,
        hw_tflops_per_gpu=hw_flops / (step * world) / 1e12,
        fits=bool(fits),
        memory=MemoryReport(peak_bytes=peak, parts=mem_parts, overhead_bytes=sum(over.values()), overhead=over,
                            capacity_bytes=cap, headroom_bytes=cap - peak - sum(over.values()), fits=bool(gpu_fits)),
        breakdown=breakdown, dominant=dominant_part(breakdown),
        usd_per_million_tokens=(hw.price_per_gpu_hour_usd * world * step / 3600.0 / tokens * 1e6
                                if hw.price_per_gpu_hour_usd else None),
        collectives=collectives or {}, trainable_params=trainable_params(spec, setup.finetune),
        host_memory_bytes=host_need, moe=moe_note(spec, setup), positions=position_note(spec, setup.seq_len),
    )


def host_fits(hw: Hardware, host_bytes):
    """Whether a node's host memory holds what its ranks offload (arrays or scalars)."""
    return np.asarray(host_bytes) <= (hw.host.memory_bytes if hw.host is not None else 0.0)
