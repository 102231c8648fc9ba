"""torchao's float8 all-gather under FSDP2, as torchtitan 0.2.2 turns it on ([quantize.linear.float8]
enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp; the stack engine's ``fsdp_float8_gather``).

Sources (torchao 0.18.0, torch 2.13, torchtitan 0.2.2):
- torchao float8/fsdp_utils.py:228-251 WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather casts the rank's shard
  to float8 and FSDP all-gathers those bytes; fsdp_post_all_gather (:253-283) wraps the gathered bytes in a
  Float8TrainingTensor: the unit is held in float8, with no bf16 copy beside it;
- without a precomputed scale, pre_all_gather calls hp_tensor_to_float8_dynamic(reduce_amax=True) (:243-250), which
  all-reduces each weight's amax (MAX over the FSDP mesh: float8/float8_utils.py:74-78) before its gather, on the
  copy-in stream the gather waits for (torch fsdp/_fully_shard/_fsdp_collectives.py:336-362 foreach_all_gather);
- precompute_float8_dynamic_scale_for_fsdp (fsdp_utils.py:28-85, torchtitan's post_optimizer_hook, float8.py:162-173):
  after the optimizer step, the amaxes of every float8 weight stacked into one tensor and all-reduced once;
- only under tensorwise scaling: Float8LinearConfig asserts it (float8/config.py:271-273), and torchtitan 0.2.2 only
  without a recipe_name (float8.py:64-67 asserts the two apart; float8.py:87-89 turns it on where dp_shard > 1).
  torchtitan 0.3.0's Float8LinearConverter has neither option (rowwise recipes only).

Modelled: the layers' weights gathered (and held gathered) at the recipe's element bytes, 1, not bf16's 2; the root
unit (embedding, final norm, the LM head, which the exports filter: "output") stays bf16. The layers' norms are not
Linear and gather in bf16, but are counted at 1 byte with the rest (2 x 4,096 of Llama 3 8B's 218,112,000 a layer).
Left out: the cast moving from the gathered weight per use to the shard before the gather (advisor.compute still
casts per use), and the gathered scale (4 bytes a tensor, passed as metadata).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor import comm
from advisor.comm import Collective

# torchao float8/config.py:271-273: "enable_fsdp_float8_all_gather only supports tensorwise scaling granularity"
GATHER_RECIPES = ("fp8-tensorwise",)
# one float32 amax per weight: torch._foreach_norm over the fp32 shards, stacked (fsdp_utils.py:70-71)
AMAX_BYTES = 4.0


def on(w: Any) -> bool:
    """Whether the run's FSDP gathers carry float8 weights: the stack turns it on and the recipe is tensorwise."""
    r = w.precision.recipe
    return w.stack.engine.fsdp_float8_gather != "off" and r is not None and r.name in GATHER_RECIPES


def layer_gather_bytes(w: Any, weight_bytes: Any) -> Any:
    """Bytes a layer parameter moves in FSDP's all-gather and takes while gathered."""
    return w.precision.recipe.element_bytes if on(w) else weight_bytes


def linears_per_layer(layer: Any) -> int:
    """The Float8Linear modules of one layer: each linear of the layer table, a fused qkv as the three torchtitan runs
    (models/llama3/model/model.py Attention: wq, wk, wv apart, in 0.1.0-0.2.2)."""
    return sum(3 if lin.module == "qkv" else 1 for lin in layer.linears if lin.copies == 1)


def amax_per_gather_s(w: Any, mesh: Any, units: Any, where: Any) -> Any:
    """Seconds one pass of FSDP gathers over ``units`` layers adds with per_gather amaxes: one all-reduce of a
    float32 per weight, before that weight's gather (latency-bound: the collective's start-up, comm.collective_time)."""
    if not on(w) or w.stack.engine.fsdp_float8_gather != "per_gather":
        return 0.0
    each = comm.collective_time(Collective.all_reduce, mesh.dp_shard, AMAX_BYTES, w.hw, mesh.shard_per_node, where=where)
    return np.maximum(units, 1.0) * linears_per_layer(w.layer) * each


def amax_precompute_s(w: Any, mesh: Any, layers: Any, where: Any) -> Any:
    """Seconds a step adds with precomputed scales: one all-reduce of every float8 weight's amax after the optimizer
    step, exposed (the next forward's first gather casts with its scales)."""
    if not on(w) or w.stack.engine.fsdp_float8_gather != "precomputed":
        return 0.0
    size = np.maximum(layers, 1.0) * linears_per_layer(w.layer) * AMAX_BYTES
    return comm.collective_time(Collective.all_reduce, mesh.dp_shard, size, w.hw, mesh.shard_per_node, where=where)
