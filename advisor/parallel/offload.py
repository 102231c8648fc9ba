"""Offload: model states kept in host memory or on NVMe, and activations copied to host memory.

- **ZeRO-Offload** (``optimizer-cpu``; Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training",
  s.4): the fp32 master weights, Adam's momentum and variance and the fp32 gradients live in host memory, the
  optimizer step runs on the CPU (DeepSpeed's CPU Adam); the GPU keeps the half-precision weights. Per step each
  GPU sends its partition's half-precision gradients down (2 bytes a parameter) and receives the updated
  half-precision parameters (2 bytes): for one GPU 2M + 2M = 4M bytes over PCIe for M parameters (the paper's
  communication volume, s.4.1: "4M"). The gradient copies overlap the backward that produces them (DeepSpeed
  copies each reduced bucket as backward proceeds, once per micro-batch: it accumulates on the CPU); the CPU step
  and the parameter copy do not overlap the GPU (DeepSpeed offers no delayed parameter update). On DeepSpeed
  0.19.8's own engine (the stages its profile's ``zero_buffers`` lists) the copies and host buffers are its source's,
  not the paper's: advisor.parallel.zero_offload (the fp32 gradient partition down at the boundary, 4 bytes; the
  running sum up and down every micro-batch; ZeRO-1 at one micro-batch; ZeRO-1/2's copies exposed whole, the host
  waiting for each; 18 host bytes a parameter, pinned ones rounded).
- **ZeRO-Infinity** (Rajbhandari et al. 2021, "ZeRO-Infinity: Breaking the GPU Memory Wall for Extreme Scale Deep
  Learning"): ``optimizer-nvme`` keeps the optimizer states on the node's NVMe, read and written once a step around
  the CPU step (swapped a sub-group at a time, overlapped with it: the longer of the two); ``params-cpu`` /
  ``params-nvme`` (ZeRO-3's ``offload_param``) also keep the half-precision parameters there: every gather of a
  micro-batch (forward, backward, and the recomputed forward) first copies the GPU's partition up over PCIe
  (prefetched behind the pass's compute), and the step writes the new parameters in place (no upload).
- **Megatron's optimizer CPU offload** (``optimizer-cpu`` where the stack's ``optimizer_offload`` is hybrid_device:
  --optimizer-cpu-offload, megatron-core's HybridDeviceOptimizer under the distributed optimizer, ZeRO-1): the GPU
  keeps its weights and gradient buffer; at step time the shard's gradients go down, torch's fused CPU AdamW steps
  the fp32 master and states, the parameters come back up, one after another, none beside the GPU's work.
- **FSDP CPU offload** (``params-cpu`` in an FSDP stack: CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy):
  the same movement; its optimizer step is torch's CPU optimizer, at the per-core rate `advisor calibrate
  --host` measures (``engine.offload_optimizer: torch``).
- **Activation offload** (the ``offload`` checkpointing policy, advisor/recompute.py): each layer's saved tensors
  down in forward and up in backward, on the compute stream, or the first k layers' on a side stream behind the other
  layers' compute (Megatron's --cpu-offloading-num-layers, ``activation_copies``).

The node's CPU, host memory and NVMe are shared by the ranks on it. Left out: pinned-buffer staging copies, the
CPU's own gradient clipping and overflow checks but DeepSpeed 0.19.8's (advisor.parallel.zero_offload), NVMe capacity
beyond the states, delayed parameter update.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from advisor.candidates import Candidates, Mesh
from advisor.hardware import Hardware
from advisor.layout import Offload
from advisor.parallel import zero_offload
from advisor.parallel.model_states import ModelStates
from advisor.recompute import Mix
from advisor.stack import Stack
from advisor.training import Precision
from advisor.workload import Workload

HALF = 2.0  # bytes of a half-precision gradient or parameter on the wire (the ZeRO-Offload paper's fp16)
FP32_GRAD = 4.0  # the fp32 gradient partition DeepSpeed accumulates in host memory (stage_1_and_2.py, cpu_offload)
# torch's CPU AdamW (foreach/for-loop) against its fused kernel on one core: 0.14 vs 0.70 Gparams/s measured by
# `advisor calibrate --host` here (AMD EPYC, torch 2.13): FSDP's CPU step runs the former
TORCH_CPU_ADAM_SLOWDOWN = 0.70 / 0.14
NO_HOST = ("no host side in the hardware profile: offload is not costed (advisor calibrate --host on the machine "
           "measures one)")


def codes(c: Candidates) -> tuple[Any, Any, Any]:
    """(optimizer states offloaded, parameters offloaded, to NVMe) per plan."""
    off = np.asarray(c.offload)
    params = (off == Offload.params_cpu.code) | (off == Offload.params_nvme.code)
    nvme = (off == Offload.optimizer_nvme.code) | (off == Offload.params_nvme.code)
    return off > 0, params, nvme


def hybrid(stack: Stack | None) -> bool:
    """Whether the stack offloads the optimizer as Megatron's HybridDeviceOptimizer (module docstring)."""
    return stack is not None and stack.engine.optimizer_offload == "hybrid_device"


