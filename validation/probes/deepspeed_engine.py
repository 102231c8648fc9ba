#!/usr/bin/env python
"""Probe: host-side (Python/CPU) overhead that the DeepSpeed training engine adds per
micro-batch, in the Megatron-DeepSpeed usage pattern (ZeRO stage 0, gradient accumulation,
no DeepSpeed dataloader; the loop calls engine(x) / engine.backward(loss) / engine.step()
once per micro-batch).

Compares, on a tiny GPT-like model on CPU (so that compute is small and host overhead shows):
  (a) plain PyTorch:  loss = model(x, y); loss.backward(); [opt.step(); opt.zero_grad()] every G
  (b) DeepSpeed:      loss = engine(x, y); engine.backward(loss); engine.step()   every micro-batch

Outputs: per-micro-batch wall-time medians (non-boundary and boundary micro-batches separately,
and per phase fwd/bwd/step), over R independent rounds (fresh model + engine per round);
perf_counter instrumentation of selected DeepSpeed functions; cProfile top DeepSpeed functions;
aten-op counts per micro-batch with a TorchDispatchMode; accelerator-API call counts
(e.g. get_accelerator().synchronize(), a no-op on the CPU accelerator, torch.cuda.synchronize()
on CUDA).

Committed output: validation/data/deepspeed_engine_probe.txt (deepspeed 0.9.5, 0.14.5, 0.19.8; torch 2.13.0 CPU,
this project's 2-core machine, 2026-11-24). Its use in the model: advisor/estimate.py counts the device syncs it
found (two synchronize() per micro-batch, and 0.9.5's loss.mean().item() before every non-final backward).
In a venv with torch==2.13.0 and `pip install --no-deps deepspeed==0.14.5` (plus its pure-Python requirements):

Run:  python validation/probes/deepspeed_engine.py [--dtype fp32|fp16|bf16]
         [--world-size 1|2] [--rounds 3] [--cycles 60] [--json out.json]
Alternative DeepSpeed versions installed with `pip install --no-deps --target DIR`:
  --ds-path DIR  (prepended to sys.path)   --legacy-compat (fake empty intel_extension_for_pytorch
  and oneccl_bindings_for_pytorch modules, which deepspeed<0.14's CPU accelerator imports but
  does not otherwise use on this code path; plus numpy.BUFSIZE, removed in numpy 2)
"""
import argparse
import collections
import cProfile
import functools
import gc
import json
import os
import pstats
import statistics
import sys
import time
import types

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("DS_BUILD_OPS", "0")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="independent repetitions (fresh model+engine)")
    p.add_argument("--cycles", type=int, default=60, help="optimizer steps (G micro-batches each) timed per block")
    p.add_argument("--blocks", type=int, default=4, help="timed cycles per round = cycles*blocks")
    p.add_argument("--warmup-cycles", type=int, default=5)
    p.add_argument("--gas", type=int, default=8)
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--profile-cycles", type=int, default=40)
    p.add_argument("--steps-per-print", type=int, default=10**9)
    p.add_argument("--ds-path", default=None)
    p.add_argument("--legacy-compat", action="store_true",
                   help="shims for deepspeed<0.14 on this stack: stub intel/oneccl modules, numpy.BUFSIZE")
    p.add_argument("--json", default=None)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--no-gc", action="store_true", help="gc.disable() during timing")
    return p.parse_args(argv)


def setup_import_path(args):
    if args.ds_path:
        sys.path.insert(0, os.path.abspath(args.ds_path))
    if args.legacy_compat:
        import numpy
        if not hasattr(numpy, "BUFSIZE"):  # removed in numpy 2; deepspeed<=0.1x autotuning imports it
            numpy.BUFSIZE = 8192
        for name in ("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch"):
            m = types.ModuleType(name)
            m.__version__ = "0.0.0-stub"
            m.__path__ = []
            sys.modules[name] = m


