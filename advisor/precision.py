"""Low-precision training recipes as the stacks run them: which GEMMs run in FP8/FP4, how tensors are scaled, what
the quantisation kernels move and what stays in BF16 (issue 21).

A recipe is data (``RECIPES``), each field cited from the stack's own code:
- Transformer Engine 2.20.2, transformer_engine/common/recipe/__init__.py (DelayedScaling, Float8CurrentScaling,
  Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling);
- torchao 0.18.0, torchao/float8/config.py (Float8LinearConfig.from_recipe_name: tensorwise, rowwise,
  rowwise_with_gw_hp) and torchao/prototype/mx_formats/config.py (MX block size 32);
- megatron-core 0.16.1, transformer/transformer_config.py (``fp8_recipe``: tensorwise, delayed, mxfp8, blockwise;
  ``fp4_recipe``: nvfp4; ``first_last_layers_bf16``, ``num_layers_at_start_in_bf16`` / ``_at_end_``: 1 each) and
  fp8_utils.py / fp4_utils.py (get_fp8_context / get_fp4_context: those layers run outside the FP8/FP4 autocast);
- torchtitan 0.3.0, components/quantization/utils.py (module_filter_fn: only Linear modules with both dimensions
  multiples of 16, minus ``filter_fqns``; llama3's config_registry filters ``lm_head``).

Every stack leaves the attention core (softmax(QK^T)V) in BF16 by default: TE's ``fp8_dpa`` / ``fp8_mha`` default to
False in every recipe (NVFP4BlockScaling: "Not applying quantization to attention for now"), and torchao converts
nn.Linear only; --fp8-attention runs it in FP8 where the stack and GPU do (FP8_ATTENTION). The output layer (LM head) stays in BF16: Megatron's GPTModel builds it as a
tensor_parallel.ColumnParallelLinear outside the transformer block's FP8 context, torchtitan filters ``lm_head``.

Quantisation (cast) kernels are memory-bound: ``quantise_bytes`` is what one tensor's quantisation reads and
writes per element in training, both orientations (the GEMM-ready copy and the transposed / column-wise copy the
backward GEMMs read), counted from the kernels the recipe runs; ``gemm_quantise_bytes`` is one operand in one
orientation, as a per-GEMM benchmark quantises it (Transformer Engine's benchmarks/gemm/benchmark_gemm.py
"autocast" mode, lowprec_runs.yaml's te-gemm-* rows).

Saved inputs: only NVFP4 keeps its linears' inputs quantised for backward here. The FP8 recipes are costed as
keeping BF16 inputs, as torchao's measured runs show (reference/lowprec_runs.yaml: tensorwise, rowwise and MXFP8 on
H100 and B200 hold the BF16 run's peak within 0.5%); Transformer Engine's own FP8 input caching is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from advisor.errors import AdvisorError

PASSES = ("fprop", "dgrad", "wgrad")


class RecipeError(AdvisorError):
    """A recipe name nobody knows, or a GPU that cannot run it."""


@dataclass(frozen=True)
class Recipe:
    name: str  # the --precision value
    format: str  # the GEMM's math key in a GPU's peak_tflops: fp8 or fp4
    low: tuple[str, ...]  # the GEMMs (fprop, dgrad, wgrad) that run in the low format; the rest in BF16
    granularity: str  # how tensors are scaled
    block: int  # elements sharing one scale along the reduction dimension (0: one scale per tensor or row)
    scale_bytes: float  # bytes of one scale factor
    element_bytes: float  # bytes of one quantised element
    quantise_bytes: float  # training: bytes read + written per element quantising one tensor, both orientations
    gemm_quantise_bytes: float  # a per-GEMM benchmark: one operand, one orientation
    needs_block_scaling: bool  # the GEMM applies per-block scales in the tensor core (Blackwell, sm_100+)
    bf16_edge_layers: int  # decoder layers at the start and at the end the stack keeps in BF16 (each side)
    saves_quantised_inputs: bool  # backward's wgrad reads the quantised input kept from forward, not a BF16 copy
    aliases: tuple[str, ...]
    source: str

    @property
    def scale_overhead(self) -> float:
        """Scale bytes per quantised element (a block's scale shared by ``block`` elements)."""
        return self.scale_bytes / self.block if self.block else 0.0

    @property
    def stored_bytes(self) -> float:
        """Bytes per element of a quantised copy with its scales."""
        return self.element_bytes + self.scale_overhead

    def runs_low(self, gemm: str) -> bool:
        return gemm in self.low


# Bytes of the quantisation kernels, per element (BF16 input: 2 bytes read per pass):
# - per-tensor current scaling: an amax reduction reads the tensor (2), then the cast reads it again (2) and writes
#   the FP8 copy (1) and its transpose (1: Hopper's FP8 GEMM takes only the TN layout, TE's Float8Quantizer writes
#   both usages in one kernel): 6; a per-GEMM benchmark writes one orientation: 5.
# - delayed scaling: the scale is last steps' amax history (DelayedScaling.amax_history_len), so one kernel casts
#   and records amax: read 2, write 1 + 1: 4; per GEMM 3.
# - row-wise (torchao AXISWISE): the row-wise copy for fprop and a column-wise copy for wgrad are each their own
#   amax + cast (dim0 and dim1 scaling, float8/float8_linear.py), read 2 + 2, write 1, twice: 10; per GEMM 5.
# - 1x128 / 128x128 blocks (Float8BlockScaling), MXFP8 (blocks of 32): one fused kernel reads the tensor once and
#   writes both orientations, each with its scales (TE docstrings: "both versions are computed from the high
#   precision input"): 2 + 2 x (1 + scales); per GEMM 2 + 1 + scales.
# - NVFP4: a global amax pass for the FP32 tensor scale (read 2), then one kernel writes both orientations of 0.5
#   byte elements and E4M3 scales per 16 (the column-wise one through the 16x16 random Hadamard transform): 2 + 2 +
#   2 x (0.5 + 1/16); per GEMM 2 + 2 + 0.5625.
_MX_Q = 2.0 + 2.0 * (1.0 + 1.0 / 32)
_BLOCK_Q = 2.0 + 2.0 * (1.0 + 4.0 / 128)
_FP4_Q = 4.0 + 2.0 * (0.5 + 1.0 / 16)

_FP8 = dict(format="fp8", low=PASSES, element_bytes=1.0, bf16_edge_layers=0, saves_quantised_inputs=False)
RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe(name="fp8-tensorwise", **_FP8, granularity="per tensor, scale from the current amax", block=0,
           scale_bytes=4.0, quantise_bytes=6.0, gemm_quantise_bytes=5.0, needs_block_scaling=False,
           aliases=("fp8-current", "tensorwise", "current", "float8currentscaling"),
           source="TE Float8CurrentScaling (HYBRID: E4M3 forward, E5M2 gradients); torchao Float8LinearConfig() "
                  "TENSORWISE (all three GEMMs in float8); Megatron --fp8-recipe tensorwise"),
    Recipe(name="fp8-delayed", **_FP8, granularity="per tensor, scale from the amax history", block=0,
           scale_bytes=4.0, quantise_bytes=4.0, gemm_quantise_bytes=3.0, needs_block_scaling=False,
           aliases=("delayed", "delayedscaling"),
           source="TE DelayedScaling (amax_history_len 1024, HYBRID); Megatron --fp8-recipe delayed (its default)"),
    Recipe(name="fp8-rowwise", **_FP8, granularity="per row (axiswise), power-of-2 scales", block=0,
           scale_bytes=4.0, quantise_bytes=10.0, gemm_quantise_bytes=5.0, needs_block_scaling=False,
           aliases=("rowwise",),
           source="torchao Float8LinearConfig.from_recipe_name('rowwise'): AXISWISE e4m3 input, weight and "
                  "grad_output, round_scales_to_power_of_2; the CUTLASS row-wise kernel"),
    Recipe(name="fp8-rowwise-gw-hp", **{**_FP8, "low": ("fprop", "dgrad")}, granularity="per row; wgrad in BF16",
           block=0, scale_bytes=4.0, quantise_bytes=7.0, gemm_quantise_bytes=5.0, needs_block_scaling=False,
           aliases=("rowwise_with_gw_hp", "rowwise-gw-hp"),
           source="torchao ROWWISE_WITH_GW_HP: cast_config_input_for_grad_weight and grad_output_for_grad_weight "
                  "ScalingType.DISABLED, so grad_weight runs in high precision; one column-wise cast fewer (7)"),
    Recipe(name="fp8-blockwise", **_FP8, granularity="1x128 activations and gradients, 128x128 weights (DeepSeek-V3)",
           block=128, scale_bytes=4.0, quantise_bytes=_BLOCK_Q, gemm_quantise_bytes=3.0 + 4.0 / 128,
           needs_block_scaling=False, aliases=("blockwise", "float8blockscaling"),
           source="TE Float8BlockScaling: x_block_scaling_dim 1, w_block_scaling_dim 2, grad_block_scaling_dim 1, "
                  "FP32 (power-of-2) scales; Megatron --fp8-recipe blockwise"),
    Recipe(name="mxfp8", **_FP8, granularity="blocks of 32 along the reduction dimension, E8M0 scales", block=32,
           scale_bytes=1.0, quantise_bytes=_MX_Q, gemm_quantise_bytes=3.0 + 1.0 / 32, needs_block_scaling=True,
           aliases=("mxfp8blockscaling", "mxfp8_cublas", "mxfp8_rceil", "mxfp8-cublas"),
           source="TE MXFP8BlockScaling (E4M3, 32 consecutive values per E8M0 scale); torchao MXLinearConfig "
                  "block_size 32; Megatron --fp8-recipe mxfp8"),
    Recipe(name="nvfp4", format="fp4", low=PASSES,
           granularity="blocks of 16 with E4M3 scales and an FP32 tensor scale; 16x16 weight blocks", block=16,
           scale_bytes=1.0, element_bytes=0.5, quantise_bytes=_FP4_Q, gemm_quantise_bytes=4.0 + 0.5 + 1.0 / 16,
           needs_block_scaling=True, bf16_edge_layers=1, saves_quantised_inputs=True, aliases=("nvfp4blockscaling",),
           source="TE NVFP4BlockScaling (E2M1; 2D 16x16 weight scaling, RHT on input/grad column-wise, stochastic "
                  "rounding of gradients); Megatron --fp4-recipe nvfp4 with first_last_layers_bf16 (1 layer at each "
                  "end, transformer_config.py), as NVIDIA's NVFP4 recipe keeps the last layers in BF16 (arXiv "
                  "2509.25149); wgrad reads the column-wise NVFP4 input kept from forward, not a BF16 copy"),
]}

