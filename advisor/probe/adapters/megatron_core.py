"""megatron-core: its own GPTModel built with the local (non-Transformer-Engine) layer spec, the one that builds on CPU
(megatron.core.models.gpt.gpt_layer_specs.get_gpt_layer_local_spec: ColumnParallelLinear / RowParallelLinear, torch's
LayerNorm or RMSNorm through WrappedTorchNorm, the unfused DotProductAttention: baddbmm, scale-mask-softmax,
dropout, bmm), in bf16 as Megatron trains (params_dtype bf16: Float16Module, no autocast), with the vocab-parallel
cross-entropy GPTModel computes inside (left to memory.logits). Families: GPT (LayerNorm, biases, GELU, learned
positions) and Llama (RMSNorm, no biases, SwiGLU: gated_linear_unit with SiLU, rotary, grouped-query attention).

Attention: the local spec's unfused core attention is advisor's ``eager`` (it keeps the s x s scores); Transformer
Engine's fused attention, which a real run uses, does not build on CPU: stack_profiles/megatron-core.yaml derives its
``sdpa`` entries by hand. Checkpointing: none; full (recompute_granularity full, method uniform, one layer per chunk:
megatron.core.tensor_parallel.checkpoint of each layer); selective (recompute_modules' default, ["core_attn"]).
On CPU: megatron's CUDA RNG tracker and RNG-state calls stand in for no-ops (the probe's tensors do not depend on
them), and a gloo process group of one rank holds the model-parallel state.
"""

from __future__ import annotations

from advisor.probe.adapter import Adapter, Case, Family
from advisor.probe.solve import Dims


class MegatronCore(Adapter):
    stack = "megatron-core"
    library = "megatron-core"
    pip = "pip install megatron-core==0.16.1"
    families = {
        "gpt": Family("megatron.core GPTModel, local spec (gpt_layer_specs.get_gpt_layer_local_spec)", "gelu",
                      tied_kv=True),
        "llama": Family("megatron.core GPTModel, local spec with RMSNorm and SwiGLU (gpt_layer_specs)", "swiglu"),
    }
    default_family = "llama"
    modes = ("mixed",)
    attentions = ("eager",)
    policies = ("none", "full", "selective")
    host_mode = "mixed"
    host_emulated = False
    layer_pattern = r"\.layers\.(\d+)(?:\.|$)"
    head_modules = ("output_layer",)
    row_parallel = ("linear_proj", "linear_fc2")  # RowParallelLinear in the spec
    emulation = ", bf16 parameters (params_dtype), local spec (no Transformer Engine), CUDA RNG calls as no-ops"

    def close(self) -> None:
        close()

    def build(self, family: str, dims: Dims, n_layers: int, mode: str, attention: str, policy: str,
              emulate: bool = True) -> Case:
        import torch

        model = _model(family, dims, n_layers, policy)
        model.train()
        ids = torch.randint(0, dims.vocab, (dims.b, dims.s))
        pos = torch.arange(dims.s).expand(dims.b, dims.s)
        mask = torch.ones(1, 1, dims.s, dims.s, dtype=torch.bool).triu(1)

        def forward():
            return model(ids, pos, mask, labels=ids).sum()

        return Case(model, forward, dims.tokens)


_OWNED: dict = {}  # what _cpu_state set up in this process, which close() undoes


def _cpu_state() -> None:
    """One gloo rank for megatron's parallel state; its CUDA RNG calls as no-ops on CPU. The rendezvous takes a free
    port (a fixed one collided in a busy test session), and close() restores the environment."""
    import contextlib
    import os
    import socket

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"  # megatron's global memory buffer asks for the CUDA device
    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        _OWNED["env"] = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)
    mrandom.get_cuda_rng_tracker().fork = lambda name="model-parallel-rng": contextlib.nullcontext()
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda *a, **k: None


def _model(family: str, d: Dims, n_layers: int, policy: str):
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    _cpu_state()
    llama = family == "llama"
    recompute = {"none": {}, "selective": {"recompute_granularity": "selective"},
                 "full": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}}[policy]
    cfg = TransformerConfig(
        num_layers=n_layers, hidden_size=d.d_model, num_attention_heads=d.heads, num_query_groups=d.kv_heads,
        kv_channels=d.d_head, ffn_hidden_size=d.d_ff, gated_linear_unit=llama, activation_func=F.silu if llama else F.gelu,
        normalization="RMSNorm" if llama else "LayerNorm", add_bias_linear=not llama, use_cpu_initialization=True,
        # GPT trains with megatron-core's default dropout (transformer_config.py:137-140), Llama recipes without
        attention_dropout=0.0 if llama else 0.1, hidden_dropout=0.0 if llama else 0.1,
        # Megatron-LM's defaults (--no-bias-swiglu-fusion, --no-bias-dropout-fusion are store_false): the jit-scripted
        # fused bias-SwiGLU and bias-dropout-add, which run on CPU too, for Llama; for GPT the unfused bias-GELU and
        # bias-dropout-add (the fused ones, under full recomputation, keep differently-shaped state from one probe
        # config to the next, which the probe refuses; unfused GELU keeps 4f as the fused one does: its input and
        # fc2's); masked-softmax and LayerNorm fusions are CUDA / apex kernels: off
        bias_dropout_fusion=llama, masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        bias_activation_fusion=llama, persist_layer_norm=False, bf16=True, params_dtype=torch.bfloat16, **recompute)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm" if llama else "LayerNorm")
    model = GPTModel(cfg, spec, vocab_size=d.vocab, max_sequence_length=d.s,
                     position_embedding_type="rope" if llama else "learned_absolute",
                     share_embeddings_and_output_weights=not llama)
    return model.to(torch.bfloat16)


def close() -> None:
    """Restore the environment _cpu_state changed (MASTER_PORT and the rank variables), so that a later launcher in
    this process does not inherit them. The gloo group and megatron's parallel state stay: megatron keeps module
    state (its RNG tracker, global buffers) that a second initialisation does not rebuild the same way."""
    import os

    for k, v in _OWNED.pop("env", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
