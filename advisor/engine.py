"""A training stack's engine, read from its profile (advisor.stack): how it holds, reduces and gathers model
states, when it synchronises, which checkpointing policies, offloads and plan features it runs."""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional

from pydantic import Field

from advisor.engine_parts import QuantisedInputs, UserBuffers  # noqa: F401 (the engine's parts; read from here too)
from advisor.selective import Selective
from advisor.spec import Spec
from advisor.zero_engine import Zero3Calls, ZeroBuffers

# advisor's low-precision recipes by --precision name (advisor.precision)
RecipeName = Literal["fp8-tensorwise", "fp8-delayed", "fp8-rowwise", "fp8-rowwise-gw-hp", "fp8-blockwise", "mxfp8", "nvfp4"]
PLAN_FEATURES = ("ddp", "dataparallel", "zero1", "zero2", "zero3", "hsdp", "tp", "sp", "pp", "gpipe", "interleaved", "ep")
# what a profile that does not say ``offers`` runs: every feature but expert parallelism, which a stack must name
# (Hugging Face's Trainer has none; advisor.parallel.expert)
DEFAULT_OFFERS = tuple(f for f in PLAN_FEATURES if f != "ep")
CHECKPOINTING = ("none", "selective", "full", "block", "every-k", "offload")  # advisor.training.Recompute values
OFFLOADS = ("optimizer-cpu", "optimizer-nvme", "params-cpu", "params-nvme")  # advisor.layout.Offload values
METHODS = ("full", "lora", "qlora")  # advisor.finetune.FineTune.kind: every weight; adapters on a half / quantised base


