"""advisor probe (issue 15): a training stack's own model code, built from the installed library for a small
config of a model family, run forward and backward on CPU, and measured into the part of a stack profile that can
be measured there (advisor.probe.core). torch and the stack's library are imported only inside functions; the cost
model never imports this package.

What cannot be probed on CPU (kernel times, NCCL's behaviour, the host's CPU time per op) stays in the profiles from
the library's source or from microbenchmarks, cited there.
"""

from __future__ import annotations

import importlib

from advisor.probe.solve import ProbeError

# stack profile name -> the adapter class that probes it (advisor/probe/adapters/)
ADAPTERS = {
    "hf-trainer": "advisor.probe.adapters.hf:HFTrainer",
    "torchtitan": "advisor.probe.adapters.torchtitan:Torchtitan",
    "torchtitan-0.1": "advisor.probe.adapters.torchtitan:TorchtitanComposite",
    "megatron-core": "advisor.probe.adapters.megatron_core:MegatronCore",
}


def adapter_for(stack: str):
    """The probe adapter of a stack, by profile name; a one-line error naming the probeable stacks otherwise."""
    if stack not in ADAPTERS:
        raise ProbeError(f"no probe for stack {stack!r}: probeable stacks are {', '.join(sorted(ADAPTERS))}")
    module, cls = ADAPTERS[stack].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["ADAPTERS", "ProbeError", "adapter_for"]
