"""hf-trainer: Hugging Face transformers' GPT-2 and Llama modules under CUDA's autocast, emulated on CPU as
validation/probes/activation_probe.py runs them (the probe that measured stack_profiles/hf-trainer.yaml).

Precision modes: fp32; mixed (fp32 weights under autocast to bf16, CUDA's op lists: advisor.probe.emulate); half
(the model cast to bf16). Attention: sdpa (CPU's flash kernel stands for CUDA's: the same tensors saved) and eager.
Checkpointing: none, and full (``gradient_checkpointing_enable()``, transformers' default non-reentrant
checkpoint per decoder layer); transformers has no selective switch. The model returns a KV cache in training
(use_cache defaults to True), as the shipped numbers include; under checkpointing transformers turns it off.
"""

from __future__ import annotations

import contextlib

from advisor.probe.adapter import Adapter, Case, Family
from advisor.probe.measure import Tensor
from advisor.probe.solve import Dims


class HFTrainer(Adapter):
    stack = "hf-trainer"
    library = "transformers"
    pip = "pip install transformers==5.23.0"
    families = {"gpt2": Family("transformers GPT2LMHeadModel (modeling_gpt2.py)", "gelu", tied_q=True, tied_kv=True),
                "llama": Family("transformers LlamaForCausalLM (modeling_llama.py)", "swiglu")}
    default_family = "llama"
    modes = ("fp32", "mixed", "half")
    attentions = ("sdpa", "eager")
    policies = ("none", "full")
    host_mode = "fp32"  # validation/probes/host_overhead.py counted the modules in fp32 on plain CPU ops, as the
    host_emulated = False  # shipped rows are: with CUDA's fused dropout a GPT-2 sdpa layer issues 43/78, not 75/98
    layer_pattern = r"\.(?:h|layers)\.(\d+)(?:\.|$)"
    head_modules = ("lm_head",)
    split_note = ("tensor-parallel split not measurable at TP = 1: HF modules have no sequence parallelism, so every "
                  "byte of a layer is `split` (divided by TP), a checkpointed layer's input `whole`, as "
                  "stack_profiles/hf-trainer.yaml has them")
    emulation = ", CUDA autocast and dropout emulated (advisor/probe/emulate.py)"
    # TrainingArguments.torch_compile: the Trainer compiles the whole model, its loss inside its forward (accelerate's
    # TorchDynamoPlugin, inductor); probed a decoder layer at a time (what crosses a layer's edge, a residual add into
    # the next norm, is left unfused) and the loss apart, under CPU autocast where mixed (the Llama block casts alike)
    compile_note = ("torch.compile of the model (TrainingArguments.torch_compile, its loss inside), a decoder layer and "
                    "the loss apart")
    # Llama's alone: GPT-2's attention dropout sends CPU's SDPA to its math path under compile (CUDA's flash kernel
    # takes the dropout), scores and masks a CUDA run would not keep, which its probe configs cannot even align
    compiled_families = ("llama",)

    def compiled_block(self, family: str, dims: Dims, mode: str, attention: str, policy: str):
        import torch

        case = self.build(family, dims, 1, mode, attention, policy, emulate=False)
        layer = _layers(case.model)[0]
        seen: dict = {}
        hook = layer.register_forward_pre_hook(lambda m, a, k: seen.update(args=a, kwargs=k), with_kwargs=True)
        with torch.no_grad():
            case.model(input_ids=torch.randint(0, dims.vocab, (dims.b, dims.s)), use_cache=False)
        hook.remove()
        args, kwargs = seen["args"], {k: v for k, v in seen["kwargs"].items() if k != "hidden_states"}
        first = args[0] if args else seen["kwargs"]["hidden_states"]
        x = torch.randn(first.shape, dtype=first.dtype, requires_grad=True)
        amp = torch.bfloat16 if mode == "mixed" else None

        def fn(h):
            with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
                out = layer(h, *args[1:], **kwargs)
            return out[0] if isinstance(out, tuple) else out

        return fn, (x,)

    def compiled_loss(self, dims: Dims, mode: str):
        import torch
        from transformers.loss.loss_utils import ForCausalLMLoss

        dtype = torch.float32 if mode == "fp32" else torch.bfloat16  # the LM head's output under autocast: bf16
        logits = torch.randn(dims.b, dims.s, dims.vocab, dtype=dtype, requires_grad=True)
        labels = torch.randint(0, dims.vocab, (dims.b, dims.s))
        return (lambda z, y: ForCausalLMLoss(z, y, vocab_size=dims.vocab)), (logits, labels)

    def build(self, family: str, dims: Dims, n_layers: int, mode: str, attention: str, policy: str,
              emulate: bool = True) -> Case:
        import torch
        import transformers

        from advisor.probe.emulate import cuda_like as emulated

        def cuda_like(amp, cache=True):
            return emulated(amp, cache) if emulate else contextlib.nullcontext()

        d = dims
        if family == "gpt2":
            c = transformers.GPT2Config(n_embd=d.d_model, n_layer=n_layers, n_head=d.heads, n_inner=d.d_ff,
                                        vocab_size=d.vocab, n_positions=d.s)
            c._attn_implementation = attention
            model = transformers.GPT2LMHeadModel(c)
        else:
            c = transformers.LlamaConfig(hidden_size=d.d_model, num_hidden_layers=n_layers, num_attention_heads=d.heads,
                                         num_key_value_heads=d.kv_heads, head_dim=d.d_head, intermediate_size=d.d_ff,
                                         vocab_size=d.vocab, max_position_embeddings=max(d.s, 128),
                                         tie_word_embeddings=False)
            c._attn_implementation = attention
            model = transformers.LlamaForCausalLM(c)
        if mode == "half":
            model = model.to(torch.bfloat16)
        if policy == "full":
            model.gradient_checkpointing_enable()
        model.train()
        ids = torch.randint(0, d.vocab, (d.b, d.s))
        amp = torch.bfloat16 if mode == "mixed" else None

        held = []  # the model's output object, kept through the backward as the shipped probe kept it

        def forward():
            with cuda_like(amp):
                held[:] = [model(input_ids=ids, labels=ids, use_cache=policy == "none")]
            return held[0].loss

        return Case(model, forward, d.tokens, lambda: cuda_like(amp, cache=False))

    def split(self, tensor: Tensor, term: str, policy: str) -> str:
        return "whole" if policy == "full" else "split"


def _layers(model):
    """The decoder layers of a transformers causal LM (Llama's model.layers, GPT-2's transformer.h)."""
    inner = getattr(model, "model", None) or getattr(model, "transformer")
    return inner.layers if hasattr(inner, "layers") else inner.h