class Engine(Spec):
    """How the training engine holds, reduces and gathers model states, and when it synchronises."""

    master_weights: Literal["always", "with_zero", "with_shards", "never"] = Field(description="fp32 masters beside "
        "half weights and gradients: always, under ZeRO, under ZeRO with ranks to shard, or never (autocast on fp32)")
    gradient_reduction: Literal["one_call", "buckets"] = Field(
        description="the data-parallel gradient all-reduce: one call over the whole buffer, or bucket by bucket")
    bucket_MiB: float = Field(ge=0.01, le=1e6, description="gradient bucket size; the last bucket never overlaps backward")
    bucket_elements: Optional[tuple[Annotated[float, Field(ge=1, le=1e12)], Annotated[float, Field(ge=0, le=1e12)]]] = Field(
        default=None, description="(floor, per gradient-reducing rank): the bucket is max(floor, per rank x dp x cp) "
        "elements of the gradient buffer's dtype (megatron-core's default bucket_size); None: bucket_MiB")
    grad_nan_check: bool = Field(default=False, description="before the gradient reduction each bucket's L2 norm is "
        "taken and checked for NaN and Inf, each check a host sync (megatron-core's check_for_nan_in_grad)")
    clip_grad_norm: bool = Field(default=False, description="every step the optimizer takes the L2 norm of the "
        "gradients it steps and scales them by max_norm / norm (megatron-core's clip_grad > 0)")
    clip_grad_scope: Literal["stepped", "local"] = Field(default="stepped", description="the gradients clipped: the "
        "shard the optimizer steps, or every gradient the rank holds, its ZeRO-1 shard or not (nanotron)")
    clip_grad_bytes: Optional[float] = Field(default=None, ge=1, le=100, description="bytes the norm and the scale "
        "move per clipped parameter in every precision; None: advisor.optimizer CLIP_BYTES, three passes over the "
        "fp32 gradients (halved in pure bf16)")
    clip_grad_bytes_zero: Optional[float] = Field(default=None, ge=1, le=100, description="clip_grad_bytes where "
        "DeepSpeed's ZeRO optimizers run (zero_buffers.stages, else stage >= 1: not FP16_Optimizer); None: same")
    clip_unscales: bool = Field(default=False, description="under fp16 the clip's scale multiply also divides out the "
        "loss scale (DeepSpeed's unscale_and_clip_grads), a multiply of the stepped gradients that stays without clipping: "
        "no unscale pass over every gradient of its own")
    clip_unscales_zero: bool = Field(default=False, description="clip_unscales at zero_buffers.stages alone")
    zero_collectives: Literal["one_call", "per_unit"] = Field(
        description="ZeRO-2/3 gathers and reduce-scatters: one call per pass, or one per wrapped unit (FSDP)")
    zero3_overlap: Literal["prefetch", "forward", "per_submodule"] = Field(
        description="ZeRO-3 gathers hide behind the pass (prefetch), the forward only (FSDP without backward "
                    "prefetch: torch 1.11's default) or one sub-module each (DeepSpeed)")
    zero3_gathered: Literal["layer", "submodule"] = Field(description="what ZeRO-3 holds gathered at once, twice")
    zero3_calls: Optional[Zero3Calls] = Field(default=None, description="per_submodule ZeRO-3: how its gathers and "
        "reduce-scatters are issued (None: one call per pass, as zero_collectives says, shared out over the sub-modules)")
    zero_buffers: Optional[ZeroBuffers] = Field(default=None, description="an optimizer-sharding ZeRO engine's buckets "
        "and step copies (None: none costed beyond the states)")
    gradient_bucket_copy: bool = Field(description="DDP keeps flat gradient buckets beside .grad")
    gradients_persist: bool = Field(description="gradients live in a buffer allocated before the first backward")
    device_syncs: Literal["per_step", "per_micro_batch", "per_phase"] = Field(description="the device is synchronised "
        "once a step (the host runs ahead across micro-batches), a micro-batch, or after each forward and backward")
    pipeline_scatter_gather: bool = Field(description="pipeline sends split over the TP ranks, gathered on arrival")
    adamw_step: Literal["foreach", "loop"] = Field(default="foreach", description="torch's AdamW step: foreach (a "
        "temporary per parameter) or a loop over the tensors (F.adamw before 1.12: the largest tensor's)")
    tied_pipeline: Literal["all_reduce", "untied", "refused"] = Field(default="all_reduce", description="tied embeddings "
        "under PP: the end stages all-reduce the table's gradient a step (advisor.parallel.pipeline), keep it untied, or refuse")
    accumulation: Literal["sharded", "unsharded", "none"] = Field(default="sharded", description="ZeRO-2/3 over micro-"
        "batches: reduce-scatter each, adding the shards; unsharded: FSDP1's no_sync before the last, each unit's unsharded "
        "gradient kept (advisor.parallel.no_sync); none: torch 1.11's FSDP drops the shards at the next backward")
    reduce_dtype: Literal["compute", "fp32"] = Field(default="compute", description="gradients reduced in the compute dtype, or fp32")
    unit_grad_buffer: bool = Field(default=False, description="ZeRO-2/3: the gathered unit's unsharded gradient (and its "
        "fp32 copy when reduced in fp32) is alive while it is reduce-scattered")
    root_held: Literal["none", "output", "root"] = Field(default="none", description=(
        "ZeRO-3 per unit: what stays gathered from its forward into backward beside the blocks' units: FSDP2's [norm, "
        "lm_head] (reshard_after_forward=False), freed after its own backward (the larger of two units and one beside "
        "it held), FSDP1's root (_post_forward_reshard never frees it), held through the whole backward beside the unit "
        "computing and the one BACKWARD_PRE prefetches, or nothing"))
    unit_copies: bool = Field(
        default=False, description="ZeRO-2/3 per unit (FSDP2): each all-gather's output is copied out into the unit's "
        "parameters (read + write of the gathered bytes), and each reduce-scatter's input is built by copying the "
        "unsharded gradients in, cast to the reduce dtype; both on the compute stream (torch/distributed/fsdp/"
        "_fully_shard/_fsdp_collectives.py foreach_all_gather_copy_out, foreach_reduce_scatter_copy_in). False: the "
        "collectives work in place on flat buffers the parameters and gradients are views of (FSDP1, DeepSpeed)")
    main_grads: Literal["compute", "fp32"] = Field(default="compute", description="fp32: under half or mixed precision "
        "the gradients accumulate in a persistent fp32 buffer (Megatron's main_grad with grad_reduce_in_fp32), 4 bytes a parameter")
    param_gather_overlap: bool = Field(default=False, description="ZeRO-1: the all-gather of the updated weights runs "
        "bucket by bucket beside the next forward (Megatron's --overlap-param-gather) instead of after the step")
    selective: Optional[Selective] = Field(default=None, description="what selective recomputation reruns (None: none offered)")
    fsdp_param_dtype: Literal["storage", "half"] = Field(
        default="storage", description="half: under mixed precision, ZeRO-2/3 (FSDP) gathers the parameters in the half "
                                       "type, so its plans run the layers as pure half precision does (the half mode's "
                                       "tables); storage: as the run's precision says")
    half_from_zero: int = Field(default=2, ge=1, le=3, description="the lowest ZeRO stage whose plans run as "
                                "fsdp_param_dtype says: 2 (FSDP's), or 1 where the stack's ZeRO-1 is DeepSpeed's engine, "
                                "which casts the module to bf16 (deepspeed 0.19.8 runtime/engine.py _configure_distributed_model)")
    module_dtype: Literal["storage", "half"] = Field(
        default="storage", description="half: under mixed precision the engine casts the whole model to the half type "
                                       "(DeepSpeed's bf16 / fp16 modes), so every plan runs the layers as pure half "
                                       "precision does (the half mode's tables); storage: as the run's precision says")
    low_precision_params: bool = Field(
        default=False, description="under a low-precision recipe (advisor.precision) the layers' weights are kept, "
                                   "and gathered, in the recipe's format, the fp32 master copy in the optimizer "
                                   "(Megatron --fp8-param-gather, MLPerf FP8_PARAMS); False: half-precision weights "
                                   "quantised per use")
    weight_casts: Literal["per_micro_batch", "per_step"] = Field(
        default="per_micro_batch", description="under a low-precision recipe, each weight is quantised at every "
        "micro-batch's forward (torchao's Float8Linear), or once a step, its quantised copy kept for the step's other "
        "micro-batches (Transformer Engine's is_first_microbatch weight caching) or made by the optimizer step where the "
        "weights are held quantised (low_precision_params); ZeRO-3 without them gathers and casts per use")
    bf16_edge_layers: Optional[int] = Field(
        default=None, ge=0, le=1000, description="under a low-precision recipe, the decoder layers at each end the "
                                                 "stack runs in BF16 (Megatron's first_last_layers_bf16 with "
                                                 "num_layers_at_start_in_bf16 / _at_end_); None: the recipe's own "
                                                 "(advisor.precision)")
    bf16_tail: dict[RecipeName, Annotated[float, Field(gt=0, lt=1)]] = Field(
        default_factory=dict, description="per recipe, the share of the decoder layers, the last ceil(share x L), it "
        "runs in BF16 instead of the edge layers (torchtitan's NVFP4 configs: nvfp4_bf16_tail_fqns)")
    tp_comm_overlap: Literal["none", "userbuffers", "async", "linear-async"] = Field(
        default="none", description="by default, the sequence-parallel all-gathers and reduce-scatters run exposed, or "
        "pipelined with their GEMMs through Transformer Engine's userbuffers (Megatron --tp-comm-overlap), or through "
        "torch's symmetric-memory micro-pipeline (async: torchtitan's async tensor parallel), or issued async_op by the "
        "linears beside a GEMM (linear-async: nanotron's tp_linear_async_communication, advisor.parallel.linear_async)")
    tp_comm_overlaps: list[Literal["none", "userbuffers", "async", "linear-async"]] = Field(
        default_factory=list, description="the TP overlaps it also runs when asked (--tp-overlap), beyond its default")
    userbuffers: UserBuffers = Field(default_factory=UserBuffers, description="how the userbuffers overlap runs")
    gathered_inputs_bytes: float = Field(
        default=0.0, ge=0, le=1000, description="bytes per token per d_model the column-parallel linears save of their "
        "all-gathered input under SP without the linears' async collectives (tp_overlap linear-async saves the sequence "
        "shard, which memory.saved counts): nanotron's synchronous column linear, F.linear over the gathered input")
    tp_backward_overlap: bool = Field(
        default=False, description="tensor parallelism: in backward the column-parallel linear's input all-gather (SP) "
        "runs beside its dgrad GEMM and its input gradient's reduce-scatter or all-reduce beside its wgrad GEMM (Megatron's "
        "and Transformer Engine's async_op collectives), else every backward collective is exposed")
    tp_gathers_quantised: bool | list[RecipeName] = Field(
        default=False, description="under a low-precision recipe (true: any; a list: those) with sequence parallelism the "
        "layers' all-gathers (a column-parallel input, a row-parallel output gradient) carry the recipe's quantised bytes "
        "(Transformer Engine; torchao's Float8ColwiseParallel / Float8RowwiseParallel), not the activations' dtype")
    fsdp_float8_gather: Literal["off", "per_gather", "precomputed"] = Field(
        default="off", description="under fp8-tensorwise, FSDP's all-gathers carry the converted linears' weights in "
        "float8 (torchao enable_fsdp_float8_all_gather, tensorwise only: advisor.parallel.fp8_gather), each weight's amax "
        "all-reduced at its gather (per_gather) or all at once after the optimizer step (precomputed: torchao "
        "precompute_float8_dynamic_scale_for_fsdp); off: gathered in bf16, cast per use")
    tp_beyond_kv_heads: Literal["replicate", "refuse"] = Field(default="refuse", description="tp above the KV heads (a "
        "multiple of them): each rank keeps one KV head, tp / kv ranks replicating it, or refused (advisor.parallel.tensor)")
    quantised_inputs: Optional[QuantisedInputs] = Field(
        default=None, description="under every low-precision recipe the linears keep their inputs for backward quantised "
        "(Transformer Engine); None: only where the recipe itself does (advisor.precision saves_quantised_inputs)")
    distributed: Literal["any", "fsdp_checkpointed"] = Field(
        default="any", description="the plans it runs on several devices: any it offers, or only sharding every unit "
        "(ZeRO-3 / FSDP) with every layer checkpointed, and on one device none checkpointed (litgpt's fine-tuning scripts)")
    methods: list[Literal[METHODS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["full"], min_length=1, description="the fine-tuning methods it runs: full (every weight), lora "
        "(adapters on a frozen half-precision base), qlora (adapters on a quantised base); a profile that does not say "
        "runs full fine-tuning only, and the others are refused in one line")
    precisions: Optional[list[Literal["fp32", "bf16", "bf16-mixed", "fp16-mixed", "fp8-mixed", "fp8-tensorwise",
                                      "fp8-delayed", "fp8-rowwise", "fp8-rowwise-gw-hp", "fp8-blockwise", "mxfp8",
                                      "nvfp4"]]] = Field(
        default=None, min_length=1, description="the precisions and low-precision recipes it trains in (advisor's --precision names; "
        "None: every one advisor costs); another is refused in one line")
    expert_recipes: Optional[list[RecipeName]] = Field(
        default=None, description="the recipes it runs a mixture of experts in, routed grouped GEMMs included (None: "
        "every one it trains in); a routed model under another is refused in one line")
    fp8_attention: list[RecipeName] = Field(
        default_factory=list, description="the recipes under which it runs the attention core in FP8 when asked "
        "(--fp8-attention; megatron-core's fp8_dot_product_attention): none where the stack has no such switch")
    quantise_bytes: dict[RecipeName, Annotated[float, Field(gt=0, le=100)]] = Field(
        default_factory=dict, description="bytes per element its quantisation kernels read and write casting one tensor "
        "in training (both orientations), per recipe where its kernels are not the recipe's own (advisor.precision "
        "quantise_bytes: Transformer Engine's), e.g. torchao's MXFP8, which casts along each dimension in its own kernel")
    optimizers: list[Literal["adamw", "adamw-fused", "sgd"]] = Field(
        default_factory=lambda: ["adamw", "adamw-fused", "sgd"], min_length=1, description="the optimizers it trains with, its default "
        "first (advisor's --optimizer names); another is refused in one line")
    nf4_dequant_dtype: Literal["compute", "fp16"] = Field(
        default="compute", description="the dtype bitsandbytes dequantises an NF4 weight into: the compute dtype "
        "(bitsandbytes >= 0.42 keeps the weight's own dtype in its quant state), or fp16 then cast to the compute dtype "
        "(0.41 quantised from a .half() copy: Params4bit.cuda; MatMul4Bit's dequantize_4bit(...).to(A.dtype))")
    adapters_parallel: Literal["data", "model"] = Field(
        default="data", description="where LoRA adapters run: data parallelism only (PEFT under accelerate/DeepSpeed, "
        "torchtune, litgpt: DDP, FSDP, ZeRO), or also under tensor and pipeline parallelism (Megatron-Bridge's "
        "ParallelLinearAdapter: each adapter split over the TP ranks like its linear, on its layer's stage)")
    adapter_base: Literal["half", "params"] = Field(
        default="half", description="the dtype a LoRA's frozen base is held in under a mixed recipe: half (PEFT and "
        "torchtune load it in bf16), or the parameters' own (torchtitan 0.3.0 builds the model in training.dtype, fp32, "
        "and its FSDP2 shards keep it so, gathering bf16 copies)")
    adapter_library: Literal["peft", "litgpt", "torchtune"] = Field(
        default="peft", description="whose adapter code its LoRA runs where --lora-library is not given")
    adapter_modules: Literal["per_projection", "fused"] = Field(
        default="per_projection", description="what its LoRA adapts: any projection (PEFT, litgpt, torchtune: q, k and v "
        "apart), or whole fused modules (Megatron-Bridge: linear_qkv for q, k and v, linear_fc1 for gate and up)")
    mixed_without_fsdp: Literal["any", "data_parallel_only"] = Field(
        default="any", description="where its mixed precision runs on a plan without FSDP: on any, or on data-parallel "
        "plans only (torchtitan 0.2.2 distributed/utils.py maybe_enable_amp: TP or PP without FSDP or CP runs no "
        "autocast, and trains in fp32; and its parallelize functions raise on DDP beside TP or PP)")
    fsdp_at_one: bool = Field(
        default=False, description="where it shards over no rank (dp_shard x cp = 1) it still wraps every unit in FSDP2 "
        "on a one-rank mesh, whose MixedPrecisionPolicy casts the fp32 parameters to bf16 (torchtitan 0.3.0: no DDP, no "
        "autocast): costed as ZeRO-3 over one rank (under a pipeline its FSDP-under-pipeline ZeRO-1), and replicas over "
        "it (HSDP of one-rank shards) as DDP with fp32 masters and the unit copies; False: no FSDP there (DDP or autocast "
        "on the fp32 weights, torchtitan 0.2.2)")
    replica_all_reduce: Literal["per_step", "per_micro_batch"] = Field(
        default="per_step", description="HSDP's all-reduce over the replicas: once a step after the last micro-batch, or "
        "in each reducing micro-batch's post-backward behind each unit's reduce-scatter (FSDP2, and FSDP1 on its "
        "all-reduce stream: advisor.parallel.fsdp2)")
    base_modules: Literal["fused", "transformers"] = Field(
        default="fused", description="the modules its model code holds a layer's linears in (a quantised base's: one "
        "per module): one per fused projection (litgpt's qkv, Megatron's linear_qkv), or as transformers' modeling "
        "file for the family does (q_proj, k_proj and v_proj apart, but where advisor.adapters HF_FUSED_QKV)")
    offers: list[Literal[PLAN_FEATURES]] = Field(  # type: ignore[valid-type]
        default=list(DEFAULT_OFFERS), min_length=1, description="the plan features the stack runs; the search proposes no other")
    allocator: Literal["caching", "expandable_segments"] = Field(
        default="caching", description="PyTorch's CUDA caching allocator as the stack launches it: its default segments, "
                                       "or expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF), which unmaps free pages "
                                       "before it fails an allocation: the fit verdict's fragmentation margin "
                                       "(advisor.memory.FRAGMENTATION)")
    zero1: Literal["optimizer_sharding", "fsdp_under_pipeline"] = Field(
        default="optimizer_sharding", description="how the stack runs ZeRO-1 (among its offers): an optimizer-sharding "
        "engine (DeepSpeed, Megatron's distributed optimizer), or only as FSDP under a pipeline schedule, which keeps "
        "the unit's parameters and gradients unsharded from the first micro-batch to the last (torch.distributed."
        "pipelining with FSDP2)")
    zero1_reduction: Literal["reduce_scatter", "all_reduce_after_backward"] = Field(
        default="reduce_scatter", description="ZeRO-1's gradient reduction: a reduce-scatter overlapped with the last "
        "backward as DDP's, or one all-reduce of the whole flat gradient buffer after the backward, nothing beside it "
        "(nanotron 0.4 builds no DDP under ZeRO-1 with fp32 accumulation: advisor.parallel.accumulator)")
    grad_accumulator: Literal["in_place", "beside_half"] = Field(
        default="in_place", description="where the gradients accumulate: in place (.grad, a main_grad hook, ZeRO's "
        "buffers), or in an fp32 buffer filled after each backward from every parameter's half-precision .grad, "
        "which is then freed (nanotron's FP32GradientAccumulator): at the backward's end both are alive, and "
        "ZeRO-1's gather flattens the weights into new buffers (advisor.parallel.accumulator)")
    sequence_parallel: Literal["opt_in", "opt_out", "always"] = Field(
        default="opt_in", description="sequence parallelism under TP: off unless asked (Megatron's --sequence-parallel), "
        "on unless turned off (torchtitan 0.3.0's enable_sequence_parallel: True), or always on (the stack's TP plan "
        "shards the norms' sequence and has no switch); advisor estimate without --sp/--no-sp takes this default")
    moe_tp_needs_sp: bool = Field(
        default=False, description="whether its MoE layer refuses tensor parallelism without sequence parallelism "
        "(megatron-core 0.19.2 moe_layer.py: a ValueError in training)")
    sequence_split: Literal["cp_then_tp", "tp_times_cp"] = Field(
        default="cp_then_tp", description="how it asks the sequence to divide under CP and SP: into 2 x cp chunks, "
        "each CP rank's share over the TP ranks (Megatron), or by tp x 2 cp at once (torchtitan 0.3.0 trainer.py: "
        "seq_len_divisor)")
    checkpointing: list[Literal[CHECKPOINTING]] = Field(  # type: ignore[valid-type]
        default=["none", "selective", "full"], min_length=1, description="the activation checkpointing policies the stack runs "
        "(advisor/recompute.py; selective also needs `selective`)")
    activation_offload: Literal["every_layer", "first_k"] = Field(
        default="every_layer", description="what the offload checkpointing policy moves to host memory: every layer's "
        "saved tensors on the compute stream (torch.autograd.graph.save_on_cpu), or the first k layers' on a side stream, "
        "each due before a later layer's forward ends and brought back ahead of its backward (Transformer Engine's "
        "CPU offload under Megatron's --cpu-offloading-num-layers k)")
    offloads: list[Literal[OFFLOADS]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="where the stack can keep model states off the GPU (advisor/parallel/offload.py)")
    offload_optimizer: Literal["cpu_adam", "torch", "torch_fused"] = Field(
        default="cpu_adam", description="the optimizer step on offloaded states: DeepSpeed's vectorised CPU Adam, "
        "torch's CPU optimizer (FSDP CPU offload), or torch's fused CPU AdamW (as fast as DeepSpeed's)")
    optimizer_offload: Literal["zero_offload", "hybrid_device"] = Field(
        default="zero_offload", description="how offloaded optimizer states travel: ZeRO-Offload's (ZeRO-2/3, every "
        "micro-batch's gradient partition down beside the backward), or Megatron's HybridDeviceOptimizer (under the "
        "distributed optimizer, ZeRO-1: the shard's gradients down and its parameters up once a step, around the step)")
    moe_grouped_gemm: bool = Field(default=False, description="mixture of experts: each routed-expert linear runs "
        "its local experts as one grouped GEMM (Megatron --moe-grouped-gemm), else one GEMM per local expert")
    moe_gemm_streams: int = Field(default=0, ge=0, le=64, description="where > 0, that grouped GEMM is one GEMM kernel per "
        "local expert, in turn on this many CUDA streams (TE's multi-stream cuBLAS; advisor.parallel.expert gemm_calls)")
    moe_one_kernel_under: list[RecipeName] = Field(default_factory=list, description="the low-precision recipes under "
        "which its grouped GEMM is one kernel per linear all the same (Transformer Engine's fused grouped MLP)")
    ep_alltoall_overlap: Literal["none", "shared_experts", "batch"] = Field(
        default="none", description="by default, the expert-parallel dispatch and combine all-to-alls run exposed, "
                                    "beside the shared experts' GEMMs (Megatron --moe-shared-expert-overlap), or beside "
                                    "another micro-batch's compute (--overlap-moe-expert-parallel-comm)")
    ep_alltoall_overlaps: list[Literal["none", "shared_experts", "batch"]] = Field(
        default_factory=list, description="the overlaps it also runs when asked (--moe-overlap), beyond its default")
    moe_output_bytes: Optional[float] = Field(default=None, ge=0, le=8, description="bytes per element of the expert outputs an MoE "
        "layer keeps to weigh them by the router's probabilities (None: the activation dtype's; 0: weighed inside the experts)")
    expert_tp: Literal["free", "without_ep"] = Field(
        default="free", description="how it may split routed experts over TP ranks: free (Megatron's "
        "--expert-tensor-parallel-size, 1 or tp), or as attention without EP and whole with it (torchtitan)")
    ep_ranks: Literal["dp_cp_tp", "dp_tp"] = Field(default="dp_cp_tp", description="the ranks of a pipeline stage EP is "
        "carved from: dp x cp x tp (megatron-core's expert grid, torchtitan's sparse mesh), or dp x tp (DeepSpeed-MoE)")
    moe_dispatchers: list[Literal["alltoall", "flex"]] = Field(
        default_factory=lambda: ["alltoall"], min_length=1, description="the token dispatchers it runs, its default first: NCCL's "
        "all-to-all of every routed copy, or flex (DeepEP / HybridEP: a token sent once to each GPU, and across NVLink "
        "domains once to each domain, then forwarded on NVLink)")
    lacks: list[Literal["parallel_blocks", "alibi", "learned_positions", "beyond_llama", "llama4_experts",
                       "chunked_attention"]] = Field(
        default_factory=list, description="decoder shapes its model code cannot build: parallel_blocks (GPT-J/NeoX, "
        "Falcon's attention beside the MLP), alibi (BLOOM / MPT's positions), learned_positions (GPT-2 / OPT's position "
        "table), beyond_llama (what a Llama decoder lacks: "
        "ModelSpec.llama_departures), llama4_experts (run on every token), chunked_attention (Llama 4's chunks)")
    flex_dispatcher_sms: Optional[int] = Field(
        default=None, ge=1, le=100_000, description="SMs the flex dispatcher's kernels (DeepEP / HybridEP) hold while they "
        "run: the compute they overlap runs on the others meanwhile (None: not costed)")
    context_parallel: list[Literal["ring", "all-gather", "ulysses"]] = Field(
        default_factory=list, description="the context-parallel flavours the stack runs (advisor.parallel.context)")
    pipeline_splits: list[Literal["even", "edges", "layout"]] = Field(
        default_factory=lambda: ["even"], min_length=1, description="how it may split layers over pipeline ranks: even (ceil), edges "
        "(the embedding and the loss counted as layers), layout (interleaved chunks of ceil(L / (pp v)) layers, the "
        "rest in the last, where pp x v does not divide L: Megatron's --pipeline-model-parallel-layout)")
    zero_bubble: list[Literal["zb-h1", "zb-v", "dualpipev"]] = Field(default_factory=list, description="the zero-bubble "
        "pipeline schedules it runs (advisor.parallel.pipeline)")
    stage_micro_batches: list[Literal["1f1b", "dualpipev"]] = Field(default_factory=list, description="the schedules "
        "that refuse fewer micro-batches a step than pipeline stages, pp x a rank's chunks (torch.distributed.pipelining)")
    mtp: bool = Field(default=False, description="it trains multi-token prediction depths (--mtp-layers, advisor.mtp)")
    moe_capacity: bool = Field(default=False, description="its MoE routers drop the tokens beyond an expert's capacity "
                               "(--moe-capacity-factor, advisor.parallel.expert.load); False: dropless only")

    def ep_overlaps(self) -> list[str]:  # every all-to-all overlap it runs: none, its default and the ones it lists
        return list(dict.fromkeys(["none", self.ep_alltoall_overlap, *self.ep_alltoall_overlaps]))

    def tp_overlaps(self) -> list[str]:  # every TP overlap it runs: none, its default and the ones it lists
        return list(dict.fromkeys(["none", self.tp_comm_overlap, *self.tp_comm_overlaps]))

    def edge_layers_in_bf16(self, recipe) -> int:
        """Decoder layers at each end run in BF16 under ``recipe`` (an advisor.precision Recipe; None: 0): this
        profile's ``bf16_edge_layers`` where it states one, else the recipe's own."""
        if recipe is None or recipe.name in self.bf16_tail:
            return 0
        return recipe.bf16_edge_layers if self.bf16_edge_layers is None else self.bf16_edge_layers

    def bf16_layers(self, recipe, n_layers: int) -> int:
        """Decoder layers run in BF16 under ``recipe``: the last ceil(share x L) where the profile keeps a tail
        (``bf16_tail``), else the edge layers at both ends."""
        if recipe is not None and recipe.name in self.bf16_tail:
            return min(n_layers, math.ceil(n_layers * self.bf16_tail[recipe.name] - 1e-9))
        return min(n_layers, 2 * self.edge_layers_in_bf16(recipe))
