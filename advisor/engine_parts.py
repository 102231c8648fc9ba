"""Two sections of a stack's engine (advisor.engine): Transformer Engine's userbuffers, which pipeline the
sequence-parallel collectives with their GEMMs, and how the linears keep their inputs under a low-precision recipe."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from advisor.spec import Spec


class UserBuffers(Spec):
    """How Transformer Engine's userbuffers pipeline the sequence-parallel collectives with their GEMMs (Megatron
    --tp-comm-overlap), per the layer's GEMM passes. Defaults: TE 2.13 module/base.py initialize_ub, whose
    get_default_config gives ring_exchange (qkv/fc1 fprop all-gathers, proj/fc2 dgrad all-gathers: peer-to-peer copies
    in tp steps, 1 SM) one method, pipeline (proj/fc2 fprop reduce-scatters) 16 SMs and 4 splits with the GEMM launched
    on the other SMs (set_sm_margin), bulk (qkv/fc1 dgrad's input all-gather and wgrad's gradient reduce-scatter) 16
    SMs beside a GEMM launched on every SM (no margin)."""

    pipeline_sms: int = Field(default=16, ge=0, le=1024, description="SMs the pipelined reduce-scatter takes from its GEMM")
    pipeline_splits: int = Field(default=4, ge=1, le=1024, description="chunks the pipelined GEMM and reduce-scatter run in")
    bulk_sms: int = Field(default=16, ge=0, le=1024, description="SMs a bulk overlap's collective holds while it runs")
    source: str = "Transformer Engine 2.13 module/base.py initialize_ub (get_default_config)"


class QuantisedInputs(Spec):
    """How the stack's linears keep their inputs for the wgrad GEMM under every low-precision recipe: quantised (the
    recipe's ``stored_bytes``) instead of in half precision, except the sub-modules in ``original`` (advisor.model.layer
    module names: qkv, out, fc1, fc2), which keep the half-precision input another op saves anyway (0 bytes more),
    or, under the recipes in ``original_not_under``, a quantised copy beside it."""

    original: list[str] = Field(default_factory=list)
    original_not_under: list[str] = Field(default_factory=list)
    source: Optional[str] = None