def violations(c: Candidates, hw: Hardware, stack: Stack | None = None) -> dict[str, Any]:
    opt, params, nvme = codes(c)
    from advisor.training import Recompute  # noqa: PLC0415 (a leaf enum)

    act = np.asarray(c.recompute) == Recompute.offload.code
    zero = np.asarray(c.zero)
    ds = zero_offload.runs(stack, zero)  # DeepSpeed 0.19.8's own engine
    out = {
        NO_HOST: (opt | act) & (hw.host is None),
        "no NVMe in the hardware profile's host side": nvme & (hw.host is not None and not hw.host.has_nvme),
        # megatron/training/arguments.py: --optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs the
        # distributed optimizer (optimizer_config.py); without a stack (an export format's own check after the stack's)
        # only what no engine runs, an unsharded optimizer
        **({f"{stack.name} offloads the optimizer under its distributed optimizer only: --zero 1":
            opt & ~params & (zero != 1)} if hybrid(stack) else {"offloading the optimizer needs ZeRO-2/3 (DeepSpeed ZeRO-Offload, FSDP)":
                                  opt & (zero < (1 if stack is None else 2)) & ~ds}),
        # DeepSpeed runs ZeRO-1 offload (offload_config.py:56 "Valid with stage 1, 2, and 3"), wrongly under accumulation
        zero_offload.ZERO1_ACCUMULATES: opt & ds & (zero == 1) & (np.asarray(c.grad_accum) > 1),
        # stage_1_and_2.py has no swapper: device nvme sets cpu_offload like cpu (:220-222), the states stay in host memory
        "DeepSpeed swaps optimizer states to NVMe under ZeRO-3 only (ZeRO-1/2 keep them in host memory): --zero 3 or "
        "--offload optimizer-cpu": nvme & ds & (zero < 3),
        "offloading parameters needs ZeRO-3 / FULL_SHARD": params & (np.asarray(c.zero) != 3),
        # DeepSpeed's pipeline engine refuses ZeRO-2/3 (deepspeed/runtime/pipe/engine.py:77)
        "offload with pipeline parallelism is not costed": opt & (c.pp > 1),
        "offload with HYBRID_SHARD or nn.DataParallel is not costed": opt & (np.asarray(c.hybrid, dtype=bool) | (c.dp_kind != 0)),
    }
    if stack is not None:
        for o in Offload:
            if o is not Offload.none and o.value not in stack.engine.offloads:
                out[f"{stack.name} does not offload {o.value}"] = np.asarray(c.offload) == o.code
        if stack.engine.offload_optimizer == "cpu_adam" and stack.engine.context_parallel:
            # its offload is DeepSpeed's ZeRO-Offload, set in the DeepSpeed config, which has no context parallelism
            # (megatron-deepspeed: CP from Megatron's flags, offload from the DeepSpeed JSON; no format writes both)
            out[f"{stack.name} offloads through DeepSpeed's ZeRO-Offload, whose config has no context parallelism: "
                "--cp 1 or no --offload"] = opt & (np.asarray(c.cp) > 1)
        if stack.engine.offload_optimizer == "cpu_adam" and "ep" in stack.engine.offers:
            # the same for expert parallelism: Megatron's --expert-model-parallel-size, which the DeepSpeed JSON lacks
            out[f"{stack.name} offloads through DeepSpeed's ZeRO-Offload, whose config has no expert parallelism: "
                "--ep 1 or no --offload"] = opt & (np.asarray(c.ep) > 1)
    return out


