"""CPU probe of what a Hugging Face causal-LM training step keeps alive.

Usage:  python validation/probes/activation_probe.py --out validation/data/activation_probe.json

Two independent measurements per configuration:
  1. saved-tensor accounting: ``torch.autograd.graph.saved_tensors_hooks`` records every tensor saved
     for backward during forward; storages are deduplicated by (data_ptr, nbytes) and attributed to the
     innermost module running when they were saved (global forward pre/post hooks).  Parameters are
     excluded (they are counted as P).  Names of the autograd nodes that saved them come from a walk of
     the graph (``_saved_*`` attributes).
  2. allocator timeline: ``torch.profiler`` with ``profile_memory=True`` records every CPU allocation and
     free (the c10 CPU allocator, i.e. the same events max_memory_allocated sums on CUDA, without the
     512-byte rounding).  Phases (forward, loss, backward, optimizer step, zero_grad) are delimited with
     ``record_function``.  Per-layer bytes are also obtained by differencing the live bytes at forward
     end between a 2-layer and a 4-layer model (robust, covers gradient checkpointing).

CUDA emulation (default on): CPU autocast uses different op lists than CUDA autocast, and CPU dropout
saves a full-precision noise tensor where CUDA's fused ``native_dropout`` saves a bool mask.  The
``CudaLike`` torch-function mode reproduces the CUDA behaviour on CPU:
  * dropout -> ``torch.native_dropout`` (bool mask saved, as on CUDA);
  * for amp: CUDA autocast policies: lower precision for linear/addmm/mm/bmm/baddbmm/matmul/sdpa
    (leaf-parameter casts cached for the autocast region, as CUDA autocast does); fp32 for
    pow/rsqrt/exp/log/layer_norm/cross_entropy/nll_loss/...; fp32-set-opt-dtype for softmax/log_softmax/
    sum/cumsum/prod (dtype=float32 unless given);
  * sdpa dropout_p forced to 0: CUDA flash / mem-efficient kernels implement dropout with a philox
    seed/offset (no mask saved) whereas CPU sdpa with dropout falls back to the math path.
Native CPU autocast is also probed (``emulate: false`` rows) to show the difference.
"""
import argparse
import json
import re
import sys
import time


