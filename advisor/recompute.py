"""Activation checkpointing policies: which layers of a stage keep what for backward, and what is rerun.

A policy (advisor.training.Recompute, with ``recompute_layers`` = k) is costed from two sources only: the bytes a
layer keeps come from the stack's profile (``memory.saved``: ``layer`` without checkpointing, ``full_recompute``
a checkpointed layer's input, ``selective`` under the stack's selective policy), the FLOPs and time rerun from the
layer table (advisor.compute, advisor.step.flops). Which policies a stack offers is data in its profile
(``engine.checkpointing``).

- none: every layer keeps everything.
- selective: the stack's selective policy (Megatron: the core attention, Korthikanti et al. 2022 s.4.3;
  torchtitan: per-op SAC, every second matmul).
- full, k: Megatron ``--recompute-method uniform --recompute-num-layers k`` (megatron/core/transformer/
  transformer_block.py ``_checkpointed_forward``): the input of each group of k layers is kept and the group is
  rerun whole in backward, so a stage keeps 1/k of the inputs and holds k layers' activations while one group is
  recomputed. k = 1 is every other stack's full checkpointing (one layer per checkpoint).
- block, k: ``--recompute-method block --recompute-num-layers k``: the first k layers of each stage chunk (each
  virtual stage) are checkpointed one by one, the rest keep everything (the same file: ``layer_number <
  recompute_num_layers``).
- every-k, k: every k-th layer checkpointed, the rest kept (torchtitan mid-2024 ``selective_ac_option = "k"``:
  ``ptd_checkpoint_wrapper._count % ac_freq == 0``, activation_checkpoint.py at b5bcd76; llm-foundry's
  ``activation_checkpointing_target`` with an id list; Hugging Face's ``every_n_layers``): floor(L / k) of L layers.
- offload: every tensor a layer saves is copied to host memory in forward and back in backward
  (torch.autograd.graph.save_on_cpu(pin_memory=True), Hugging Face's ``offload``): nothing is rerun, the GPU keeps
  the layer being computed; the copies are issued on the compute stream (``tensor.to(device, non_blocking=True)``
  in pack/unpack), so they serialise with the layer's kernels: their PCIe time is charged in full
  (advisor/parallel/offload.py). Its host bytes count against host memory. Where the stack offloads the first k
  layers on a side stream (``engine.activation_offload: first_k``, Transformer Engine 2.13 pytorch/cpu_offload.py
  under Megatron's ``--cpu-offloading-num-layers k``), k = recompute_layers of the L layers, at most L - 1: layer i's
  copy must end before layer L - k + i's forward does and its reload starts after layer L - 1 - k + i's backward, so
  the GPU keeps (L - k) layers' activations and a copy hides behind the layers between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.training import Recompute

POLICIES = tuple(r.value for r in Recompute)

# the k the search proposes for the policies that take one: full one layer per checkpoint, Megatron's block method
# with half of each chunk's layers checkpointed (advisor.search sets it per plan), torchtitan's "2" (every second
# block, the option its mid-2024 docs benchmark as "selective layer")
SEARCH_K = {Recompute.full: 1, Recompute.block: 1, Recompute.every_k: 2}


def selected(parts: dict[str, Any], ops: tuple[str, ...], layer: Any) -> Any:
    """The sum of ``parts`` (per op name: time, FLOPs or host time of the layer's linears by name, the attention core,
    the element-wise ops) over the ops a selective policy reruns; "attention/k" is the key projection's share of the
    fused attention/qkv linear (kv_dim of q_dim + 2 kv_dim), where the stack's blocks run wq, wk and wv apart."""
    total = 0.0
    for op in ops:
        if op == "attention/k":
            total = total + parts.get("attention/qkv", 0.0) * layer.kv_dim / layer.qkv_dim
        else:
            total = total + parts[op]
    return total


@dataclass(frozen=True)
class Mix:
    """Per plan: the fraction of a stage's layers checkpointed whole, the checkpoint group size (layers rerun at
    once), whether the stack's selective policy runs and whether activations go to host memory."""

    full: Any  # fraction of the stage's layers fully recomputed (0..1)
    group: Any  # layers per checkpoint (full uniform k; 1 otherwise)
    selective: Any  # bool
    offload: Any  # bool
    offloaded: Any = 0.0  # under offload, the fraction of the stage's layers whose activations go to host memory


def mix(recompute: Any, k: Any, layers: Any, v: Any, n_layers: int, first_k: bool = False) -> Mix:
    """The policy of each plan as fractions of its stage's ``layers`` (``v`` virtual stages per rank); ``first_k``: the
    stack offloads the first k layers (module docstring), else every layer."""
    rc, k = np.asarray(recompute), np.maximum(np.asarray(k, dtype=float), 1.0)
    layers = np.maximum(np.asarray(layers, dtype=float), 1.0)
    shape = np.broadcast_shapes(rc.shape, k.shape, layers.shape, np.shape(v))
    is_full = rc == Recompute.full.code
    full = np.array(np.broadcast_to(np.where(is_full, 1.0, 0.0), shape))
    # the block and every-k shares are computed only where some plan takes them: a search costs a million plans a
    # second, and most of them run neither
    block = np.broadcast_to(rc == Recompute.block.code, shape)
    if block.any():
        chunk = np.maximum(layers / np.asarray(v, dtype=float), 1.0)
        full[block] = np.broadcast_to(np.minimum(k, chunk) / chunk, shape)[block]
    every = np.broadcast_to(rc == Recompute.every_k.code, shape)
    if every.any():
        full[every] = np.broadcast_to(np.floor(n_layers / k) / n_layers, shape)[every]
    group = np.where(is_full, np.minimum(k, layers), 1.0) if np.any(k > 1.0) else np.ones(shape)
    offload = rc == Recompute.offload.code
    offloaded = np.where(offload, np.minimum(k, np.maximum(layers - 1.0, 0.0)) / layers if first_k else 1.0, 0.0)
    return Mix(full=full, group=group, selective=rc == Recompute.selective.code, offload=offload, offloaded=offloaded)


def kept_per_token(m: Mix, full: Any, checkpointed: Any, selective: Any) -> Any:
    """Bytes one layer keeps per token on average over the stage: ``full`` without checkpointing, ``checkpointed``
    (its input) for a checkpointed layer, shared by the ``group`` layers of a checkpoint, ``selective`` under the
    stack's selective policy, under activation offload what the layers not offloaded keep."""
    ckpt = m.full * checkpointed / m.group + (1.0 - m.full) * full
    return np.where(m.offload, (1.0 - m.offloaded) * full, np.where(m.selective, selective, ckpt))


def rerun(m: Mix, layer_forward: Any, selective: Any) -> Any:
    """What one layer reruns on average (seconds, FLOPs, host time...): the forward of its checkpointed share,
    the stack's selective ops under the selective policy."""
    return m.full * layer_forward + np.where(m.selective, selective, 0.0)


def as_mix(recompute: Any, n_layers: int) -> Mix:
    """``recompute`` as a Mix: itself, or codes with k = 1 over one layer (the per-layer view of tests)."""
    return recompute if isinstance(recompute, Mix) else mix(recompute, 1, 1, 1, n_layers)
