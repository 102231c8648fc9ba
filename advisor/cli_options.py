"""The click options of the commands that describe plans, written once.

``common_plan_options``: what every plan command needs (model, hardware, cluster size, setup, --json);
``single_plan_options``: the degrees and settings of one plan (``estimate``, ``export``). ``plan`` takes
the common set only: it searches the rest. Option names become ``advisor.api.build_inputs`` keywords.

Only click is imported here, so ``advisor --help`` stays fast (the library is imported inside commands).
"""

from __future__ import annotations

import click


def _apply(f, opts):
    for o in reversed(opts):
        f = o(f)
    return f


def _precision(ctx, param, value):
    """A --precision value as advisor names it (advisor.precision.canonical); a name nobody uses is a usage error."""
    if value is None:
        return None
    from advisor.precision import canonical
    from advisor.training import Precision

    name = canonical(value)
    known = [p.value for p in Precision]
    if name == "auto" and ctx.info_name == "plan":
        return name
    if name not in known:
        raise click.BadParameter(f"{value!r} is not a precision or a recipe: use one of {', '.join(known)}"
                                 + (" or auto" if ctx.info_name == "plan" else ""))
    return name


def common_plan_options(f):
    """Options shared by ``estimate``, ``export`` and ``plan``."""
    return _apply(f, [
        click.option("--model", "model", required=True, help="catalogue name (advisor models) or path to a HF config.json"),
        click.option("--hw", "hw", required=True, help="profile name (advisor profiles) or path to a profile YAML"),
        click.option("--nodes", type=int, default=None, help="nodes of the profile (alternative to --gpus)"),
        click.option("--seq", type=int, default=None,
                     help="sequence length in tokens [default: the model's context length, at most 8192]"),
        click.option("--precision", default=None, callback=_precision,
                     help="fp32, bf16-mixed, fp16-mixed (fp16), bf16, fp8-mixed, or a low-precision recipe: "
                          "fp8-tensorwise (current), fp8-delayed, fp8-rowwise, fp8-rowwise-gw-hp, fp8-blockwise, mxfp8, "
                          "nvfp4 (Transformer Engine, torchao and Megatron names accepted); plan also takes auto "
                          "[default: bf16-mixed where the GPU has bf16, else fp16-mixed]"),
        click.option("--attention", type=click.Choice(["sdpa", "eager"]), default="sdpa", show_default=True),
        click.option("--optimizer", type=click.Choice(["adamw", "adamw-fused", "sgd"]), default=None,
                     help="AdamW's foreach step, the fused one, or SGD  [default: the stack's, `advisor stacks show`]"),
        click.option("--stack", default="auto", show_default=True,
                     help="training stack profile (advisor stacks) or a path to one; auto: hf-trainer for data-parallel "
                          "plans of a model that fits one GPU, megatron-core for the rest where it builds the model "
                          "(the rule is printed with each answer); any (plan only): every stack's plans ranked together"),
        click.option("--moe-capacity-factor", type=float, default=None,
                     help="mixture of experts: an expert takes at most this multiple of its balanced share of tokens, "
                          "the rest dropped [default: dropless]"),
        click.option("--moe-imbalance", type=float, default=1.0, show_default=True,
                     help="mixture of experts: the busiest expert-parallel rank's tokens over the balanced share "
                          "(1: balanced, as the published benchmarks force)"),
        click.option("--moe-dispatcher", type=click.Choice(["alltoall", "flex"]), default=None,
                     help="mixture of experts: NCCL's all-to-all of every routed copy, or flex (DeepEP / HybridEP: once "
                          "a GPU, once a node across nodes) [default: the stack's first]"),
        click.option("--moe-overlap", type=click.Choice(["none", "shared-experts", "batch"]), default=None,
                     help="mixture of experts: what the all-to-alls run beside: nothing, the shared experts, or another "
                          "micro-batch's compute (--overlap-moe-expert-parallel-comm) [default: the stack's]"),
        click.option("--tp-overlap", type=click.Choice(["none", "userbuffers", "async", "linear-async"]), default=None,
                     help="tensor parallelism: the sequence-parallel all-gathers and reduce-scatters exposed, or "
                          "pipelined with their GEMMs (userbuffers: Megatron --tp-comm-overlap, Transformer Engine; "
                          "async: torchtitan's async tensor parallel; linear-async: the linears' async_op collectives, nanotron's "
                          "tp_linear_async_communication; each needs --sp with --tp > 1, and plan "
                          "then ranks TP plans with SP only; a plan without TP has nothing to overlap, as plan's rows "
                          "without TP) [default: the stack's]"),
        click.option("--mtp-layers", type=click.IntRange(0, 64), default=0, show_default=True,
                     help="multi-token prediction depths trained beside the model (Megatron's --mtp-num-layers: "
                          "DeepSeek-V3 trains 1): each an MTP layer and a second logits and loss on the last pipeline "
                          "stage, in the stacks that run it"),
        click.option("--fp8-attention", is_flag=True, default=False,
                     help="the attention core (softmax(QK^T)V) in FP8 under an FP8 recipe (megatron-core's "
                          "TransformerConfig.fp8_dot_product_attention, which Megatron-LM 0.19's arguments.py gives no "
                          "flag: a model provider or Megatron-Bridge's mixed_precision sets it), in the stacks that run "
                          "it [default: BF16]"),
        click.option("--compile", "compile", type=click.Choice(["none", "model", "loss", "model,loss"]), default="none",
                     show_default=True,
                     help="what torch.compile compiles, as the stack applies it (torchtitan's compile.components: model, "
                          "each block; loss): its fused kernels and what its partitioner saves, from the stack "
                          "profile's compiled tables"),
        click.option("--json", "as_json", is_flag=True, help="machine-readable output"),
        *finetune_options(),
    ])


