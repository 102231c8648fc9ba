"""Explain: where a question sits in the seeds' decision tree, what each plan kind is, and why a plan ranks
where it does (dominant cost, memory headroom, and when the cost model overrules the rule of thumb).

The decision tree is Hugging Face's "Efficient Training on Multiple GPUs" (seed 001): single GPU / single
node / multi node, model fits on one GPU or not, fast or slow links.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from advisor.candidates import Candidates
from advisor.hardware import Hardware
from advisor.layout import DataParallelKind, Plan
from advisor.model import ModelSpec
from advisor.parallel import offload
from advisor.results import Estimate
from advisor.units import GiB, fmt_seconds_3g
from advisor.stack import Stack, load_stack
from advisor.training import Mode

# Inter-node bandwidth per GPU above which the decision tree calls a network "fast": 100 Gb/s per GPU
# (8x 200 Gb/s HDR in a DGX A100 is 200 Gb/s per GPU; a 400 Gb/s EFA node shares 50 Gb/s per GPU).
FAST_NETWORK_BYTES_PER_GPU = 100e9 / 8


def decision_tree(m: ModelSpec, hw: Hardware, world: int, fits_one_gpu: bool, method: str = "full") -> dict[str, Any]:
    """Where this question sits in seed 001's decision tree, and the rule of thumb it gives. On one GPU that the
    model does not fit, fine-tuning methods answer beside ZeRO-Offload (issue 22: advisor.methods)."""
    fast = hw.inter_node_bytes_per_s_per_gpu >= FAST_NETWORK_BYTES_PER_GPU
    nvlink = hw.intra_node.kind.value in ("nvlink", "nvswitch")
    if world == 1:
        pos, rule, first = "single GPU", "normal training" if fits_one_gpu else "ZeRO + CPU offload", "single"
        if method != "full":
            rule = (f"{method} fine-tuning fits" if fits_one_gpu else
                    f"{method} does not fit either: QLoRA (NF4 base), CPU offload of the optimizer and activations")
        elif not fits_one_gpu:
            rule = ("ZeRO + CPU offload, or fine-tune adapters on a frozen base: LoRA, or QLoRA on an NF4 base "
                    "(advisor plan --method auto)")
    elif world <= hw.gpus_per_node:
        if fits_one_gpu:
            pos, rule, first = "single node, model fits on one GPU", "DDP first; ZeRO may or may not be faster", "ddp"
        else:
            pos = "single node, model does not fit on one GPU"
            rule = "PP, ZeRO or TP (on par with NVLink/NVSwitch)" if nvlink else "PP (without NVLink PP beats TP and ZeRO)"
            first = "any" if nvlink else "pp"
    else:
        if fast:
            pos, rule, first = "multi node, fast inter-node network", "ZeRO, or PP+TP+DP", "zero"
        else:
            pos, rule, first = "multi node, slow inter-node network", "DP+PP+TP+ZeRO-1", "3d"
        if fits_one_gpu:
            pos += ", model fits on one GPU"
    return {"position": pos, "rule": rule, "first_choice": first, "fast_network": fast, "nvlink": nvlink,
            "fits_one_gpu": fits_one_gpu}


def plan_kind(p: Plan) -> str:
    if p.data_parallel is DataParallelKind.dp and p.dp > 1:
        return "dp"
    if p.cp > 1:
        return "cp"
    if p.tp > 1 and p.pp > 1:
        return "3d"
    if p.pp > 1:
        return "pp"
    if p.tp > 1:
        return "tp"
    if p.zero > 0:
        return "zero"
    return "ddp" if p.dp > 1 else "single"


KIND_NAMES = {"dp": "nn.DataParallel", "ddp": "DDP", "zero": "ZeRO/FSDP", "tp": "TP", "pp": "PP", "3d": "TP+PP",
              "single": "single GPU", "cp": "CP"}


def kind_codes(c: Candidates) -> np.ndarray:
    """plan_kind for every candidate at once."""
    dp, tp, pp = (np.asarray(x) for x in (c.dp, c.tp, c.pp))
    kinds = np.array(["single"] * len(dp), dtype=object)
    kinds[dp > 1] = "ddp"
    kinds[(np.asarray(c.zero) > 0) & (tp == 1) & (pp == 1)] = "zero"
    kinds[(tp > 1) & (pp == 1)] = "tp"
    kinds[(pp > 1) & (tp == 1)] = "pp"
    kinds[(tp > 1) & (pp > 1)] = "3d"
    kinds[np.asarray(c.cp) > 1] = "cp"
    kinds[(np.asarray(c.dp_kind) == DataParallelKind.dp.code) & (dp > 1)] = "dp"
    return kinds


NO_EP_WORDS = "the experts' token gathers and output reduce-scatters over their tensor-parallel ranks (no EP)"
PART_WORDS = {
    "compute/forward": "forward compute", "compute/backward": "backward compute", "compute/recompute": "recomputation",
    "comm/tp": "tensor-parallel all-reduce/all-gather", "comm/pp_p2p": "pipeline send/recv", "pipeline_bubble": "pipeline bubble",
    "comm/dp_grad": "gradient reduction", "comm/zero_params": "ZeRO/FSDP parameter gathers", "comm/dataparallel": "nn.DataParallel replicate/gather",
    "optimizer": "optimizer step", "host_overhead": "host-side kernel launches",
    "offload": "offload (PCIe/NVMe copies and the CPU optimizer step)",
    "comm/ep_alltoall": "expert-parallel dispatch/combine all-to-all", "comm/ep_grad": "expert gradient reduction",
    "comm/cp": "context-parallel K/V exchange",
}
OFFLOAD_WHY = {"optimizer-cpu": "optimizer states and step on the CPU (ZeRO-Offload)",
               "optimizer-nvme": "optimizer states on NVMe, the step on the CPU (ZeRO-Infinity)",
               "params-cpu": "parameters, optimizer states and step on the CPU", "params-nvme": "parameters and "
               "optimizer states on NVMe, the step on the CPU (ZeRO-Infinity)"}


def why_layout(e: Estimate, tree: dict) -> list[str]:
    """What context parallelism and an uneven or zero-bubble pipeline do in this plan, in the plan's numbers."""
    from advisor.parallel.pipeline import stage_counts

    p, words = e.plan, []
    if p.cp > 1:
        share = tree.get("attention_share")
        attn = f"attention is {100 * share:.0f}% of the FLOPs; " if share is not None else ""
        words.append(f"sequence {e.setup.seq_len}: {attn}CP={p.cp} ({p.cp_comm.value}) splits it and the activations "
                     f"{p.cp} ways, {e.setup.seq_len // p.cp} tokens a rank")
    if p.pp > 1 and tree.get("n_layers"):
        n = tree["n_layers"]
        counts = stage_counts(n, p.pp, p.pp_split.value)
        busiest, mean = max(counts), n / p.pp
        if p.pp_split.value == "edges":
            words.append(f"{n} layers on {p.pp} stages as {counts[0]}/{counts[1]}/{counts[-1]} (first/middle/last: the "
                         f"embedding and the loss count as a layer), busiest {busiest} vs {mean:.2f} mean")
        elif n % p.pp:
            words.append(f"{n} layers on {p.pp} stages: the busiest holds {busiest} vs {mean:.2f} mean")
        bubble = e.breakdown.get("pipeline_bubble", 0.0)
        if p.chunks > 1 or p.schedule.value.startswith(("zb", "dual")):
            words.append(f"{p.schedule.value}{f' v={p.chunks}' if p.chunks > 1 else ''} keeps the bubble to "
                         f"{100 * bubble / e.step_time_s:.0f}% of the step")
    return words