def shard_params(states: ModelStates, mesh: Mesh) -> Any:
    """Parameters of one GPU's optimizer partition: the dense ones over the ZeRO group, the routed experts over their
    expert data-parallel group (advisor.parallel.expert)."""
    return (states.params - states.expert_params) / mesh.dp_shard + states.expert_params / np.maximum(mesh.edp, 1.0)


def ranks_per_node(hw: Hardware, mesh: Mesh) -> Any:
    """Ranks sharing one node's CPU, host memory and NVMe."""
    return np.minimum(hw.gpus_per_node, mesh.dp * mesh.tp * mesh.pp)


def apply(w: Workload, c: Candidates, states: ModelStates, layers: Any) -> ModelStates:
    """The GPU's model states with the offloaded ones gone: the optimizer states, the step's temporaries and the
    gradient partition (DeepSpeed's estimate_zero2_model_states_mem_needs: 2 bytes a parameter on the GPU with
    cpu_offload), and under parameter offload the weights but the two units gathered at a time."""
    opt, params, _ = codes(c)
    if not opt.any():
        return states
    unit = w.layer.rank_params(np.asarray(c.tp, dtype=float)) * states.weight_bytes
    staging = np.where(opt, zero_offload.gpu_staging_bytes(w, c.zero, c.tp, states.grad_bytes), 0.0)  # kept from init
    return replace(states, optimizer_states=np.where(opt, 0.0, states.optimizer_states),
                   step_temporaries=np.where(opt, staging, states.step_temporaries), grad_buffer=states.grad_buffer + staging,
                   # Megatron's buffer stays, and DeepSpeed's ZeRO-1 keeps .grad whole until the step
                   # (stage_1_and_2.py:2285-2287 reduces at the boundary only)
                   grads=np.where(opt & (not hybrid(w.stack)) & ~(zero_offload.runs(w.stack, c.zero) & (np.asarray(c.zero) == 1)),
                                  0.0, states.grads),
                   weights=np.where(params, 0.0, states.weights),
                   gathered=np.where(params, np.maximum(states.gathered, np.minimum(2.0 * unit, states.params
                                                                                     * states.weight_bytes)), states.gathered))


def host_bytes(w: Workload, c: Candidates, mesh: Mesh, states: ModelStates, from_states: ModelStates, kept_full: Any,
               tokens: Any, in_flight_layers: Any, pol: Mix) -> Any:
    """Host memory one node needs for its ranks' offloaded states and activations (``from_states``: before apply)."""
    opt, params, nvme = codes(c)
    shard = shard_params(states, mesh)
    per_param = np.where(nvme, FP32_GRAD, from_states.optimizer_states / np.maximum(shard, 1.0) + FP32_GRAD)
    per_param = per_param + np.where(params & ~nvme, states.weight_bytes, 0.0) + (HALF if hybrid(w.stack) else 0.0)
    model = np.where(opt, shard * per_param, 0.0)
    ds = zero_offload.runs(w.stack, c.zero) & opt & ~nvme  # DeepSpeed's own allocations (advisor.parallel.zero_offload)
    if ds.any():
        model = np.where(ds, zero_offload.host_bytes_per_rank(
            c.zero, c.grad_accum, shard, states.weight_bytes, states.grad_bytes, params,
            w.stack.engine.zero_buffers.sub_group_elements, zero_offload.largest_param(w, c.tp),
            zero_offload.master_bytes(w), w.precision is Precision.fp16_mixed), model)
    acts = np.where(pol.offload, pol.offloaded * kept_full * tokens * in_flight_layers, 0.0)
    return (model + acts) * ranks_per_node(w.hw, mesh)