# The precisions that are not recipes, under the names users type
PLAIN_ALIASES = {"fp16": "fp16-mixed"}


def canonical(name: str) -> str:
    """The --precision value a stack's own recipe name means ("Float8CurrentScaling" -> "fp8-tensorwise");
    names advisor already knows pass through."""
    key = name.strip()
    low = key.lower()
    if low in PLAIN_ALIASES:
        return PLAIN_ALIASES[low]
    for r in RECIPES.values():
        if low == r.name or low in r.aliases:
            return r.name
    return key


def recipe(name: str) -> Optional[Recipe]:
    """The recipe a --precision value names; None for bf16/fp16/fp32 and the legacy fp8-mixed."""
    return RECIPES.get(name)


def check_gpu(r: Recipe, gpu_name: str, peaks: dict, block_scaling: bool) -> Optional[str]:
    """Why a GPU cannot run a recipe (one line), or None."""
    if r.format not in peaks:
        # the profile's word, not the GPU's: an Ada GPU (sm_89) has FP8 tensor cores its profile may not rate
        has = "Hopper and Ada (sm_89+)" if r.format == "fp8" else "Blackwell (sm_100+)"
        return (f"--precision {r.name}: the {gpu_name} profile gives no {r.format} peak (gpu.peak_tflops.{r.format}; "
                f"{r.format.upper()} tensor cores are on {has}: where this GPU has them, a profile with its datasheet's "
                f"dense {r.format} rate there runs it)")
    if r.needs_block_scaling and not block_scaling:
        return (f"--precision {r.name}: the {gpu_name} has no block-scaled tensor cores ({r.granularity}: Blackwell, "
                "sm_100+, needed); on Hopper or Ada use fp8-tensorwise, fp8-delayed, fp8-rowwise or fp8-blockwise")
    return None