def why_faster(e: Estimate, stack: Stack, other: tuple[dict, int], name: str) -> str:
    """What a plan saves against another kind's best plan (its parts and micro batch), the two parts that account for
    most of the gap: the reason a ranking overrules a rule of thumb, in the plans' own numbers, with the cause of a
    compute gap where the stack's profile or the micro batch gives it."""
    parts, micro_batch = other
    gap = {k: parts.get(k, 0.0) - v for k, v in e.breakdown.items()}
    compute = sum(gap.pop(k, 0.0) for k in ("compute/forward", "compute/backward", "compute/recompute"))
    saved = sorted([(compute, "compute")] + [(v, PART_WORDS.get(k, k)) for k, v in gap.items()], reverse=True)[:2]
    said = [(f"{fmt_seconds_3g(v)} less {what}", what) for v, what in saved if v > 0.05 * max(saved[0][0], 1e-30)]
    engine = stack.engine
    if e.plan.zero >= engine.half_from_zero and engine.fsdp_param_dtype == "half" and e.setup.precision.mode is Mode.mixed:
        stages = "/".join(str(z) for z in range(engine.half_from_zero, 4))
        cause = f"{e.stack} runs ZeRO-{stages} on half-precision weights, {name} under autocast on fp32 ones"
    else:
        cause = f"micro batch {e.setup.micro_batch} vs {micro_batch}" if micro_batch != e.setup.micro_batch else ""
    return ", ".join(f"{s} ({cause})" if what == "compute" and cause else s for s, what in said) + f" than {name}'s best"


