"""advisor: an analytical cost model and parallelism-plan advisor for training transformers on many GPUs.

Three typed inputs (ModelSpec, Hardware, Plan + TrainingSetup), pure functions over them, and results
that are named breakdowns. ``estimate`` answers for one plan, ``plan`` searches every valid plan.
"""

from advisor.api import Estimate, MemoryReport, estimate
from advisor.hardware import Hardware, list_profiles, load_hardware
from advisor.model import ModelSpec, list_models, load_model
from advisor.plans import Plan, TrainingSetup

__version__ = "0.1.0"


def plan(*args, **kwargs):
    """Search every valid plan and return them ranked (see advisor.search.plan)."""
    from advisor.search import plan as _plan

    return _plan(*args, **kwargs)


__all__ = [
    "Estimate",
    "Hardware",
    "MemoryReport",
    "ModelSpec",
    "Plan",
    "TrainingSetup",
    "estimate",
    "list_models",
    "list_profiles",
    "load_hardware",
    "load_model",
    "plan",
]