# FP8 attention (Megatron --fp8-dot-product-attention: TransformerConfig.fp8_dot_product_attention, passed to TE as the
# recipe's fp8_dpa, megatron-core 0.19 fp8_utils.py:741,749 and extensions/transformer_engine.py:3239): the recipes
# whose attention Transformer Engine 2.20.2 runs in FP8, on the GPUs its backend selection keeps cuDNN's FP8 fused
# attention for (attention/dot_product_attention/utils.py), fused only (the unfused path "Disabling
# UnfusedDotProductAttention for FP8 attention"): delayed scaling wherever the recipe runs; current
# scaling "Disabling FusedAttention for FP8 current scaling on arch < sm100" (:759); MXFP8 "on arch < sm100" (:776);
# Float8BlockScaling and NVFP4 never (:792). TE 2.14 refuses MXFP8 attention outright ("DotProductAttention does not
# support MXFP8BlockScaling recipe", dot_product_attention.py:676-680). Recipe -> whether it needs Blackwell.
FP8_ATTENTION = {"fp8-delayed": False, "fp8-tensorwise": True, "mxfp8": True}


def fp8_attention_refusal(r: Optional[Recipe], asked: str, held: list, stack: str) -> Optional[str]:
    """Why --fp8-attention cannot run on any GPU (one line): no FP8 recipe, a stack or recipe without FP8 attention;
    None where it runs on some (the GPU's own refusals: fp8_attention_choice)."""
    if r is None or r.format != "fp8":
        return (f"--fp8-attention runs the attention core under an FP8 recipe, not {asked}: "
                f"add --precision {held[0] if held else 'fp8-delayed'} or drop --fp8-attention")
    name = r.name
    if not held:
        return f"--fp8-attention: stack {stack} runs no FP8 attention (its profile's engine.fp8_attention): drop it"
    if name not in held:
        return (f"--fp8-attention: stack {stack} runs FP8 attention under {', '.join(held) or 'no recipe'} only (its "
                f"profile's engine.fp8_attention), not {name}: drop --fp8-attention or use another --precision or --stack")
    if FP8_ATTENTION.get(name) is None:
        return f"--fp8-attention: Transformer Engine runs no FP8 attention under {name}: drop --fp8-attention"
    return None