def explain(e: Estimate, hw: Hardware, tree: dict, best_time: float, best_by_kind: Optional[dict] = None,
            kind_best: Optional[dict] = None, left_out: bool = False, stack: Optional[Stack] = None,
            behind: Optional[float] = None) -> str:
    """Why a ranked plan ranks where it does; ``stack`` is the profile it was costed in (the search's, loaded once);
    ``behind``: its objective's value over plan 1's (ranking.objective_key), where that is not the step time."""
    parts = e.breakdown
    compute = parts["compute/forward"] + parts["compute/backward"] + parts["compute/recompute"]
    overhead = {k: v for k, v in parts.items() if not k.startswith("compute") and v > 0}
    words = [f"compute {100 * compute / e.step_time_s:.0f}%"]
    if overhead and max(overhead.values()) < 0.01 * e.step_time_s:
        words.append("no other part above 1%")
    elif overhead:
        k = max(overhead, key=overhead.get)
        # an EP group inside one NVLink domain (etp x ep ranks in a row) stays on NVLink, as a TP group does
        ep_inside = k == "comm/ep_alltoall" and e.layout.ep * e.layout.etp <= hw.domain_gpus
        # a group inside one NVLink domain (a node, or an NVL72 rack of trays) runs on NVLink
        inside = e.world_size <= hw.domain_gpus or (k == "comm/tp") or ep_inside
        domain = "intra-node" if hw.domain_gpus == hw.gpus_per_node else f"NVLink-domain ({hw.domain_gpus} GPUs)"
        where = (f" on {domain} {hw.intra_node.kind.value}" if inside else f" on inter-node {hw.inter_node.kind.value}"
                 ) if k.startswith("comm") else ""
        # without EP, comm/ep_alltoall holds the experts' gathers and reduce-scatters over their etp ranks (expert.time)
        said = NO_EP_WORDS if k == "comm/ep_alltoall" and e.layout.ep == 1 else PART_WORDS.get(k, k.replace('_', ' '))
        words.append(f"largest overhead {said}{where} {100 * overhead[k] / e.step_time_s:.0f}%")
    words.append(f"headroom {e.memory.headroom_bytes / GiB:.1f} GiB")
    if e.plan.offload.value != "none":
        kept = sum(e.memory.parts[k] for k in ("weights", "gradients", "optimizer_states"))
        why = OFFLOAD_WHY[e.plan.offload.value]
        if offload.hybrid(stack or load_stack(e.stack)):
            why = why.replace("(ZeRO-Offload)", "(Megatron's --optimizer-cpu-offload)")
        words.append(f"{why}: {kept / GiB:.1f} GiB of model states kept on the GPU, "
                     f"{e.host_memory_bytes / GiB:.0f} GiB of host memory per node")
    words += why_layout(e, tree)
    ratio = behind if behind is not None else (e.step_time_s / best_time if best_time > 0 else 1.0)
    if ratio > 1.0005:  # in the ranking's own terms: GPU-seconds a token under throughput and cost
        words.append(f"+{100 * (ratio - 1):.1f}% vs best")
    kind = plan_kind(e.plan)
    first = tree.get("first_choice")
    best_by_kind = best_by_kind or {}

    def versus(k: str) -> str:
        t = best_by_kind.get(k)
        return f" ({KIND_NAMES[k]}'s best {fmt_seconds_3g(t)}, +{100 * (t / e.step_time_s - 1):.1f}%)" if t and t > e.step_time_s else ""

    if kind == "cp":
        best_other = min((t for k, t in best_by_kind.items() if k != "cp"), default=None)
        if best_other and best_other > e.step_time_s:
            words.append(f"the best plan without CP takes {fmt_seconds_3g(best_other)} (+{100 * (best_other / e.step_time_s - 1):.1f}%)")
    rule = {"ddp": "DDP first", "pp": "PP first without NVLink", "3d": "DP+PP+TP+ZeRO-1 on a slow network"}
    overruled = ((first == "ddp" and kind == "zero") or (first == "pp" and kind in ("tp", "zero"))
                 or (first == "3d" and kind in ("zero", "ddp")))
    if overruled and first not in best_by_kind:  # the rule's kind has no plan the stack runs that fits: nothing overruled
        words.append(f"the rule of thumb ({rule[first]}) has no {KIND_NAMES[first]} plan that runs and fits here" +
                     (" faster than its stack's data-parallel best" if left_out and first in ("pp", "3d") else ""))
    elif overruled and best_by_kind[first] <= e.step_time_s * 1.0005:  # slower than the rule's own best: it overrules nothing
        pass
    elif overruled and (kind_best or {}).get(first):
        words.append(f"overrules the rule of thumb ({rule[first]}): {why_faster(e, stack or load_stack(e.stack), kind_best[first], KIND_NAMES[first])}"
                     f"{versus(first)}")
    elif overruled:
        words.append(f"overrules the rule of thumb ({rule[first]}){versus(first)}")
    return "; ".join(words)