def finetune_options():
    """Fine-tuning: the method and its adapters (advisor.finetune)."""
    return [
        click.option("--method", type=click.Choice(["full", "lora", "qlora", "auto"]), default="full", show_default=True,
                     help="what is trained: every weight, LoRA adapters on a frozen base, or on a quantised (NF4) base; "
                          "auto (plan): the first that fits of full, lora, qlora, qlora with CPU offload"),
        click.option("--lora-rank", type=int, default=8, show_default=True),
        click.option("--lora-alpha", type=float, default=16.0, show_default=True, help="scaling only: costs nothing"),
        click.option("--lora-dropout", type=float, default=0.0, show_default=True),
        click.option("--lora-targets", default=None,
                     help="modules to adapt, as PEFT (q_proj,v_proj | all-linear | lm_head), torchtune (output_proj, "
                          "w1,w2,w3, output) or litgpt (query,key,value,projection,mlp,head) name them [default: q,v]"),
        click.option("--dora", is_flag=True, help="DoRA: a magnitude vector per adapted linear"),
        click.option("--quant", type=click.Choice(["none", "int8", "nf4"]), default=None,
                     help="the frozen base's storage [default: nf4 for qlora, else the precision's dtype]"),
        click.option("--double-quant/--no-double-quant", default=True, show_default=True,
                     help="NF4 with 8-bit absmax (QLoRA's double quantisation)"),
        click.option("--optimizer-8bit", is_flag=True, help="bitsandbytes 8-bit optimizer states"),
        click.option("--paged", is_flag=True, help="bitsandbytes paged optimizer"),
        click.option("--adapter-offload", type=click.Choice(["none", "optimizer", "activations", "optimizer+activations"]),
                     default="none", show_default=True,
                     help="a LoRA/QLoRA fine-tune's CPU offload, as torchtune and DeepSpeed run it"),
        click.option("--lora-library", type=click.Choice(["peft", "litgpt", "torchtune"]), default=None,
                     help="whose adapter code runs (what it saves, quantises and chunks) [default: the stack's: litgpt's "
                          "own under --stack litgpt, else peft]"),
    ]


