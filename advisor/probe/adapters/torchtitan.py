"""torchtitan: its own Llama 3 model (torchtitan.models.llama3 Llama3Model of Llama3TransformerBlocks: fused wqkv,
rotary, SwiGLU FeedForward, torch's RMSNorm) built in bf16, as FSDP2's MixedPrecisionPolicy(param_dtype=bf16)
gives the unsharded parameters (torchtitan/distributed/fsdp.py), with the loss torchtitan trains with
(components/loss.py cross_entropy_loss: the logits upcast to fp32, summed).

Attention: torchtitan's ScaledDotProductAttention module (models/common/attention.py), causal; the CPU flash kernel
stands for CUDA's flash kernel (the same tensors saved: q, k, v, the output and the fp32 log-sum-exp). torchtitan
0.3 trains language models with FlexAttention, compiled (Triton kernels, no CPU path here); its saves are SDPA's
(q, k, v, output, log-sum-exp). Checkpointing: none; FullAC (ptd_checkpoint_wrapper per block) and SelectiveAC
(torchtitan's per-op policy: save compute-intensive ops' outputs but every second matmul) from
torchtitan/distributed/activation_checkpoint.py, whose save list names CUDA's SDPA kernels: the probe adds the CPU
flash kernel beside them, through SelectiveAC.get_save_ops, the override the library offers for it.
"""

from __future__ import annotations

import contextlib

from advisor.probe.adapter import Adapter, Case, Family
from advisor.probe.solve import Dims


class Torchtitan(Adapter):
    stack = "torchtitan"
    library = "torchtitan"
    pip = ("pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro docstring-parser typeguard triton "
           "(its other requirements are not needed to build the model)")
    families = {"llama": Family("torchtitan.models.llama3 Llama3TransformerBlock (model.py, common/attention.py, "
                                "common/feed_forward.py)", "swiglu")}
    default_family = "llama"
    modes = ("mixed",)
    attentions = ("sdpa",)
    policies = ("none", "full", "selective")
    host_mode = "mixed"
    layer_pattern = r"\.layers\.(\d+)(?:\.|$)"
    head_modules = ("lm_head",)
    row_parallel = ("wo", "w2")  # RowwiseParallel in models/common/decoder_sharding.py
    # SequenceParallel norms hand their output to PrepareModuleInput(desired_input_layouts=Replicate()): the
    # column-parallel linears read, and autograd saves, the all-gathered copy, the whole sequence on every TP rank
    # (0.2.2 models/llama3/infra/parallelize.py apply_tp; 0.3.0 models/common/decoder_sharding.py), where Megatron saves
    # the shard and gathers it again in backward
    gathered = ("attention_norm", "ffn_norm")
    emulation = (", bf16 parameters (FSDP2 param_dtype), CPU flash SDPA for CUDA's, RMSNorm as CUDA's fused kernel "
                 "(advisor/probe/emulate.py)")
    # compile.enable: each TransformerBlock compiled alone, fullgraph, after activation checkpointing wrapped it
    # (models/llama3/parallelize.py apply_compile), and the loss function (components/loss.py BaseLoss._maybe_compile,
    # compile.components ["model", "loss"] by default); the embedding, final norm and LM head stay eager
    compile_note = ("torch.compile per TransformerBlock (fullgraph, after checkpointing) and on the loss "
                    "(compile.components model, loss)")
    fused_norm = True  # torch 2.9+: F.rms_norm on CUDA runs aten._fused_rms_norm (advisor/probe/emulate.py)

    def split(self, tensor, term: str, policy: str) -> str:
        if term == "d_model" and tensor.output and tensor.made_in.split(".")[-1] in self.gathered:
            return "whole"
        return super().split(tensor, term, policy)

    def compiled_block(self, family: str, dims: Dims, mode: str, attention: str, policy: str):
        import torch

        model = _model(dims, 1)
        if policy != "none":
            _checkpoint(model, policy)
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
        block = next(iter(model.layers.children()))
        x = torch.randn(dims.b, dims.s, dims.d_model, dtype=torch.bfloat16, requires_grad=True)
        return (lambda h: block(h, None)), (x,)

    def compiled_loss(self, dims: Dims, mode: str):
        import torch
        from torchtitan.components.loss import cross_entropy_loss

        logits = torch.randn(dims.b, dims.s, dims.vocab, dtype=torch.bfloat16, requires_grad=True)
        return cross_entropy_loss, (logits, torch.randint(0, dims.vocab, (dims.b, dims.s)))

    def build(self, family: str, dims: Dims, n_layers: int, mode: str, attention: str, policy: str,
              emulate: bool = True) -> Case:
        import torch
        from torchtitan.components.loss import cross_entropy_loss

        from advisor.probe.emulate import fused_rms_norm

        model = _model(dims, n_layers)
        if policy != "none":
            _checkpoint(model, policy)
        for p in model.parameters():  # FSDP2 casts parameters, not buffers (the complex rotary table stays)
            p.data = p.data.to(torch.bfloat16)
        model.train()
        ids = torch.randint(0, dims.vocab, (dims.b, dims.s))

        norm = fused_rms_norm if self.fused_norm else None

        def forward():
            with norm() if norm else contextlib.nullcontext():
                return cross_entropy_loss(model(ids), ids)

        return Case(model, forward, dims.tokens, norm)