# ----------------------------------------------------------------------------- model
def build_model_cls():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, h, nh):
            super().__init__()
            self.nh = nh
            self.ln1 = nn.LayerNorm(h)
            self.qkv = nn.Linear(h, 3 * h)
            self.proj = nn.Linear(h, h)
            self.ln2 = nn.LayerNorm(h)
            self.fc1 = nn.Linear(h, 4 * h)
            self.fc2 = nn.Linear(4 * h, h)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
            q = q.view(b, s, self.nh, h // self.nh).transpose(1, 2)
            k = k.view(b, s, self.nh, h // self.nh).transpose(1, 2)
            v = v.view(b, s, self.nh, h // self.nh).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
            return x

    class TinyGPT(nn.Module):
        def __init__(self, vocab, seq, h, nh, nl):
            super().__init__()
            self.wte = nn.Embedding(vocab, h)
            self.wpe = nn.Embedding(seq, h)
            self.blocks = nn.ModuleList([Block(h, nh) for _ in range(nl)])
            self.ln_f = nn.LayerNorm(h)
            self.head = nn.Linear(h, vocab, bias=False)

        def forward(self, x, y):
            pos = torch.arange(x.shape[1], device=x.device)
            hdn = self.wte(x) + self.wpe(pos)
            for blk in self.blocks:
                hdn = blk(hdn)
            logits = self.head(self.ln_f(hdn))
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))

    return TinyGPT


# ----------------------------------------------------------------------------- helpers
def med(xs):
    return statistics.median(xs) if xs else float("nan")


class OpCounter:
    """TorchDispatchMode that counts aten ops (post-autograd, as they reach the backend)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.counts[str(func)] += 1
                return func(*args, **(kwargs or {}))

        self.counts = collections.Counter()
        self.mode = _Mode()

    def __enter__(self):
        self.counts = collections.Counter()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


class Instrument:
    """perf_counter wrappers around selected callables (inclusive time per call)."""

    def __init__(self):
        self.t = collections.defaultdict(float)
        self.n = collections.Counter()
        self.active = False
        self._undo = []

    def wrap(self, obj, attr, label=None):
        if not hasattr(obj, attr):
            return
        orig = getattr(obj, attr)
        label = label or f"{type(obj).__name__}.{attr}"
        inst = self

        @functools.wraps(orig)
        def w(*a, **k):
            if not inst.active:
                return orig(*a, **k)
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                inst.t[label] += time.perf_counter() - t0
                inst.n[label] += 1

        had_own = attr in getattr(obj, "__dict__", {})
        setattr(obj, attr, w)
        self._undo.append((obj, attr, orig, had_own))

    def unwrap_all(self):
        for obj, attr, orig, had_own in reversed(self._undo):
            if had_own:
                setattr(obj, attr, orig)
            else:
                try:
                    delattr(obj, attr)
                except AttributeError:
                    setattr(obj, attr, orig)
        self._undo.clear()

    def reset(self):
        self.t.clear()
        self.n.clear()


# ----------------------------------------------------------------------------- worker
def run(rank, args, result_q=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(args.world_size), LOCAL_SIZE=str(args.world_size))
    setup_import_path(args)
    import logging
    import torch
    import deepspeed
    import torch.distributed as tdist
    from deepspeed.accelerator import get_accelerator

    torch.set_num_threads(args.threads)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    try:
        from deepspeed.utils import logger as ds_logger
        ds_logger.setLevel(logging.WARNING)
    except Exception:
        pass
    if args.legacy_compat and getattr(get_accelerator(), "_communication_backend_name", None) == "ccl":
        # deepspeed<0.14 CPU accelerator would build a oneCCL op; use gloo through DS's TorchBackend,
        # the same route the CUDA accelerator takes with nccl.
        get_accelerator()._communication_backend_name = "gloo"
    if args.dtype == "fp16":
        # the CPU accelerator refuses fp16 (is_fp16_supported() -> False); let it through so the engine
        # takes the same fp16 code path (FP16_Optimizer, dynamic loss scale) as on CUDA.
        _acc = get_accelerator()
        _acc.is_fp16_supported = lambda: True
        _acc.supported_dtypes = lambda: [torch.float, torch.half, torch.bfloat16]
    deepspeed.init_distributed(dist_backend="gloo")
    ws = tdist.get_world_size()
    accel = get_accelerator()
    is0 = rank == 0

    def log(*a):
        if is0:
            print(*a, flush=True)

    TinyGPT = build_model_cls()
    G = args.gas
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]

    g = torch.Generator().manual_seed(1234 + rank)
    NB = 16
    data = [(torch.randint(0, args.vocab, (args.mbs, args.seq), generator=g),
             torch.randint(0, args.vocab, (args.mbs, args.seq), generator=g)) for _ in range(NB)]

    def new_model():
        torch.manual_seed(0)
        return TinyGPT(args.vocab, args.seq, args.hidden, args.heads, args.layers)

    def make_plain(scale_loss=False):
        m = new_model()
        if args.dtype != "fp32":
            m = m.to(dt)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
        params = [p for p in m.parameters()]
        state = {"i": 0}

        def allreduce_grads():  # minimal DP reference for world size > 1 (flat buffer, 1 all_reduce)
            grads = [p.grad for p in params if p.grad is not None]
            flat = torch._utils._flatten_dense_tensors(grads)
            flat.div_(ws)
            tdist.all_reduce(flat)
            for gg, s in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                gg.copy_(s)

        def fwd(x, y):
            return m(x, y)

        def bwd(loss):
            if scale_loss:  # what a non-DeepSpeed Megatron loop does itself (loss / num_microbatches)
                loss = loss / G
            loss.backward()

        def step():
            state["i"] += 1
            if state["i"] % G == 0:
                if ws > 1:
                    allreduce_grads()
                opt.step()
                opt.zero_grad(set_to_none=True)

        return types.SimpleNamespace(name="plain_div" if scale_loss else "plain", fwd=fwd, bwd=bwd, step=step, model=m)

    ds_cfg = {
        "train_micro_batch_size_per_gpu": args.mbs,
        "gradient_accumulation_steps": G,
        "train_batch_size": args.mbs * G * ws,
        "zero_optimization": {"stage": 0},
        "wall_clock_breakdown": False,
        "steps_per_print": args.steps_per_print,
    }
    if args.dtype == "fp16":
        ds_cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12}
    elif args.dtype == "bf16":
        ds_cfg["bf16"] = {"enabled": True}

    fp16_path_note = []

    def make_ds():
        m = new_model()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
        if args.dtype == "fp16":
            # Megatron-DeepSpeed hands DS an apex/DS FusedAdam, which selects DS's fused FP16_Optimizer
            # (flat fp32 master weights, dynamic loss scale). FusedAdam needs a compiled op, so make the
            # engine's isinstance check accept torch AdamW instead to exercise the same wrapper.
            import deepspeed.runtime.engine as E
            E.FusedAdam = torch.optim.AdamW
            if hasattr(E, "apex"):
                pass
        if args.legacy_compat:
            import contextlib
            import deepspeed.runtime.engine as E
            from deepspeed.runtime.sparse_tensor import SparseTensor
            if get_accelerator().device_name() == "cpu" and not getattr(E, "_probe_patched", False):
                # deepspeed 0.9.x builds type strings "torch.cpu.FloatTensor", which CPU tensors never
                # report ("torch.FloatTensor"), so the boundary allreduce asserts. Same logic, CPU names.
                def split_half_float_double_sparse(tensors):
                    supported_types = ["torch.HalfTensor", "torch.FloatTensor", "torch.DoubleTensor",
                                       "torch.BFloat16Tensor", SparseTensor.type()]
                    for t in tensors:
                        assert t.type() in supported_types, f"unsupported grad type: {t.type()}"
                    buckets = []
                    for i, dtype in enumerate(supported_types):
                        bucket = [t for t in tensors if t.type() == dtype]
                        if bucket:
                            buckets.append((dtype, bucket))
                    return buckets
                E.split_half_float_double_sparse = split_half_float_double_sparse
                E._probe_patched = True
            # deepspeed 0.9.x broadcasts nn.Parameters (not .data) at init; with torch 2.13 the c10d op
            # then gets recorded by autograd's not-implemented fallback. Do the init under no_grad.
            ctx = torch.no_grad()
        else:
            import contextlib
            ctx = contextlib.nullcontext()
        with ctx:
            eng, eopt, _, _ = deepspeed.initialize(model=m, optimizer=opt, config=ds_cfg)
        if not fp16_path_note:
            fp16_path_note.append(type(eng.optimizer).__name__)

        def fwd(x, y):
            return eng(x, y)

        def bwd(loss):
            eng.backward(loss)

        def step():
            eng.step()

        return types.SimpleNamespace(name="ds", fwd=fwd, bwd=bwd, step=step, model=eng.module, engine=eng)

    def timed_mb(r, x, y, boundary, record=None):
        """One micro-batch of runner r: (fwd, bwd, step, total) seconds, appended to record[(boundary, phase)]."""
        pc = time.perf_counter
        t0 = pc()
        loss = r.fwd(x, y)
        t1 = pc()
        r.bwd(loss)
        t2 = pc()
        r.step()
        t3 = pc()
        times = (t1 - t0, t2 - t1, t3 - t2, t3 - t0)
        if record is not None:
            for phase, dt in zip(("fwd", "bwd", "step", "total"), times):
                record[(boundary, phase)].append(dt)
        return times

    def cycle(r, n_cycles, record=None, k0=0):
        """Run n_cycles*G micro-batches. record: dict of lists keyed by (boundary?, phase)."""
        k = k0
        for _ in range(n_cycles):
            for j in range(G):
                x, y = data[k % NB]
                k += 1
                timed_mb(r, x, y, j == G - 1, record)
        return k

    results = {"rounds": []}
    log(f"# torch {torch.__version__}  deepspeed {deepspeed.__version__}  accelerator={accel._name}  "
        f"ws={ws}  dtype={args.dtype}  threads={torch.get_num_threads()}  G={G}  mbs={args.mbs}  seq={args.seq}  "
        f"hidden={args.hidden} layers={args.layers} vocab={args.vocab}")

    # ------------------------------------------------------------------ timing rounds
    for rnd in range(args.rounds):
        plain = make_plain()
        plain_div = make_plain(scale_loss=True)
        ds = make_ds()
        # warm-up (also makes the DS ThroughputTimer pass its start_step)
        for r in (plain, plain_div, ds):
            cycle(r, args.warmup_cycles)
        # Interleave at micro-batch granularity (random order per micro-batch) so that VM drift hits all runners alike;
        # each runner keeps its own gradient-accumulation cycle.
        runners = (plain, plain_div, ds)
        rec = {r.name: collections.defaultdict(list) for r in runners}
        pair = collections.defaultdict(list)  # paired per-micro-batch differences ds - plain
        cyc_sum = collections.defaultdict(float)
        cyc_tot = collections.defaultdict(list)
        import random
        rng = random.Random(1000 + rnd)  # same sequence on every rank
        if ws > 1:
            tdist.barrier()
        gc.collect()
        if args.no_gc:
            gc.disable()
        k = 0
        for c in range(args.cycles * args.blocks):
            for j in range(G):
                x, y = data[k % NB]
                k += 1
                b = (j == G - 1)
                tt = {}
                order = list(runners)
                rng.shuffle(order)  # random order per micro-batch: no runner always follows another's step
                for r in order:
                    tt[r.name] = timed_mb(r, x, y, b, rec[r.name])
                    cyc_sum[r.name] += tt[r.name][3]
                if b:
                    for nm_ in list(cyc_sum):
                        cyc_tot[nm_].append(cyc_sum[nm_])
                    cyc_tot["pair"].append(cyc_sum["ds"] - cyc_sum["plain"])
                    cyc_sum.clear()
                for ph_i, ph in enumerate(("fwd", "bwd", "step", "total")):
                    pair[(b, ph)].append(tt["ds"][ph_i] - tt["plain"][ph_i])
                    pair[(b, ph, "div")].append(tt["ds"][ph_i] - tt["plain_div"][ph_i])
        gc.enable()
        row = {}
        for name in ("plain", "plain_div", "ds"):
            for b in (False, True):
                for ph in ("fwd", "bwd", "step", "total"):
                    row[f"{name}.{'bnd' if b else 'nb'}.{ph}"] = med(rec[name][(b, ph)]) * 1e6
        for nm_ in ("plain", "plain_div", "ds", "pair"):
            row[f"cycle.{nm_}"] = med(cyc_tot[nm_]) * 1e6  # median over GA cycles of the sum of G micro-batches
        for b in (False, True):
            for ph in ("fwd", "bwd", "step", "total"):
                row[f"pair.{'bnd' if b else 'nb'}.{ph}"] = med(pair[(b, ph)]) * 1e6
                row[f"pairdiv.{'bnd' if b else 'nb'}.{ph}"] = med(pair[(b, ph, "div")]) * 1e6
        results["rounds"].append(row)
        nb_d = row["ds.nb.total"] - row["plain.nb.total"]
        bd_d = row["ds.bnd.total"] - row["plain.bnd.total"]
        log(f"round {rnd}: non-boundary us/mb: plain {row['plain.nb.total']:.1f}  ds {row['ds.nb.total']:.1f}  "
            f"diff {nb_d:+.1f} | boundary: plain {row['plain.bnd.total']:.1f}  ds {row['ds.bnd.total']:.1f}  diff {bd_d:+.1f}")
        log("   per phase (median us)  nb: " + "  ".join(
            f"{ph} {row['plain.nb.'+ph]:.1f}/{row['ds.nb.'+ph]:.1f}" for ph in ("fwd", "bwd", "step")) +
            "   bnd: " + "  ".join(f"{ph} {row['plain.bnd.'+ph]:.1f}/{row['ds.bnd.'+ph]:.1f}" for ph in ("fwd", "bwd", "step")))
        if hasattr(ds.engine, "skipped_steps"):
            row["ds.skipped_steps"] = int(ds.engine.skipped_steps)
            row["ds.global_steps"] = int(ds.engine.global_steps)
        log(f"   plain with loss/G (Megatron-style): nb {row['plain_div.nb.total']:.1f}  bnd {row['plain_div.bnd.total']:.1f}")
        log("   paired median diff ds-plain: nb " + "  ".join(f"{ph} {row['pair.nb.'+ph]:+.1f}" for ph in ("fwd", "bwd", "step", "total"))
            + " | bnd " + "  ".join(f"{ph} {row['pair.bnd.'+ph]:+.1f}" for ph in ("fwd", "bwd", "step", "total"))
            + f" | vs plain+loss/G: nb {row['pairdiv.nb.total']:+.1f} bnd {row['pairdiv.bnd.total']:+.1f}")
        del plain, plain_div, ds
    results["ds_optimizer_wrapper"] = fp16_path_note[0] if fp16_path_note else None
    log(f"# DS engine optimizer object: {results['ds_optimizer_wrapper']}")

    # summary across rounds
    def spread(key):
        v = [r[key] for r in results["rounds"]]
        return med(v), min(v), max(v)

    summ = {}
    for key in results["rounds"][0]:
        summ[key] = spread(key)
    for part in ("nb", "bnd"):
        for ph in ("fwd", "bwd", "step", "total"):
            v = [r[f"ds.{part}.{ph}"] - r[f"plain.{part}.{ph}"] for r in results["rounds"]]
            summ[f"diff.{part}.{ph}"] = (med(v), min(v), max(v))
            v = [r[f"ds.{part}.{ph}"] - r[f"plain_div.{part}.{ph}"] for r in results["rounds"]]
            summ[f"diffdiv.{part}.{ph}"] = (med(v), min(v), max(v))
    results["summary"] = summ
    log("\n== summary over rounds: median [min..max] microseconds per micro-batch")
    for part, lab in (("nb", "non-boundary"), ("bnd", "boundary")):
        for ph in ("total", "fwd", "bwd", "step"):
            a, b_, d = summ[f"plain.{part}.{ph}"], summ[f"ds.{part}.{ph}"], summ[f"diff.{part}.{ph}"]
            log(f"  {lab:12s} {ph:5s}  (a) plain {a[0]:8.1f} [{a[1]:.1f}..{a[2]:.1f}]   (b) ds {b_[0]:8.1f} "
                f"[{b_[1]:.1f}..{b_[2]:.1f}]   (b)-(a) {d[0]:+8.1f} [{d[1]:+.1f}..{d[2]:+.1f}]")
    c = {n_: summ[f"cycle.{n_}"] for n_ in ("plain", "plain_div", "ds", "pair")}
    log(f"  full GA cycle ({G} micro-batches, sum): plain {c['plain'][0]:.1f} [{c['plain'][1]:.1f}..{c['plain'][2]:.1f}]  "
        f"ds {c['ds'][0]:.1f} [{c['ds'][1]:.1f}..{c['ds'][2]:.1f}]  paired ds-plain {c['pair'][0]:+.1f} "
        f"[{c['pair'][1]:+.1f}..{c['pair'][2]:+.1f}]  => {c['pair'][0] / G:+.1f} us per micro-batch averaged over the cycle")
    log("  paired (per micro-batch, same data, interleaved) median of ds - plain:")
    for part, lab in (("nb", "non-boundary"), ("bnd", "boundary")):
        log(f"  {lab:12s} " + "  ".join(f"{ph} {summ[f'pair.{part}.{ph}'][0]:+7.1f} [{summ[f'pair.{part}.{ph}'][1]:+.1f}..{summ[f'pair.{part}.{ph}'][2]:+.1f}]" for ph in ("total", "fwd", "bwd", "step")))
    for part, lab in (("nb", "non-boundary"), ("bnd", "boundary")):
        log(f"  {lab:12s} paired ds - (plain+loss/G): total {summ[f'pairdiv.{part}.total'][0]:+7.1f} [{summ[f'pairdiv.{part}.total'][1]:+.1f}..{summ[f'pairdiv.{part}.total'][2]:+.1f}]")
    for part, lab in (("nb", "non-boundary"), ("bnd", "boundary")):
        a, d = summ[f"plain_div.{part}.total"], summ[f"diffdiv.{part}.total"]
        log(f"  {lab:12s} total  (a') plain+loss/G {a[0]:8.1f} [{a[1]:.1f}..{a[2]:.1f}]   (b)-(a') {d[0]:+8.1f} [{d[1]:+.1f}..{d[2]:+.1f}]")

    # ------------------------------------------------------------------ machine calibration
    def _noop(*a, **k):
        return None

    def _bench(f, n=20000):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return med(ts) * 1e6

    base = _bench(lambda: None)
    calib = {"python_noop_call_us": _bench(lambda: _noop(1, 2)) - base}
    _t = torch.ones(())
    calib["aten_add_scalar_tensor_us"] = _bench(lambda: _t + _t) - base
    _w = torch.ones(4, requires_grad=True)
    calib["aten_mul_requires_grad_us"] = _bench(lambda: _w * 2) - base
    _inst = Instrument()
    _h = types.SimpleNamespace(f=_noop)
    _inst.wrap(_h, "f")
    _inst.active = True
    calib["instrument_wrapper_overhead_us"] = _bench(lambda: _h.f(1, 2)) - base - calib["python_noop_call_us"]
    results["calibration"] = calib
    log("\n== calibration on this machine (median us): " + ", ".join(f"{k_}={v_:.3f}" for k_, v_ in calib.items()))

    # ------------------------------------------------------------------ aten op counts
    plain = make_plain()
    ds = make_ds()
    cycle(plain, args.warmup_cycles)
    cycle(ds, args.warmup_cycles)
    opc = OpCounter()
    op_res = {}
    x, y = data[0]
    for r in (plain, ds):
        per_mb = []
        for j in range(G):
            with opc:
                loss = r.fwd(x, y)
                r.bwd(loss)
                r.step()
            per_mb.append(collections.Counter(opc.counts))
        op_res[r.name] = per_mb
    results["aten_ops"] = {}
    log("\n== aten ops per micro-batch (TorchDispatchMode)")
    for part, idx in (("non-boundary (mb 0)", 0), ("non-boundary (mb 3)", 3), ("boundary (mb G-1)", G - 1)):
        a, b_ = op_res["plain"][idx], op_res["ds"][idx]
        diff = {k: b_.get(k, 0) - a.get(k, 0) for k in set(a) | set(b_) if b_.get(k, 0) != a.get(k, 0)}
        log(f"  {part:20s}: plain {sum(a.values())}  ds {sum(b_.values())}  extra {sum(b_.values()) - sum(a.values()):+d}")
        for k, v in sorted(diff.items(), key=lambda kv: (-abs(kv[1]), kv[0])):
            log(f"      {v:+4d}  {k}")
        syncs = {nm_: {k_: v_ for k_, v_ in c_.items() if "_local_scalar_dense" in k_ or k_.startswith("c10d.")}
                 for nm_, c_ in (("plain", a), ("ds", b_))}
        log(f"      host-sync/collective ops (absolute): plain {syncs['plain']}  ds {syncs['ds']}")
        results["aten_ops"][part] = {"plain": sum(a.values()), "ds": sum(b_.values()), "diff": diff, "sync_ops": syncs}
    # full listing of the plain non-boundary ops for reference
    results["aten_ops"]["plain_nb_full"] = dict(op_res["plain"][0])

    # ------------------------------------------------------------------ accelerator API calls per micro-batch
    acc_calls = collections.Counter()
    acc_undo = []
    import inspect
    for nm in dir(accel):
        if nm.startswith("_"):
            continue
        if not inspect.isfunction(inspect.getattr_static(type(accel), nm, None)):
            continue  # skip properties / tensor-type attributes
        f = getattr(accel, nm)

        def mk(f, nm):
            @functools.wraps(f)
            def w(*a, **k):
                acc_calls[nm] += 1
                return f(*a, **k)
            return w
        acc_undo.append((nm, accel.__dict__.get(nm)))
        setattr(accel, nm, mk(f, nm))
    acc_nb, acc_b = collections.Counter(), collections.Counter()
    for j in range(G):
        acc_calls.clear()
        loss = ds.fwd(x, y)
        ds.bwd(loss)
        ds.step()
        (acc_b if j == G - 1 else acc_nb).update(acc_calls)
    for nm, prev in acc_undo:
        if prev is None:
            delattr(accel, nm)
        else:
            setattr(accel, nm, prev)
    acc_nb = {k: v / (G - 1) for k, v in acc_nb.items()}
    results["accelerator_calls"] = {"non_boundary_per_mb": acc_nb, "boundary_mb": dict(acc_b)}
    log("\n== get_accelerator() method calls by the engine (incl. inside torch-free helpers)")
    log(f"  non-boundary, per micro-batch: {acc_nb}")
    log(f"  boundary micro-batch:          {dict(acc_b)}")

    # ------------------------------------------------------------------ perf_counter instrumentation
    eng = ds.engine
    inst = Instrument()
    from deepspeed.runtime import engine as E
    targets = [(eng, "forward"), (eng, "backward"), (eng, "step"), (eng, "allreduce_gradients"),
               (eng, "_take_model_step"), (eng, "is_gradient_accumulation_boundary"),
               (eng, "_scale_loss_by_gas"), (eng, "buffered_allreduce_fallback"), (eng, "_start_timers"),
               (eng, "_stop_timers"), (eng, "zero_grad"), (eng, "_reduce_non_expert_gradients"),
               (eng, "_get_gradients_for_reduction"), (eng, "allreduce_no_retain"),
               (eng, "allreduce_and_copy"), (eng, "allreduce_bucket"),
               (eng.tput_timer, "start"), (eng.tput_timer, "stop"),
               (eng.module, "forward"), (eng.optimizer, "step"), (eng.optimizer, "backward"),
               (eng.optimizer, "zero_grad")]
    if hasattr(eng, "flops_profiler_enabled"):
        targets.append((eng, "flops_profiler_enabled"))
    for o, a in targets:
        inst.wrap(o, a, label=("module." if o is eng.module else "") + f"{type(o).__name__}.{a}")
    # see_memory_usage is a module-level function referenced from engine's globals
    if hasattr(E, "see_memory_usage"):
        orig_smu = E.see_memory_usage
        holder = types.SimpleNamespace(see_memory_usage=orig_smu)
        inst.wrap(holder, "see_memory_usage", label="utils.see_memory_usage")
        E.see_memory_usage = holder.see_memory_usage
    # loss.backward inside engine: wrap torch.Tensor.backward
    inst.wrap(torch.Tensor, "backward", label="torch.Tensor.backward")
    inst_res = {}
    for lab, idxs in (("non-boundary", range(G - 1)), ("boundary", [G - 1])):
        pass
    t_nb, t_b = collections.defaultdict(float), collections.defaultdict(float)
    n_nb, n_b = collections.Counter(), collections.Counter()
    n_cyc = args.profile_cycles
    k = 0
    for c in range(n_cyc):
        for j in range(G):
            inst.reset()
            inst.active = True
            xx, yy = data[k % NB]
            k += 1
            loss = ds.fwd(xx, yy)
            ds.bwd(loss)
            ds.step()
            inst.active = False
            T, N = (t_b, n_b) if j == G - 1 else (t_nb, n_nb)
            for key, v in inst.t.items():
                T[key] += v
            N.update(inst.n)
    inst.unwrap_all()
    if hasattr(E, "see_memory_usage"):
        E.see_memory_usage = orig_smu
    log("\n== perf_counter instrumentation (inclusive time; us per micro-batch, calls per micro-batch)")
    nnb = n_cyc * (G - 1)
    nb_ = n_cyc
    inst_res = {"non_boundary": {}, "boundary": {}}
    keys = sorted(set(t_nb) | set(t_b), key=lambda kk: -(t_nb.get(kk, 0) / nnb))
    log(f"  {'function':55s} {'nb us/mb':>9s} {'nb calls':>8s} {'bnd us':>9s} {'bnd calls':>9s}")
    for kk in keys:
        a1, c1 = t_nb.get(kk, 0) / nnb * 1e6, n_nb.get(kk, 0) / nnb
        a2, c2 = t_b.get(kk, 0) / nb_ * 1e6, n_b.get(kk, 0) / nb_
        inst_res["non_boundary"][kk] = (a1, c1)
        inst_res["boundary"][kk] = (a2, c2)
        log(f"  {kk:55s} {a1:9.1f} {c1:8.2f} {a2:9.1f} {c2:9.2f}")
    results["instrumentation_us_calls_per_mb"] = inst_res

    # ------------------------------------------------------------------ cProfile
    if not args.no_profile:
        prof_nb, prof_b = cProfile.Profile(), cProfile.Profile()
        for r, tag in ((plain, "plain"), (ds, "ds")):
            p_nb, p_b = cProfile.Profile(), cProfile.Profile()
            k = 0
            for c in range(n_cyc):
                for j in range(G):
                    p = p_b if j == G - 1 else p_nb
                    xx, yy = data[k % NB]
                    k += 1
                    p.enable()
                    loss = r.fwd(xx, yy)
                    r.bwd(loss)
                    r.step()
                    p.disable()
            if tag == "ds":
                prof_nb, prof_b = p_nb, p_b
            else:
                plain_nb, plain_b = p_nb, p_b
        results["cprofile"] = {}
        for lab, p, n_mb in (("non-boundary", prof_nb, nnb), ("boundary", prof_b, nb_)):
            st = pstats.Stats(p)
            rows = []
            for (fn, ln, func), (cc, nc, tt, ct, callers) in st.stats.items():
                if "deepspeed" in fn:
                    short = fn.split("deepspeed/", 1)[-1]
                    rows.append((f"{short}:{ln}({func})", nc / n_mb, tt / n_mb * 1e6, ct / n_mb * 1e6))
            tot = sum(v[2] for v in st.stats.values()) / n_mb * 1e6
            ds_self = sum(r_[2] for r_ in rows)
            log(f"\n== cProfile, DeepSpeed functions, {lab} micro-batches (profiled total {tot:.1f} us/mb; "
                f"self time in deepspeed/* files {ds_self:.1f} us/mb; cProfile inflates Python-call costs)")
            log(f"  {'function':70s} {'calls/mb':>8s} {'self us/mb':>10s} {'cum us/mb':>10s}")
            rows.sort(key=lambda r_: -r_[3])
            for r_ in rows[:30]:
                log(f"  {r_[0][:70]:70s} {r_[1]:8.2f} {r_[2]:10.2f} {r_[3]:10.2f}")
            results["cprofile"][lab] = {"total_us_per_mb": tot, "ds_self_us_per_mb": ds_self,
                                        "top_by_cum": rows[:40],
                                        "top_by_self": sorted(rows, key=lambda r_: -r_[2])[:40]}
            log("  -- top by self time:")
            for r_ in sorted(rows, key=lambda r_: -r_[2])[:15]:
                log(f"  {r_[0][:70]:70s} {r_[1]:8.2f} {r_[2]:10.2f} {r_[3]:10.2f}")
        for lab, p, n_mb in (("non-boundary", plain_nb, nnb), ("boundary", plain_b, nb_)):
            st = pstats.Stats(p)
            tot = sum(v[2] for v in st.stats.values()) / n_mb * 1e6
            log(f"  (plain loop under cProfile, {lab}: {tot:.1f} us/mb)")
            results["cprofile"][f"plain_{lab}_total_us_per_mb"] = tot

    results["meta"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "accelerator": accel._name,
                       "world_size": ws, "dtype": args.dtype, "threads": torch.get_num_threads(), "args": vars(args),
                       "python": sys.version.split()[0]}
    if is0 and args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
        log(f"\n# wrote {args.json}")
    tdist.barrier() if ws > 1 else None
    return results


def main():
    args = parse_args()
    if args.world_size == 1:
        run(0, args)
    else:
        import torch.multiprocessing as mp
        mp.spawn(run, args=(args,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
