"""What the busiest GPU keeps of the model: parameters, gradients, optimizer states and the copies and buffers beside
them, per parameter and in bytes (advisor.parallel.data model_states builds it; offload, ZeRO's engines, FSDP2 and the
fine-tuning adapters rewrite it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.comm import Collective


@dataclass(frozen=True)
class ModelStates:
    """The busiest GPU's model states: parameters it computes with, and bytes it keeps of each state."""

    params: Any  # parameters of the busiest stage on one TP rank (unsharded by data parallelism)
    params_outside_layers: Any  # of those, outside the layers (embedding, LM head, final norm)
    master: Any  # fp32 master weights beside half-precision weights and gradients
    weight_bytes: Any  # per parameter
    grad_bytes: Any
    reduce_bytes: Any  # per parameter, as the gradient collectives move them
    weights: Any  # bytes kept, sharded as the ZeRO stage says
    grads: Any
    optimizer_states: Any
    gathered: Any  # ZeRO-3: the units gathered at once (current and prefetched)
    grad_buffer: Any  # ZeRO-2/3: the unit's unsharded gradient being reduce-scattered (and its fp32 copy)
    bucket_copy: Any  # DDP's flat gradient buckets beside .grad
    autocast_copy: Any  # autocast's half-precision copy of every weight, kept from forward to backward
    step_temporaries: Any  # the optimizer step's temporaries
    head_grads: Any  # the V x h table's gradient (the last one a recomputed backward frees)
    grads_persist: Any  # gradients alive through forward and backward
    grad_params: Any = None  # parameters with gradients and optimizer states: all (None) or the adapters (LoRA)
    expert_params: Any = 0.0  # of ``params``, the local routed experts' (advisor.parallel.expert): reduced over edp
    stepped_params: Any = None  # parameters whose optimizer states this GPU keeps and steps (params / dp_shard dense)
    gather_bytes: Any = None  # per parameter, as ZeRO-2/3 (FSDP) gathers them (advisor.parallel.fp8_gather); None: weight_bytes

    @property
    def trained(self) -> Any:
        return self.params if self.grad_params is None else self.grad_params

    @property
    def dp_params(self) -> Any:
        """Parameters whose gradients the data-parallel group reduces: the trained ones (the adapters under LoRA), all
        but the routed experts (reduced over the expert data-parallel group)."""
        return self.trained - self.expert_params

    def zero_payloads(self, zero: Any) -> tuple[tuple[Collective, Any, Any], ...]:
        """(collective, bytes a parameter, parameters) of ZeRO's reduce-scatter of the ``dp_params``' gradients and its
        all-gather of every weight held under ZeRO-2/3 (a frozen base too; the routed experts apart), the updated ones under ZeRO-1."""
        gather, gb = np.where(zero >= 2, self.params - self.expert_params, self.dp_params), self.gather_bytes
        ag_bytes = self.weight_bytes if gb is None else np.where(zero >= 2, gb, self.weight_bytes)
        return ((Collective.reduce_scatter, self.reduce_bytes, self.dp_params), (Collective.all_gather, ag_bytes, gather))