def blackwell_only_attention(model) -> Optional[str]:
    """What of the model's attention Transformer Engine 2.20.2 runs in FP8 on Blackwell (sm_100+) only, under every
    recipe (None: nothing). FP8 training leaves FusedAttention alone: FlashAttention 2 and 3 are off for FP8 training
    (attention/dot_product_attention/utils.py:722-731) and UnfusedDotProductAttention for FP8 attention (:738-745);
    FusedAttention is then turned off "for softmax_type = learnable in FP8 on sm < 100 with cuDNN version < 9.21"
    (:1225-1234; GPT-OSS's sinks, megatron-core's softmax_type learnable) and "as it does not support sliding window
    attention for FP8 on sm < 100 with cuDNN version < 9.21" (:1443-1453; megatron-core 0.19.2 passes window_size to
    every windowed layer whatever the sequence, extensions/transformer_engine.py:1892-1900, and softmax_type, :1918),
    which leaves no backend: "No dot product attention backend is available" (dot_product_attention.py:2900)."""
    what = [name for name, has in (("attention sinks", model.attention_sinks),
                                   ("sliding-window layers", any(r.window for r in model.layer_runs))) if has]
    return " and ".join(what) or None


def fp8_attention_choice(stack, setup, hw=None, model=None) -> bool:
    """Whether the setup runs FP8 attention (setup.fp8_attention), a RecipeError where the stack, the recipe, the
    GPU (``hw``, when given) or, on that GPU, the model's attention (``model``, when given) cannot run it."""
    if not setup.fp8_attention:
        return setup.fp8_attention
    if setup.attention.value != "sdpa":
        raise RecipeError(f"--fp8-attention runs in the fused attention kernel: use --attention sdpa, not {setup.attention.value}")
    r = setup.precision.recipe
    if why := fp8_attention_refusal(r, setup.precision.value, stack.engine.fp8_attention, stack.name):
        raise RecipeError(why)
    if hw is None or hw.gpu.block_scaling:
        return setup.fp8_attention
    if model is not None and (what := blackwell_only_attention(model)):
        raise RecipeError(f"--fp8-attention: Transformer Engine runs {model.name}'s {what} in FP8 on Blackwell (sm_100+) "
                          f"only, not the {hw.gpu.name}: drop --fp8-attention")
    if FP8_ATTENTION[r.name]:
        raise RecipeError(f"--fp8-attention: cuDNN's FP8 attention under {r.name} needs Blackwell (sm_100+), not the "
                          f"{hw.gpu.name}: use --precision fp8-delayed or drop --fp8-attention")
    return setup.fp8_attention


