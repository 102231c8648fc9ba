"""Host-side cost of eager PyTorch: aten ops per transformer layer and microseconds per op.

Runs on CPU with tiny tensors so that kernel work is negligible and what is timed is the host path
(Python modules, dispatcher, autograd). Counts every aten op per layer, forward and backward, for
three kernel styles: Hugging Face GPT-2 and Llama decoder layers (if ``transformers`` is installed)
and a Megatron-style GPT layer written with fused-kernel stand-ins. Output: JSON lines.

    python validation/probes/host_overhead.py --out validation/data/host_overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time


def count_ops(fn):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    with Count() as c:
        out = fn()
    return c.n, out


def megatron_layer(h=64, heads=4):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Layer(nn.Module):
        """GPT layer as Megatron runs it: fused LN, fused scale-mask-softmax, bias-GELU, bias-dropout-add."""

        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            s = torch.baddbmm(torch.empty(b * heads, t, t), q.reshape(b * heads, t, -1),
                              k.reshape(b * heads, t, -1).transpose(1, 2), beta=0, alpha=0.125)
            p = F.dropout(torch.softmax(s, -1), 0.1)
            o = torch.bmm(p, v.reshape(b * heads, t, -1)).view(b, heads, t, -1).transpose(1, 2).reshape(b, t, h)
            x = x + F.dropout(self.proj(o), 0.1)
            return x + F.dropout(self.fc2(F.gelu(self.fc(self.ln2(x)))), 0.1)

    return Layer()


def megatron_core_layer():
    """megatron-core's GPT layer (local spec, no apex/TE), CPU-patched: returns (layer, input, mask) or None."""
    import contextlib
    import os

    import torch
    import torch.distributed as dist

    try:
        from megatron.core import parallel_state as ps
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel import random as mrandom
        from megatron.core.transformer.transformer_config import TransformerConfig
        from megatron.core.transformer.transformer_layer import TransformerLayer
    except ImportError:
        return None
    torch.cuda.current_device = lambda: "cpu"  # megatron's global buffer asks for the CUDA device
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PROBE_PORT", "29533"), RANK="0", WORLD_SIZE="1")
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    mrandom.get_cuda_rng_tracker().fork = lambda name="model-parallel-rng": contextlib.nullcontext()
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                            attention_dropout=0.1, hidden_dropout=0.1, add_bias_linear=True, bias_dropout_fusion=False,
                            masked_softmax_fusion=False, gradient_accumulation_fusion=False,
                            bias_activation_fusion=False, persist_layer_norm=False)
    layer = TransformerLayer(cfg, get_gpt_layer_local_spec().submodules)
    x = torch.randn(8, 1, 64, requires_grad=True)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).triu(1)
    return layer, x, mask


def megatron_core_model(n_layers: int):
    """megatron-core's GPTModel (embedding, layers, final norm, output layer, vocab-parallel loss) on CPU;
    call megatron_core_layer() first (it sets up the CPU patches and the process group)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=n_layers, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                            attention_dropout=0.1, hidden_dropout=0.1, add_bias_linear=True, bias_dropout_fusion=False,
                            masked_softmax_fusion=False, gradient_accumulation_fusion=False,
                            bias_activation_fusion=False, persist_layer_norm=False)
    return GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=128, max_sequence_length=8)


def hf_layers():
    try:
        import transformers  # noqa: F401
        from transformers import GPT2Config, LlamaConfig
        from transformers.models.gpt2.modeling_gpt2 import GPT2LMHeadModel
        from transformers.models.llama.modeling_llama import LlamaForCausalLM
    except ImportError:
        return {}
    out = {}
    for attn in ("sdpa", "eager"):
        cfg = GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=128, n_positions=64, attn_implementation=attn)
        out[f"hf-gpt2-{attn}"] = GPT2LMHeadModel(cfg)
        lcfg = LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=128, vocab_size=128, attn_implementation=attn)
        out[f"hf-llama-{attn}"] = LlamaForCausalLM(lcfg)
    return out


def measure(reps: int = 30):
    import torch

    torch.set_num_threads(1)
    rows = []
    layer = megatron_layer()
    x = torch.randn(1, 8, 64, requires_grad=True)
    rows.append(_time("megatron-gpt", lambda: layer(x), reps))
    mc = megatron_core_layer()
    if mc is not None:
        mlayer, mx, mmask = mc
        layer_row = _time("megatron-core-gpt", lambda: mlayer(mx, attention_mask=mmask)[0], reps)
        rows.append(layer_row)
        # the rest of a micro-batch: embedding, final norm, output layer, cross-entropy (a 1-layer model
        # less its layer)
        model = megatron_core_model(1)
        ids, pos = torch.randint(0, 128, (1, 8)), torch.arange(8)[None]
        whole = _time("megatron-core-gpt-head", lambda: model(ids, pos, mmask, labels=ids).sum(), reps)
        rows.append({k: (whole[k] - layer_row[k] if isinstance(whole[k], (int, float)) else whole[k]) for k in whole})
    for name, model in hf_layers().items():
        model.train()
        ids = torch.randint(0, 128, (1, 8))
        # whole-model minus the same model's embedding/head pass approximates one layer; with 1 layer we
        # report the model's counts and subtract a 0-layer run.
        base = type(model)(model.config.__class__(**{**model.config.to_dict(), _layers_key(model): 0}))
        full = _time(name, lambda: model(ids, labels=ids).loss, reps)
        zero = _time(name, lambda: base(ids, labels=ids).loss, reps)
        rows.append({k: (full[k] - zero[k] if isinstance(full[k], (int, float)) else full[k]) for k in full})
        rows.append({**zero, "style": f"{name}-head"})  # embedding, final norm, LM head and loss
    return rows


def _layers_key(model):
    return "n_layer" if hasattr(model.config, "n_layer") else "num_hidden_layers"


def _time(name, fn, reps):
    nf, y = count_ops(fn)
    loss = y.sum() if y.dim() else y
    nb, _ = count_ops(lambda: loss.backward())
    t0 = time.perf_counter()
    for _ in range(reps):
        y = fn()
    tf = (time.perf_counter() - t0) / reps
    tb = 0.0
    for _ in range(reps):
        y = fn()
        loss = y.sum() if y.dim() else y
        t0 = time.perf_counter()
        loss.backward()
        tb += time.perf_counter() - t0
    tb /= reps
    return {"style": name, "fwd_ops": nf, "bwd_ops": nb, "fwd_us": tf * 1e6, "bwd_us": tb * 1e6}


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = measure()
    meta = {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "threads": 1}
    for r in rows:
        r["us_per_op"] = (r["fwd_us"] + r["bwd_us"]) / max(1, r["fwd_ops"] + r["bwd_ops"])
        r.update(meta)
    text = json.dumps(rows, indent=1)
    if args.out:
        open(args.out, "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
