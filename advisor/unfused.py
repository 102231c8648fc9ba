"""What a stack runs outside the fused kernels its element-wise tables count (advisor.stack), as its profile's
``kernels`` describes it (the bytes those steps move and keep per token of one layer: advisor.unfused_bytes):

- ``routed_unfused``: a routed MLP's steps around its fused activation (GPT-OSS's clamp on the GLU input, the experts'
  output bias scaled by the router's probabilities: megatron-core's TEGroupedMLP without Transformer Engine's op fuser);
- ``rotary``: RoPE, where the tables were measured on a model without it (megatron-core's come from a GPT layer with
  learned positions): its fused kernel, or the unfused path a stack takes for YaRN (megatron-core's apply_rotary_pos_emb
  falls back to _apply_rotary_pos_emb_bshd on mscale != 1, models/common/embeddings/rope_utils.py; Megatron-LM's
  arguments.py and Megatron-Bridge's validate_rope_fusion_compatibility turn fusion off for any position embedding
  type but rope, so for --position-embedding-type yarn whatever its mscale).

Counts are Passes: elements moved per element of the tensor, in the activation dtype.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from advisor.engine import RecipeName
from advisor.spec import Spec


class Passes(Spec):
    """Elements one unfused element-wise step moves per element of its tensor, in the activation dtype: forward,
    backward, and kept for backward beyond what the stack's tables keep."""

    forward: float = Field(default=0.0, ge=0, le=100)
    backward: float = Field(default=0.0, ge=0, le=100)
    saved: float = Field(default=0.0, ge=0, le=100)


class RoutedUnfused(Spec):
    """What a routed MLP runs outside its fused kernels, where the model has it: the GLU input's clamp (per element of
    the k x d_ff_expert activation output; advisor.model Experts.act_clamp), and the experts' output bias scaled by
    the router's probabilities (per element of the k x d_model output; Experts.expert_bias). None of it under the
    low-precision recipes in ``fused_under``, whose expert MLP the stack runs through fused kernels."""

    clamp: Passes = Field(default_factory=Passes)
    expert_bias: Passes = Field(default_factory=Passes)
    expert_bias_fp32: Passes = Field(default_factory=Passes)  # the same where the probabilities come in fp32 (flex)
    fused_under: list[RecipeName] = Field(default_factory=list)
    source: Optional[str] = None


class Rotary(Spec):
    """RoPE where the stack's element-wise tables leave it out: ``plain`` the stack's kernel, per element of the q and
    k heads (a fused kernel writes the heads whole, their unrotated part copied); for a YaRN model (cos and sin carry
    its attention factor, and Megatron's yarn position embedding turns RoPE fusion off), ``scaled`` per rotated element
    and ``scaled_whole`` per element of the heads. All zero (the default): the tables hold it, measured on a RoPE
    model."""

    plain: Passes = Field(default_factory=Passes)
    scaled: Passes = Field(default_factory=Passes)
    scaled_whole: Passes = Field(default_factory=Passes)
    # the YaRN path's tensors of the rotated width kept per sequence position, not per head or per sample (the cos and
    # sin it makes anew for q and for k, each saved by its product's backward), in the activation dtype
    scaled_per_position: float = Field(default=0.0, ge=0, le=100)
    source: Optional[str] = None