def fixed_plan_options(f):
    """What ``plan`` takes as fixed instead of searching it: the context-parallel degree, the selective plans'
    recomputed modules and expert tensor parallelism (estimate's --recompute-modules and --etp)."""
    return _apply(f, [
        click.option("--cp", type=int, default=None, help="only plans of this context-parallel degree [default: search every one]"),
        click.option("--recompute-modules", default=None,
                     help="only selective plans, rerunning these sub-modules, comma-separated (Megatron's --recompute-modules: "
                          "core_attn, layernorm, moe_act, mla_up_proj) [default: search every policy, selective as the stack's]"),
        click.option("--etp", type=int, default=None,
                     help="mixture of experts: every plan at this expert tensor-parallel degree [default: search tp and 1]"),
    ])


def single_plan_options(f):
    """The degrees and settings of one plan (``estimate``, ``export``); defaults as ``build_inputs``'s."""
    return _apply(f, [
        click.option("--gpus", type=int, default=None, help="total GPUs [default: dp x tp x pp]"),
        click.option("--dp", type=int, default=None, help="data-parallel degree [default: gpus / (tp*pp)]"),
        click.option("--tp", type=int, default=1, show_default=True, help="tensor-parallel degree"),
        click.option("--pp", type=int, default=1, show_default=True, help="pipeline-parallel degree"),
        click.option("--zero", type=click.IntRange(0, 3), default=None, help="ZeRO stage [default: 0, or --fsdp's]"),
        click.option("--fsdp", type=click.Choice(["full-shard", "shard-grad-op", "hybrid-shard", "no-shard"]), default=None,
                     help="FSDP mode (alias for the ZeRO stage)"),
        click.option("--sp/--no-sp", default=None, help="sequence parallelism under TP [default: the stack's: off in Megatron, on in torchtitan]"),
        click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"]),
                     default="1f1b", show_default=True, help="pipeline schedule (zero-bubble ones where the stack runs them)"),
        click.option("--virtual-stages", type=int, default=None, help="interleaved schedule: model chunks per GPU"),
        click.option("--pp-split", type=click.Choice(["even", "edges"]), default="even", show_default=True,
                     help="layers over pipeline ranks: even, or edges (the embedding and the loss count as a layer each)"),
        click.option("--cp", type=int, default=1, show_default=True, help="context-parallel degree (sequence split cp ways)"),
        click.option("--cp-comm", type=click.Choice(["ring", "all-gather", "ulysses"]), default=None,
                     help="context-parallel flavour [default: the stack's first]"),
        click.option("--micro-batch", type=int, default=1, show_default=True),
        click.option("--global-batch", type=int, default=None),
        click.option("--grad-accum", type=int, default=None),
        click.option("--recompute", type=click.Choice(["none", "selective", "full", "block", "every-k", "offload"]),
                     default="none", show_default=True, help="activation checkpointing policy (advisor/recompute.py)"),
        click.option("--recompute-layers", type=int, default=1, show_default=True,
                     help="full: layers per checkpoint (Megatron uniform); block: layers per stage chunk; every-k: k; "
                     "offload: the layers offloaded where the stack offloads the first k (Megatron's "
                     "--cpu-offloading-num-layers; plan's offload(k))"),
        click.option("--recompute-modules", default=None, help="selective: the sub-modules rerun, comma-separated "
                     "(Megatron's --recompute-modules: core_attn, layernorm, moe_act, mla_up_proj) [default: the stack's]"),
        click.option("--offload", type=click.Choice(["none", "optimizer-cpu", "optimizer-nvme", "params-cpu", "params-nvme"]),
                     default="none", show_default=True, help="model states in host memory or on NVMe (ZeRO-Offload/Infinity, FSDP)"),
        click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=None,
                     help="overlap gradient reduction with backward [default: on]"),
        click.option("--data-parallel", type=click.Choice(["ddp", "dp"]), default="ddp", show_default=True,
                     help="DDP or single-process nn.DataParallel"),
        click.option("--allow-tp-across-nodes", is_flag=True, help="let TP span nodes (normally rejected)"),
        click.option("--ep", type=int, default=1, show_default=True,
                     help="expert-parallel degree (mixture of experts): carved from dp x cp x tp"),
        click.option("--etp", type=int, default=None, help="expert tensor-parallel degree [default: tp]"),
    ])