def main():
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch._C._profiler import _EventType

    torch.manual_seed(0)
    torch.set_num_threads(8)

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from cuda_like import CudaLike  # validation/probes/cuda_like.py

    # ------------------------------------------------------------------ model construction
    def build(cfg):
        if cfg["arch"] == "gpt2":
            c = transformers.GPT2Config(n_embd=cfg["h"], n_layer=cfg["L"], n_head=cfg["heads"],
                                        n_inner=cfg["ffn"], vocab_size=cfg["V"], n_positions=cfg["s"])
            c._attn_implementation = cfg["attn"]
            m = transformers.GPT2LMHeadModel(c)
        else:
            c = transformers.LlamaConfig(hidden_size=cfg["h"], num_hidden_layers=cfg["L"],
                                         num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv"],
                                         intermediate_size=cfg["ffn"], vocab_size=cfg["V"],
                                         max_position_embeddings=max(cfg["s"], 128), tie_word_embeddings=False)
            c._attn_implementation = cfg["attn"]
            m = transformers.LlamaForCausalLM(c)
        if cfg["prec"] == "bf16-pure":
            m = m.to(torch.bfloat16)
        if cfg["ckpt"]:
            m.gradient_checkpointing_enable()
        m.train()
        return m

    def amp_dtype(cfg):
        return {"bf16-amp": torch.bfloat16, "fp16-amp": torch.float16}.get(cfg["prec"])

    class Ctx:
        """Context for forward+loss: CUDA-like mode or native CPU autocast."""

        def __init__(self, cfg, cache=True):
            self.cfg = cfg
            self.cache = cache
            self.stack = []

        def __enter__(self):
            ad = amp_dtype(self.cfg)
            if self.cfg.get("emulate", True):
                self.stack.append(CudaLike(ad, self.cache))
            elif ad is not None:
                self.stack.append(torch.autocast("cpu", dtype=ad))
            for s in self.stack:
                s.__enter__()
            return self

        def __exit__(self, *a):
            for s in reversed(self.stack):
                s.__exit__(*a)

    # ------------------------------------------------------------------ 1. saved tensor accounting
    def saved_accounting(cfg):
        m = build(cfg)
        b, s = cfg["b"], cfg["s"]
        ids = torch.randint(0, cfg["V"], (b, s))
        param_ptrs = {p.untyped_storage().data_ptr() for p in m.parameters()}
        stack = []
        names = {mod: n for n, mod in m.named_modules()}
        h1 = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, inp: stack.append(names.get(mod, "?")))
        h2 = torch.nn.modules.module.register_module_forward_hook(lambda mod, inp, out: (stack.pop(), None)[1])
        rec = {}

        def pack(t):
            st = t.untyped_storage()
            key = (st.data_ptr(), st.nbytes())
            if key[0] not in param_ptrs and key not in rec:
                rec[key] = dict(module=stack[-1] if stack else "", dtype=str(t.dtype).replace("torch.", ""),
                                shape=list(t.shape), nbytes=st.nbytes(), ops=[])
            return t

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with Ctx(cfg):
                    out = m(input_ids=ids, labels=ids, use_cache=cfg.get("use_cache", True))
        finally:
            h1.remove()
            h2.remove()
        # graph walk for op names
        if not cfg["ckpt"]:
            seen, todo = set(), [out.loss.grad_fn]
            while todo:
                n = todo.pop()
                if n is None or n in seen:
                    continue
                seen.add(n)
                for a in dir(n):
                    if a.startswith("_saved_"):
                        try:
                            v = getattr(n, a)
                        except Exception:
                            continue
                        for t in (v if isinstance(v, (tuple, list)) else [v]):
                            if isinstance(t, torch.Tensor):
                                st = t.untyped_storage()
                                k = (st.data_ptr(), st.nbytes())
                                if k in rec:
                                    rec[k]["ops"].append(n.name() + "." + a[7:])
                todo.extend(f for f, _ in n.next_functions)
        # attribute to layers
        per = {}
        for r in rec.values():
            mm = re.search(r"(?:\.h\.|\.layers\.)(\d+)", r["module"])
            grp = "layer%s" % mm.group(1) if mm else ("head/loss" if ("lm_head" in r["module"] or r["module"] == "") else "embed/final")
            r["ops"] = sorted(set(r["ops"]))
            per.setdefault(grp, []).append(r)
        return {k: dict(bytes=sum(r["nbytes"] for r in v), tensors=v) for k, v in per.items()}

    # ------------------------------------------------------------------ 2. allocator timeline
    def timeline(cfg, optim="adamw-foreach", steps=2):
        m = build(cfg)
        b, s = cfg["b"], cfg["s"]
        ids = torch.randint(0, cfg["V"], (b, s))
        params = [p for p in m.parameters()]
        if optim == "adamw-foreach":
            opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        elif optim == "adamw-fused":
            opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        elif optim == "adamw-forloop":
            opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)
        elif optim == "sgd-momentum":
            opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9, foreach=True)
        scaler = torch.amp.GradScaler("cpu") if cfg["prec"] == "fp16-amp" else None

        def step(tag):
            with record_function(tag + "fwd"):
                with Ctx(cfg):
                    out = m(input_ids=ids, labels=ids, use_cache=cfg.get("use_cache", True))
            loss = out.loss
            # backward runs under the same mode (checkpoint recompute restores the autocast state; the
            # autocast weight-cast cache is not kept across backward on CUDA, so caching is off here)
            with record_function(tag + "bwd"), Ctx(cfg, cache=False):
                lt = scaler.scale(loss) if scaler else loss
                # call the engine directly: Tensor.backward would be routed through (and pop) the mode
                torch.autograd.graph._engine_run_backward((lt,), (torch.ones_like(lt),), False, False, (),
                                                          allow_unreachable=True, accumulate_grad=True)
            del out, loss
            with record_function(tag + "opt"):
                if scaler:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
            with record_function(tag + "zero"):
                opt.zero_grad(set_to_none=True)

        step("W_")  # warm-up: creates optimizer states
        P = sum(p.numel() * p.element_size() for p in m.parameters())
        S = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if torch.is_tensor(t))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            for i in range(steps - 1):
                step("S%d_" % i)
        allocs, ranges = [], {}

        def walk(n):
            if n.tag == _EventType.Allocation:
                allocs.append((n.start_time_ns, n.extra_fields.alloc_size))
            elif n.name.startswith("S0_"):
                ranges[n.name[3:]] = (n.start_time_ns, n.end_time_ns)
            for c in n.children:
                walk(c)

        for r in prof.profiler.kineto_results.experimental_event_tree():
            walk(r)
        allocs.sort()
        live, cur = [], 0
        for t, a in allocs:
            cur += a
            live.append((t, cur))

        def phase_peak(name):
            t0, t1 = ranges[name]
            v = [x for t, x in live if t0 <= t <= t1]
            return max(v) if v else 0

        def at(tq):
            v = 0
            for t, x in live:
                if t > tq:
                    break
                v = x
            return v

        res = dict(P=P, S=S, optimizer=optim,
                   fwd_end=at(ranges["fwd"][1]), peak_fwd=phase_peak("fwd"), peak_bwd=phase_peak("bwd"),
                   bwd_end=at(ranges["bwd"][1]), opt_start=at(ranges["opt"][0]), peak_opt=phase_peak("opt"), opt_end=at(ranges["opt"][1]),
                   end=live[-1][1] if live else 0)
        res["peak_step"] = max(res["peak_fwd"], res["peak_bwd"], res["peak_opt"])
        res["peak_phase"] = max(("fwd", "bwd", "opt"), key=lambda k: res["peak_" + k])
        res["grads"] = sum(p.grad.numel() * p.grad.element_size() for p in m.parameters() if p.grad is not None)
        return res

    # ------------------------------------------------------------------ configurations
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()

    base = {
        "gpt2": dict(arch="gpt2", h=256, ffn=1024, heads=4, kv=4, V=2048, b=2, s=256),
        "llama": dict(arch="llama", h=256, ffn=688, heads=4, kv=2, V=2048, b=2, s=256),
    }
    results = dict(torch=torch.__version__, transformers=transformers.__version__,
                   note="bytes; per_layer_bytes measured by layer differencing (L=4 minus L=2)/2 of live bytes at "
                        "forward end; per_token = /(b*s)", configs=[])
    variants = []
    for arch in ("gpt2", "llama"):
        for prec in ("fp32", "bf16-amp", "bf16-pure", "fp16-amp"):
            for attn in ("sdpa", "eager"):
                for ckpt in (False, True):
                    variants.append(dict(base[arch], prec=prec, attn=attn, ckpt=ckpt, emulate=True))
        # scaling checks: seq (s^2 terms), hidden, native CPU autocast
        for attn in ("sdpa", "eager"):
            variants.append(dict(base[arch], prec="bf16-amp", attn=attn, ckpt=False, s=512, emulate=True))
            variants.append(dict(base[arch], prec="fp32", attn=attn, ckpt=False, s=512, emulate=True))
            variants.append(dict(base[arch], prec="bf16-amp", attn=attn, ckpt=False, emulate=False))
            variants.append(dict(base[arch], prec="fp32", attn=attn, ckpt=False, emulate=False))
        variants.append(dict(base[arch], prec="bf16-amp", attn="sdpa", ckpt=False, h=384, heads=6,
                             ffn=(1536 if arch == "gpt2" else 1024), kv=(6 if arch == "gpt2" else 2), emulate=True))
        # HF returns a DynamicCache (use_cache=True is the config default, also in train mode): its
        # torch.cat copies of K/V stay alive as long as the output object; measure without it too
        for prec in ("fp32", "bf16-amp", "bf16-pure"):
            for attn in ("sdpa", "eager"):
                variants.append(dict(base[arch], prec=prec, attn=attn, ckpt=False, emulate=True, use_cache=False))
        variants.append(dict(base[arch], prec="bf16-amp", attn="sdpa", ckpt=True, emulate=True, use_cache=False))
    if a.quick:
        variants = variants[:2]
    t0 = time.time()
    for v in variants:
        row = dict(v)
        tl = {}
        for L in (2, 4):
            tl[L] = timeline(dict(v, L=L))
        row["timeline_L2"], row["timeline_L4"] = tl[2], tl[4]
        tok = v["b"] * v["s"]
        row["per_layer_bytes"] = (tl[4]["fwd_end"] - tl[2]["fwd_end"]) / 2
        row["per_layer_bytes_per_token"] = row["per_layer_bytes"] / tok
        row["non_layer_fwd_end_bytes"] = tl[2]["fwd_end"] - 2 * row["per_layer_bytes"]
        acc = saved_accounting(dict(v, L=3))
        row["saved"] = acc
        row["saved_layer1_bytes_per_token"] = acc.get("layer1", {}).get("bytes", 0) / tok
        results["configs"].append(row)
        print("%-5s %-9s %-5s ckpt=%d emu=%d cache=%d s=%d h=%d | layer B/tok timeline %.1f saved %.1f | non-layer %.3g | "
              "peaks fwd %.3g bwd %.3g opt %.3g (%s)" % (
                  v["arch"], v["prec"], v["attn"], v["ckpt"], v["emulate"], v.get("use_cache", True), v["s"], v["h"],
                  row["per_layer_bytes_per_token"], row["saved_layer1_bytes_per_token"],
                  row["non_layer_fwd_end_bytes"], tl[2]["peak_fwd"], tl[2]["peak_bwd"], tl[2]["peak_opt"],
                  tl[2]["peak_phase"]), flush=True)
    # optimizer transients
    results["optimizers"] = []
    for optim in ("adamw-foreach", "adamw-fused", "adamw-forloop", "sgd-momentum"):
        for prec in ("fp32", "bf16-pure"):
            cfg = dict(base["llama"], prec=prec, attn="sdpa", ckpt=False, emulate=True, L=2)
            r = timeline(cfg, optim=optim)
            r["opt_transient"] = r["peak_opt"] - r["opt_start"]  # opt_start = grads (+ nothing else)
            r["opt_transient_in_param_sizes"] = r["opt_transient"] / r["P"]
            r["prec"] = prec
            results["optimizers"].append(r)
            print("optim %-14s %-9s P=%d transient=%.3f P  (peak_opt %d, opt_start %d)" % (
                optim, prec, r["P"], r["opt_transient_in_param_sizes"], r["peak_opt"], r["opt_start"]))
    results["elapsed_s"] = time.time() - t0
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
