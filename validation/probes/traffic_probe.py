"""Memory traffic of the element-wise kernels of one HF decoder layer, per token, forward and backward.

Every aten op dispatched while a 1-layer Hugging Face model trains one step is recorded with the bytes
of its tensor inputs and outputs; views cost nothing, GEMMs and attention kernels are costed by the
compute model separately and excluded. A 0-layer model is subtracted, and the difference is divided
by the tokens: bytes moved per token by one layer's element-wise work (norms, activations, dropout,
residuals, rotary, casts). CUDA's autocast lists are emulated (cuda_like.py). Runs on CPU in seconds.

    python validation/probes/traffic_probe.py --out validation/data/traffic_probe.json

The per-token coefficients in advisor.compute.HF_TRAFFIC are solved from these rows (h and d_ff varied,
autocast's per-step weight casts taken out); HF_SCORE_TRAFFIC is the "eager score bytes per element" rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

VIEWS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "slice", "select", "split", "split_with_sizes",
         "unsqueeze", "squeeze", "alias", "detach", "as_strided", "reshape", "unbind", "chunk", "narrow", "lift_fresh",
         "_reshape_alias", "diagonal", "expand_as", "view_as", "empty", "empty_like", "empty_strided", "new_empty",
         "new_empty_strided", "zeros", "ones", "arange", "scalar_tensor", "_to_copy_noop", "set_", "resize_"}
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
         "_scaled_dot_product_efficient_attention_backward", "scaled_dot_product_attention",
         "_scaled_dot_product_attention_math", "embedding", "embedding_dense_backward", "nll_loss_forward",
         "nll_loss_backward", "_log_softmax", "_log_softmax_backward_data"}


def nbytes(x) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(nbytes(y) for y in x)
    return 0


def measure(arch: str, prec: str, attn: str, h=256, heads=4, kv=2, ffn=1024, s=128, b=2, V=512):
    import torch
    import transformers
    from torch.utils._python_dispatch import TorchDispatchMode

    from cuda_like import CudaLike

    class Traffic(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name not in VIEWS and name not in GEMMS:
                self.bytes += nbytes(list(args)) + nbytes(out) if not name.endswith("_") else nbytes(list(args))
                self.ops += 1
            return out

    def build(L):
        if arch == "gpt2":
            c = transformers.GPT2Config(n_embd=h, n_layer=L, n_head=heads, n_inner=ffn, vocab_size=V, n_positions=s)
            c._attn_implementation = attn
            m = transformers.GPT2LMHeadModel(c)
        else:
            c = transformers.LlamaConfig(hidden_size=h, num_hidden_layers=L, num_attention_heads=heads,
                                         num_key_value_heads=kv, intermediate_size=ffn, vocab_size=V,
                                         max_position_embeddings=s, tie_word_embeddings=False)
            c._attn_implementation = attn
            m = transformers.LlamaForCausalLM(c)
        if prec == "bf16-pure":
            m = m.to(torch.bfloat16)
        return m.train()

    amp = {"bf16-amp": torch.bfloat16}.get(prec)
    res = {}
    for L in (0, 1):
        torch.manual_seed(0)
        m = build(L)
        ids = torch.randint(0, V, (b, s))
        fwd, bwd = Traffic(), Traffic()
        with fwd, CudaLike(amp):
            loss = m(input_ids=ids, labels=ids).loss
        with bwd:
            loss.backward()
        res[L] = (fwd.bytes, bwd.bytes, fwd.ops, bwd.ops)
    T = b * s
    return {"arch": arch, "precision": prec, "attention": attn, "h": h, "ffn": ffn, "heads": heads, "kv_heads": kv,
            "seq": s, "tokens": T,
            "fwd_bytes_per_token": (res[1][0] - res[0][0]) / T, "bwd_bytes_per_token": (res[1][1] - res[0][1]) / T,
            "fwd_ops": res[1][2] - res[0][2], "bwd_ops": res[1][3] - res[0][3]}


def main() -> None:
    import torch
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for arch in ("gpt2", "llama"):
        for prec in ("fp32", "bf16-amp", "bf16-pure"):
            for attn in ("sdpa", "eager"):
                for h, ffn in ((256, 1024), (384, 1536)):
                    r = measure(arch, prec, attn, h=h, ffn=ffn)
                    r.update(torch=torch.__version__, transformers=transformers.__version__)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    # bytes per attention-score element of eager attention: (eager - sdpa) per token / (heads * s) at s = 512
    for arch in ("gpt2", "llama"):
        for prec in ("fp32", "bf16-amp", "bf16-pure"):
            e, d = (measure(arch, prec, attn, h=256, ffn=1024, s=512) for attn in ("eager", "sdpa"))
            r = {"arch": arch, "precision": prec, "quantity": "eager score bytes per element", "seq": 512,
                 "fwd_bytes_per_score": (e["fwd_bytes_per_token"] - d["fwd_bytes_per_token"]) / (e["heads"] * 512),
                 "bwd_bytes_per_score": (e["bwd_bytes_per_token"] - d["bwd_bytes_per_token"]) / (e["heads"] * 512),
                 "torch": torch.__version__, "transformers": transformers.__version__}
            rows.append(r)
            print(json.dumps(r), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
