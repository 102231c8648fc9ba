"""What a search returns: the ranked plans and how they were ranked.

Objectives (``--objective``), each what a user wants from a run:
- ``time``: the shortest step, i.e. the shortest time to train (every plan of a search trains the same global
  batch per step): the fastest run the cluster allows.
- ``throughput``: the most tokens per second per GPU, i.e. the best use of each GPU (the figure the stacks'
  benchmark tables publish).
- ``cost``: the fewest dollars per token, at the profile's price per GPU-hour.
- ``memory``: the least memory per GPU (the most headroom).
On one GPU count the first three rank alike (a fixed batch, a fixed number of GPUs); over a range of counts
(``--gpus 64:1024``) they part: more GPUs shorten a step but use each GPU less well. With a token budget
(``--tokens 1T``) each plan also says how long and how much training it takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from advisor.auto import left_out_words
from advisor.parallel.expert import moe_note
from advisor.explain import KIND_NAMES
from advisor.export import unwritable
from advisor.hardware import Hardware
from advisor.model import ModelSpec
from advisor.results import Estimate, position_note
from advisor.stack import Stack, list_stacks, load_stack
from advisor.training import TrainingSetup
from advisor.units import fmt_count, fmt_seconds_3g

# Plans whose step times differ by less than this are a tie as far as the model can tell: the smallest step-time error
# `advisor validate` reports for a whole training stack on measured runs is 5.2% MAPE (llm-foundry's published runs;
# Megatron-Bridge's dense tables 6.3%, vTrain's 1,440 Megatron-DeepSpeed runs 9.6%)
TIE_BAND = 0.05

OBJECTIVES = ("time", "throughput", "memory", "cost")
RANKED_BY = {"time": "step time", "throughput": "tokens/s per GPU", "memory": "memory per GPU",
             "cost": "USD per million tokens"}


def objective_key(objective: str, step_s: Any, need_bytes: Any, tokens_per_step: Any, world: int) -> Any:
    """The value the search sorts on, smaller first, for plans on ``world`` GPUs."""
    if objective == "memory":
        return need_bytes
    if objective == "time":
        return step_s
    # throughput (tokens/s per GPU, larger is better) and cost (GPU-seconds per token, at one price) rank alike
    return world * step_s / tokens_per_step


@dataclass
class RankedPlan:
    estimate: Estimate
    reason: str

    @property
    def plan(self):
        return self.estimate.plan

    @property
    def setup(self):
        return self.estimate.setup


@dataclass
class PlanSearch:
    model_spec: ModelSpec
    hardware: Hardware
    stacks: list[Stack]  # the stacks costed: one, or every stack for --stack any (each row names its own)
    setup: TrainingSetup  # what every plan shares (the global batch; micro batch and recompute vary per plan)
    worlds: list[int]  # the GPU counts searched
    global_batch_defaulted: bool
    objective: str
    candidates: int
    rejected: dict[str, int]
    plans: list[RankedPlan]
    tree: dict[str, Any] = field(default_factory=dict)
    best_by_kind: dict[str, float] = field(default_factory=dict)  # fastest fitting step time per plan kind
    memory_headroom: float = 0.05
    allow_tp_across_nodes: bool = False
    seq_defaulted: bool = False
    tokens: Optional[float] = None  # a token budget to train
    stack_rule: Optional[str] = None  # --stack auto: the rule that chose each row's stack (advisor.api.AUTO_RULE)
    stack_note: Optional[str] = None  # --stack auto over two stacks: the model-parallel stack's own best (advisor.search)
    kind_worlds: dict[str, int] = field(default_factory=dict)  # the GPU count of each kind's fastest fitting plan
    method_choice: dict[str, Any] = field(default_factory=dict)  # --method auto: what fits and why (advisor.methods)
    near_best: int = 0  # distinct fitting plans within TIE_BAND of the fastest step (advisor.search._rank)
    left_out: dict[str, str] = field(default_factory=dict)  # --stack any: stacks not searched -> why (one line each)
    etp: Optional[int] = None  # --etp: the expert tensor-parallel degree every plan was searched at

    @property
    def stack(self) -> Stack:
        """The stack every plan was costed in (the first of several under --stack any)."""
        return self.stacks[0]

    def stack_named(self, name: str) -> Stack:
        """The Stack a row names (its ``stack`` field holds the name): one this search costed, a profile read from a file
        among them, which a name alone does not find again; else the built-in profile of that name."""
        return next((s for s in self.stacks if s.name == name), None) or load_stack(name)

    @property
    def world_size(self) -> int:
        """The GPU count searched (the largest of a range)."""
        return max(self.worlds)

    @property
    def global_batch(self) -> int:
        return int(self.setup.global_batch)

    @property
    def seq_len(self) -> int:
        return self.setup.seq_len

    def train_time_s(self, e: Estimate) -> Optional[float]:
        """Seconds to train the token budget: whole steps (a budget below one step still takes one)."""
        return None if self.tokens is None else math.ceil(self.tokens / e.tokens_per_step) * e.step_time_s

    def train_cost_usd(self, e: Estimate) -> Optional[float]:
        t, price = self.train_time_s(e), self.hardware.price_per_gpu_hour_usd
        return None if t is None or price is None else price * e.world_size * t / 3600.0

    def _default_batch_words(self) -> str:
        """How the default global batch was chosen (advisor.space.default_global_batch), with its tokens where rounding
        up to a multiple of the GPU count took it far past the half million it aims at."""
        tokens = self.global_batch * self.seq_len
        if tokens <= 1.5 * 2**19:
            return "~0.5M tokens, a multiple of the GPU count"
        return (f"~0.5M tokens rounded up to a multiple of the GPU count: {tokens / 1e6:,.0f}M tokens a step, which "
                "shrinks the pipeline bubble and the gradient syncs per token; --global-batch sets yours")

    def header(self) -> str:
        gpus = (f"{self.worlds[0]:,}" if len(self.worlds) == 1 else
                f"{min(self.worlds):,}-{max(self.worlds):,} ({', '.join(f'{w:,}' for w in self.worlds)})")
        gb = f"global batch {self.global_batch}" + (f" (default: {self._default_batch_words()})" if self.global_batch_defaulted else "")
        seq = f"seq {self.seq_len}" + (" (default: the model's context length, at most 8192)" if self.seq_defaulted else "")
        budget = f", budget {fmt_count(self.tokens)} tokens" if self.tokens is not None else ""
        ft = self.setup.finetune
        method = "" if not ft.adapters else (
            f", {ft.method} r={ft.lora_rank} on {ft.targets}{' (DoRA)' if ft.dora else ''}, frozen base in "
            f"{ {'none': self.setup.precision.value, 'nf4': 'NF4', 'int8': 'int8'}[ft.base_quant.value]}"
            + (f", {ft.offload} on the CPU" if ft.offload.value != "none" else ""))
        compiled = (f", torch.compile of {self.setup.compile.replace(',', ' and ')}"
                    if self.setup.compile != "none" else "")
        mtp = self.setup.mtp_layers
        compiled += (f", {mtp} MTP depth{'s' if mtp > 1 else ''}" if mtp else "") + (
            ", FP8 attention" if self.setup.fp8_attention else "")
        moe = ", ".join(f"--moe-{k} {str(v).replace('_', '-')}" for k, v in (("dispatcher", self.setup.moe_dispatcher),
                                                      ("overlap", self.setup.moe_overlap)) if v)
        compiled += f", {moe}" if moe else ""
        if self.setup.recompute_modules is not None:  # --recompute-modules: the search keeps selective plans only
            compiled += f", selective recomputation of {','.join(self.setup.recompute_modules)} only"
        compiled += f", expert tensor parallelism etp={self.etp} only" if self.etp is not None else ""
        return (f"{self.model_spec.name} ({self.model_spec.n_params / 1e9:.2f}B) on {gpus}x {self.hardware.name}: "
                f"{gb}, {seq}, {self.setup.precision.value}{method}{compiled}{budget}; {self.candidates:,} plans evaluated, "
                f"{sum(self.rejected.values()):,} rejected, ranked by {RANKED_BY[self.objective]}")

    def notes(self) -> list[str]:
        t = self.tree
        out = list(self.method_choice.get("lines", []))
        out += [f"decision tree (HF multi-GPU guide): {t.get('position', '')}; rule of thumb: {t.get('rule', '')}"]
        if self.stack_rule is not None:
            out.append(f"stack: {self.stack_rule} (each row names its stack in --json; `advisor stacks show NAME` says "
                       "what each does; --stack NAME costs every plan in one, --stack any ranks every stack's)")
            if self.stack_note:
                out.append(f"stack: {self.stack_note}")
            out += self._fused_adapter_note()
        elif len(self.stacks) > 1:
            out.append(f"stacks: the plans of {', '.join(s.name for s in self.stacks)} ranked together (each row's "
                       "stack is in --json; `advisor stacks show NAME` says what each does)")
        elif self.left_out:  # --stack any, where one stack alone runs what was asked
            out.append(f"stack: every plan costed as {self.stack.name} runs it ({_gist(self.stack.description)}), the "
                       "only stack that runs what was asked (--stack any)")
        else:
            out.append(f"stack: every plan costed as {self.stack.name} runs it ({_gist(self.stack.description)}); "
                       "--stack NAME costs another, --stack any ranks every stack's (advisor stacks)")
        if self.stack_rule is None and self.left_out:
            out.append(f"stacks left out (--stack NAME says why, in full): {left_out_words(self.left_out)}")
        if self.stack_rule is None and len(self.stacks) == 1:
            lacking = self.export_lacks()
            if lacking:
                out.append(f"export: {self.stack.name}'s launch formats ({', '.join(self.stack.launch)}) do not write "
                           f"{self.model_spec.name} ({'; '.join(lacking)}): `advisor export` refuses these plans; --stack "
                           "auto or any ranks only stacks that write it")
        if self.model_spec.routed:
            out.append(moe_note(self.model_spec, self.setup))
        out += [n for n in (position_note(self.model_spec, self.seq_len),) if n]
        price = self.hardware.price_per_gpu_hour_usd
        if price is not None and (self.objective == "cost" or self.tokens):
            out.append(f"cost: at ${price:.2f} a GPU-hour, profile {self.hardware.name}'s price_per_gpu_hour_usd (its "
                       "comment says where it comes from; a profile with base: and your own price costs yours)")
        if len(self.worlds) == 1 and self.objective in ("throughput", "cost"):
            out.append(f"on one GPU count {self.objective} ranks as time does; give a range (--gpus A:B) to trade "
                       "speed for efficiency")
        if self.near_best > 1 and len(self.worlds) == 1 and self.objective != "memory":
            out.append(f"near-ties: {self.near_best:,} plans within {TIE_BAND:.0%} of the fastest step, closer than the model's error "
                       "on measured runs (`advisor validate`), so their order is the model's, not a measurement; "
                       "between them, headroom and what your stack's own recipes run are as good a guide")
        if self.best_by_kind:
            best = min(self.best_by_kind.values())
            kinds = sorted(self.best_by_kind.items(), key=lambda kv: kv[1])
            on = {k: f" on {n:,} GPUs" if len(self.worlds) > 1 else "" for k, n in self.kind_worlds.items()}
            out.append("fastest fitting plan of each kind: " + ", ".join(
                f"{KIND_NAMES[k]} {fmt_seconds_3g(v)}{on.get(k, '')}" + (f" (+{100 * (v / best - 1):.1f}%)" if v > best * 1.0005 else "")
                for k, v in kinds))
        return out

    def _fused_adapter_note(self) -> list[str]:
        """Under --stack auto, LoRA on single q/k/v projections leaves out the stacks whose adapters take whole fused
        modules (engine.adapter_modules fused: Megatron's linear_qkv), and their model-parallel plans: say how to get them."""
        ft = self.setup.finetune
        if not ft.adapters or not set(ft.target_set) & {"q", "k", "v"}:
            return []
        fused = [n for n in list_stacks() if load_stack(n).engine.adapter_modules == "fused"]
        if not fused or any(p.estimate.stack in fused for p in self.plans):
            return []
        return [f"stack: LoRA on {ft.targets} runs in stacks whose adapters take single projections; {' and '.join(fused)} "
                f"adapt q, k and v as one linear_qkv: --lora-targets qkv (and o, gate,up, down as wanted) with --stack {fused[-1]} "
                "ranks its TP, PP and CP plans"]

    def export_lacks(self) -> list[str]:
        """What of the model an explicit stack's launch formats do not write (advisor.export.unwritable): its plans are
        costed in the stack's engine, and `advisor export` refuses them. Empty under --stack auto or any, which rank
        only stacks that write the model."""
        return unwritable(self.stack, self.model_spec) if self.stack_rule is None and len(self.stacks) == 1 else []

    def to_json(self) -> dict:
        rows = []
        for i, p in enumerate(self.plans):
            row = {"rank": i + 1, "reason": p.reason, **p.estimate.model_dump(mode="json")}
            if self.tokens is not None:
                row.update(train_time_s=self.train_time_s(p.estimate), train_cost_usd=self.train_cost_usd(p.estimate))
            rows.append(row)
        return {
            "model": self.model_spec.name, "hw": self.hardware.name, "world_size": self.world_size,
            "worlds": list(self.worlds), "global_batch": self.global_batch, "seq_len": self.seq_len,
            "objective": self.objective, "tokens": self.tokens, "candidates": self.candidates,
            "rejected": dict(self.rejected), "stack": ("auto" if self.stack_rule is not None else
                                                 self.stack.name if len(self.stacks) == 1 else "any"),
            "stack_rule": self.stack_rule, "stack_note": self.stack_note, "stacks": [s.name for s in self.stacks],
            "stacks_left_out": dict(self.left_out), "export_lacks": self.export_lacks(), "near_best": self.near_best, "decision_tree": self.tree,
            "best_step_time_s_by_kind": dict(self.best_by_kind), "plans": rows, "etp": self.etp,
            "recompute_modules": list(self.setup.recompute_modules) if self.setup.recompute_modules is not None else None,
            **({"method_choice": {k: v for k, v in self.method_choice.items() if k != "lines"}} if self.method_choice else {}),
        }


def coarse(x: np.ndarray) -> np.ndarray:
    """``x`` to 40 bits of mantissa (~1e-12 relative): sums taken in another order rank alike."""
    m, e = np.frexp(x)
    return np.ldexp(np.round(m * 2.0**40) / 2.0**40, e)


# What a plan is, for its checkpointing policy to be chosen: every column but the policy (recompute, recompute_k)
PLAN_COLUMNS = ("dp", "tp", "pp", "zero", "hybrid", "sp", "schedule", "virtual_stages", "dp_kind", "overlap",
                 "micro_batch", "grad_accum", "offload", "ep", "etp", "cp", "cp_comm", "pp_split")


def first_per_plan(found: list, rows: Any) -> Any:
    """Of ranked (search, candidate) rows, the positions of the first row of each plan: the search keeps, per plan,
    the checkpointing policy that ranks best among those that fit (the others differ from it only in the policy)."""
    if not len(rows):
        return np.zeros(0, dtype=int)
    cols = np.empty((len(rows), len(PLAN_COLUMNS) + 1), dtype=np.int64)
    cols[:, 0] = rows[:, 0]  # one search: a GPU count in a stack
    for j, f in enumerate(found):
        at = rows[:, 0] == j
        if not at.any():
            continue
        idx = rows[at, 1]
        for c, name in enumerate(PLAN_COLUMNS, start=1):
            cols[at, c] = np.broadcast_to(getattr(f.plans, name), (len(f.plans),))[idx]
    _, first = np.unique(cols, axis=0, return_index=True)
    return np.sort(first)


def _gist(text: str) -> str:
    """A description up to its first comma or semicolon outside parentheses (a cut inside one left it open)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch in ",;" and depth == 0:
            return text[:i]
    return text