class TorchtitanComposite(Torchtitan):
    """torchtitan's block on torch before 2.9, whose CUDA build has no fused rms_norm: nn.RMSNorm runs torch's
    composite chain (an fp32 copy, its square's mean, rsqrt, products, casts back), each op a kernel, keeping its fp32
    copies for backward. Checked in the wheels' ATen op headers: _fused_rms_norm_cuda_dispatch.h ships first in torch
    2.9.0 (2.8.0 has only the MPS kernel). On CPU torch runs that composite (torch 2.13's order of ops: the weight
    applied in fp32, then the cast); torch.compile decomposes either into the same graph, so the compiled tables are
    torchtitan's."""

    stack = "torchtitan-0.1"
    fused_norm = False
    compile_note = ""
    emulation = (", bf16 parameters (FSDP2 param_dtype), CPU flash SDPA for CUDA's, RMSNorm as torch's composite ops "
                 "(CUDA's before torch 2.9)")


def _model(d: Dims, n_layers: int):
    """Llama3Model as torchtitan's config registry builds it (models/llama3/__init__.py _build_llama3_layers), with
    the small config's dimensions and SDPA for the inner attention."""
    from functools import partial

    import torch.nn as nn
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock

    init = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
    norm = {"weight": nn.init.ones_}
    rope = ComplexRoPE.Config(dim=d.d_head, max_seq_len=d.s, theta=500000, scaling="llama")
    layers = [Llama3TransformerBlock.Config(
        attention_norm=RMSNorm.Config(normalized_shape=d.d_model, param_init=norm),
        ffn_norm=RMSNorm.Config(normalized_shape=d.d_model, param_init=norm),
        attention=make_gqa_config(dim=d.d_model, n_heads=d.heads, n_kv_heads=d.kv_heads, head_dim=d.d_head,
                                  wqkv_param_init=init, wo_param_init=init, fuse_qkv=True, rope=rope,
                                  inner_attention=ScaledDotProductAttention.Config()),
        feed_forward=make_ffn_config(dim=d.d_model, hidden_dim=d.d_ff, w1_param_init=init, w2w3_param_init=init),
    ) for _ in range(n_layers)]
    cfg = Llama3Model.Config(
        dim=d.d_model, vocab_size=d.vocab, layers=layers,
        tok_embeddings=Embedding.Config(num_embeddings=d.vocab, embedding_dim=d.d_model,
                                        param_init={"weight": nn.init.normal_}),
        norm=RMSNorm.Config(normalized_shape=d.d_model, param_init=norm),
        lm_head=Linear.Config(in_features=d.d_model, out_features=d.vocab, param_init=init))
    model = cfg.build()
    model.init_states()
    return model


def _checkpoint(model, policy: str) -> None:
    import torch
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    class CPUSelectiveAC(SelectiveAC):
        def get_save_ops(self) -> set:
            return super().get_save_ops() | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    ac = FullAC(FullAC.Config()) if policy == "full" else CPUSelectiveAC(SelectiveAC.Config())
    ac.apply(model)