@dataclass(frozen=True)
class OffloadTime:
    """Seconds per step the offloads add beyond what overlaps with the GPU's work."""

    pcie_down_bytes: Any  # per step, per GPU
    pcie_up_bytes: Any
    cpu_step_s: Any
    exposed_s: Any


def pcie_bytes(c: Candidates, shard_params: Any, passes: Any, stack: Stack | None = None,
               grad_bytes: Any = HALF, master: Any = FP32_GRAD) -> tuple[Any, Any]:
    """(down, up) bytes per step one GPU moves over PCIe for its offloaded model states: half-precision gradients
    down every micro-batch; parameters up after the step (optimizer offload), or for every gather pass of every
    micro-batch (parameter offload). One GPU, one micro-batch, M parameters: 2M + 2M (Ren et al. 2021). On DeepSpeed
    0.19.8's own engine (``stack``) the gradients as its source copies them (advisor.parallel.zero_offload)."""
    opt, params, _ = codes(c)
    ga = np.asarray(c.grad_accum, dtype=float)
    down = np.where(opt, ga * HALF * shard_params, 0.0)
    up = np.where(params, ga * passes * HALF * shard_params, np.where(opt, HALF * shard_params, 0.0))
    ds = zero_offload.runs(stack, c.zero) & opt
    if ds.any():
        ds_down, ds_up = zero_offload.micro_batch_copies(c.zero, ga, grad_bytes, master)[3]
        down, up = np.where(ds, ds_down * shard_params, down), np.where(ds, up + ds_up * shard_params, up)
    return down, up


def cpu_step_time(w: Workload, shard_params: Any, ranks: Any) -> Any:
    """The CPU optimizer step on one GPU's partition, the node's CPU shared by its ranks (they step together)."""
    rate = w.hw.host.cpu_adam_params_per_s if w.hw.host is not None else np.inf
    if w.stack.engine.offload_optimizer == "torch":  # torch_fused steps at the vectorised rate, as cpu_adam
        rate = rate / TORCH_CPU_ADAM_SLOWDOWN
    return shard_params * ranks / rate