# FP8 attention's share of the FP8 peak over BF16 attention's share of the BF16 peak: FlashAttention-3 on H100 (Shah et
# al. 2024, arXiv 2407.08608, abstract) reaches 740 TFLOP/s in BF16, 75% of 989, and close to 1.2 PFLOP/s in FP8, 61%
# of 1,979: 0.81. Applied to Transformer Engine's cuDNN FP8 attention on any GPU (an assumption: no FP8 attention
# kernel is measured here; where one is, `advisor calibrate` fits the BF16 kernel and this ratio carries it over)
FP8_ATTENTION_EFFICIENCY = (1200.0 / 1978.9) / (740.0 / 989.4)


def fp8_attention_bytes(w, tokens, tp) -> tuple:
    """(forward, backward) bytes of FP8 attention's quantisation kernels (``w`` an advisor.workload.Workload): Q, K
    and V in forward, the output gradient dO in backward, each at the recipe's bytes per element, both orientations
    (Transformer Engine 2.20.2 FusedAttention's docstring, backends.py:2300-2308: MXFP8 quantises Q/K row+col, V, dO
    row+col; O and dQ/dK/dV stay F16)."""
    layer, r = w.layer, w.precision.recipe
    q = w.stack.engine.quantise_bytes.get(r.name, r.quantise_bytes)
    return q * (tokens * layer.qkv_dim / tp), q * tokens * layer.n_heads * layer.v_head / tp


# What FP8 attention keeps for its backward, per quantised Q, K or V element: Transformer Engine 2.20.2 FusedAttnFunc
# (attention/dot_product_attention/backends.py:1762-1767, the backward in FP8 by NVTE_FP8_DPA_BWD's default 1, :1625)
# saves q_fp8, k_fp8, v_fp8 in place of the BF16 q, k, v; get_attention_quantizers gives the QKV quantizer the rowwise
# usage only (utils.py:3044), and under MXFP8 the columnwise one too (:3070-3071), which combine_and_quantize narrows
# for neither where the tensors serve forward and backward alike (utils.py:3409-3422; backends.py:1664
# used_in_backward=is_training): both orientations, each with its E8M0 scales (the recipe's stored_bytes)
FP8_ATTENTION_ORIENTATIONS = {"fp8-delayed": 1.0, "fp8-tensorwise": 1.0, "mxfp8": 2.0}
# The output: current scaling (NVTE_DPA_FP8CS_O_in_F16's default 1, backends.py:234) and MXFP8 keep O in BF16
# (backends.py:1763-1765), the storage linear_proj keeps anyway (megatron-core 0.19.2 attention.py:428-443
# set_save_original_input): no change; delayed scaling keeps its FP8 copy (:1766-1767) and returns a dequantised BF16
# one (:1737-1739) that linear_proj quantises for itself (its FP8 input copy, advisor.memory quantised_inputs_saving):
# the BF16 O is no longer kept
FP8_ATTENTION_O_QUANTISED = ("fp8-delayed",)


def fp8_attention_saved(w, tp):
    """Bytes per token one layer's attention core keeps under --fp8-attention beyond what BF16 attention keeps (the
    stack's memory.saved: q, k, v and the output at the activation dtype), on one TP rank (``w`` an
    advisor.workload.Workload; 0 without FP8 attention): Q, K and V quantised (FP8_ATTENTION_ORIENTATIONS), the BF16
    ones let go (megatron-core's RoPE kernels save only cos and sin, fusions/fused_mla_yarn_rope_apply.py:273,661; the
    linears their inputs), and the output quantised under delayed scaling (FP8_ATTENTION_O_QUANTISED). Under MXFP8
    the two orientations with their scales outweigh BF16: 2 x (1 + 1/32) = 2.0625 bytes an element, not 2. Spread
    over the layers the recipe runs low, as the compute is (advisor.compute attention_core_time)."""
    r = w.precision.recipe
    if not w.fp8_attention or r is None or r.name not in FP8_ATTENTION_ORIENTATIONS:
        return 0.0
    layer = w.layer
    # a rank's q heads and its whole KV heads (min(tp, kv heads): megatron-core attention.py:353-367)
    tp = np.asarray(tp, dtype=float)
    qkv = layer.n_heads * layer.d_head / tp + layer.kv_heads * (layer.d_head + layer.v_head) / np.minimum(tp, layer.kv_heads)
    out = layer.n_heads * layer.v_head / tp if r.name in FP8_ATTENTION_O_QUANTISED else 0.0
    per_element = FP8_ATTENTION_ORIENTATIONS[r.name] * r.stored_bytes - w.act_bytes
    return (1.0 - w.bf16_share) * (qkv * per_element + out * (r.stored_bytes - w.act_bytes))
