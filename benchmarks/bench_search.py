"""Benchmark of the plan search: candidates costed per second (not a timed test). The figure the README quotes is
evaluate()'s on every candidate of the GPT-3 175B / 1,536-GPU space, one core, best of --repeat runs.

    python benchmarks/bench_search.py [--model gpt3-175b] [--hw dgx-a100] [--gpus 1536] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    from advisor import allocator
    from advisor.hardware import load_hardware
    from advisor.model import load_model
    from advisor.search import plan
    from advisor.space import enumerate_candidates
    from advisor.step import evaluate
    from advisor.training import TrainingSetup
    from advisor.workload import Workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--hw", default="dgx-a100")
    ap.add_argument("--gpus", type=int, default=1536)
    ap.add_argument("--global-batch", type=int, default=1536)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stack", default="megatron-deepspeed", help="a stack, or any (every stack describing the model)")
    ap.add_argument("--untuned", action="store_true", help="leave glibc's allocator as it is (the CLI tunes it: "
                    "advisor/allocator.py)")
    a = ap.parse_args()
    tuned = False if a.untuned else allocator.tune()  # as `advisor` does at start
    m, hw = load_model(a.model), load_hardware(a.hw)
    t0 = time.perf_counter()
    res = plan(m, hw, gpus=a.gpus, global_batch=a.global_batch, seq=a.seq, stack=a.stack)
    t_plan = time.perf_counter() - t0
    cols = enumerate_candidates(a.gpus, a.global_batch, a.gpus > hw.gpus_per_node)
    n = len(cols)
    setup = TrainingSetup(seq_len=a.seq, global_batch=a.global_batch)
    workloads = [Workload.of(m, hw, s, setup) for s in res.stacks]
    n *= len(workloads)
    best = float("inf")
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        for w in workloads:
            evaluate(w, cols)
        best = min(best, time.perf_counter() - t0)
    fit_rejected = res.rejected.get("does not fit in memory", 0)
    evaluated = res.candidates - sum(res.rejected.values()) + fit_rejected
    print(f"{a.model} on {a.gpus}x {a.hw}, stacks {', '.join(s.name for s in res.stacks)} "
          f"(allocator {'tuned as the CLI tunes it' if tuned else 'as the system set it'}):")
    print(f"  advisor plan: {t_plan:.3f} s wall; {res.candidates:,} candidates considered, {evaluated:,} of them "
          "costed (the others break a constraint, most counted without being built)")
    print(f"  evaluate() alone on every candidate (constraints not applied): {n:,} in {best * 1e3:.1f} ms "
          f"(best of {a.repeat}) = {n / best:,.0f} candidates/s  <- the cost model's speed the README quotes (its second figure)")


if __name__ == "__main__":
    main()