def time(w: Workload, c: Candidates, mesh: Mesh, states: ModelStates, on_gpu: ModelStates, pol: Mix,
         stalls: Any, layers: Any, fwd_window: Any, bwd_window: Any) -> OffloadTime:
    """Per step: the exposed PCIe copies, the CPU step, NVMe traffic, activation offload's copies (``stalls``: a
    micro-batch's, activation_stalls) (``on_gpu``: the states before offload, whose optimizer bytes the NVMe swaps)."""
    hw = w.hw
    zeros = np.zeros(np.shape(states.params))
    if hw.host is None:
        return OffloadTime(zeros, zeros, zeros, zeros)
    opt, params, nvme = codes(c)
    if not (opt.any() or params.any() or np.any(pol.offload)):  # nothing offloaded: every term below is 0
        return OffloadTime(zeros, zeros, zeros, zeros)
    ga = np.asarray(c.grad_accum, dtype=float)
    host, ranks = hw.host, ranks_per_node(hw, mesh)
    shard = shard_params(states, mesh)
    passes = 2.0 + pol.full  # forward, backward, and the checkpointed layers' recomputed forward
    master = zero_offload.master_bytes(w)
    down, up = pcie_bytes(c, shard, passes, w.stack, states.grad_bytes, master)
    pcie = host.pcie_bytes_per_s
    cpu = np.where(opt, cpu_step_time(w, shard, ranks), 0.0)
    ds = zero_offload.runs(w.stack, c.zero) & opt
    if ds.any():  # DeepSpeed's step: its Adam's bytes, the gradient's unscale and clip (advisor.parallel.zero_offload)
        cpu = np.where(ds, cpu * zero_offload.host_step_factor(c.zero, master, w.precision is Precision.fp16_mixed), cpu)
    if host.has_nvme:  # the states read and written around the step by every rank of the node, overlapped with it
        states_b = np.where(nvme, ranks * on_gpu.optimizer_states, 0.0)
        swap = states_b / (host.nvme_read_GBps * 1e9) + states_b / (host.nvme_write_GBps * 1e9)
        step = np.maximum(cpu, swap)
        # parameters read from NVMe for every gather pass, by every rank of the node
        nvme_params = np.where(params & nvme, ranks * passes * HALF * shard / (host.nvme_read_GBps * 1e9), 0.0)
    else:
        step, nvme_params = cpu, 0.0
    # as ZeRO's gathers (advisor.parallel.data.zero_exposed_per_micro_batch): the last layer's gradient copy and the
    # first layer's fetch have no compute to hide behind, the rest hides behind the pass up to its length
    units = np.maximum(np.asarray(layers, dtype=float), 1.0)
    grads_mb = np.where(opt, HALF * shard / pcie, 0.0)
    exposed_grads = ga * np.maximum(grads_mb - bwd_window, grads_mb / units)
    if ds.any():  # DeepSpeed's copies: ZeRO-1/2's block the host (advisor.parallel.zero_offload.exposed)
        exposed_grads = np.where(ds, zero_offload.exposed(c.zero, ga, states.grad_bytes, shard / pcie, bwd_window,
                                                          units, master), exposed_grads)
    fetch_mb = np.where(params, np.maximum(passes * HALF * shard / pcie, nvme_params), 0.0)
    exposed_fetch = ga * np.maximum(fetch_mb - (fwd_window + bwd_window), fetch_mb / units)
    upload = np.where(opt & ~params, HALF * shard / pcie, 0.0)
    acts = ga * stalls  # zero where nothing is offloaded (activation_stalls)
    if hybrid(w.stack):  # Megatron: the shard's gradients down once, at step time, in the main gradients' dtype
        down = np.where(opt, states.grad_bytes * shard, 0.0)
        exposed_grads = down / pcie
    return OffloadTime(down, up, step, exposed_grads + exposed_fetch + step + upload + acts)


def activation_stalls(w: Workload, pol: Mix, act_bytes_per_layer: Any, layers: Any, fwd_window: Any,
                      bwd_window: Any) -> tuple[Any, Any]:
    """(forward, backward) seconds per micro-batch activation offload adds to its pass (0 without it or a host side).
    The pass lasts them longer, so they are the data-parallel collectives' window too (advisor.step)."""
    if w.hw.host is None or not np.any(pol.offload):
        return 0.0, 0.0
    return tuple(np.where(pol.offload, x, 0.0) for x in activation_copies(
        w, pol, act_bytes_per_layer / w.hw.host.pcie_bytes_per_s, layers, fwd_window, bwd_window))


def activation_copies(w: Workload, pol: Mix, copy_s: Any, layers: Any, fwd_window: Any, bwd_window: Any) -> tuple[Any, Any]:
    """(forward, backward) seconds activation offload adds to a micro-batch's passes, ``copy_s`` one layer's copy each
    way: on the compute stream (save_on_cpu) every copy in full; on a side stream (``first_k``: Transformer Engine's CPU
    offload, advisor.recompute) the k copies run one after another, layer i's from the end of its forward and due by
    the end of layer L - k + i's, so with f a layer's forward the pass lasts at least f + k x copy and no more is
    exposed than f + k x copy - L f (the backward's reloads alike)."""
    n = np.asarray(layers, dtype=float)
    if w.stack.engine.activation_offload != "first_k":
        return copy_s * n, copy_s * n
    k = pol.offloaded * n
    return tuple(np.maximum(window / n + k * copy_s - window, 0.0) for window in (fwd_window, bwd_window))
