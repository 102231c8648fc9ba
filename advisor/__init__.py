"""advisor: an analytical cost model and parallelism-plan advisor for training transformers on many GPUs.

Typed inputs (ModelSpec, Hardware, Stack, Plan + TrainingSetup), pure functions over them, and results
that are named breakdowns. ``estimate`` answers for one plan, ``plan`` searches every valid plan.
"""

from advisor.api import estimate, launch_config
from advisor.hardware import Hardware, list_profiles, load_hardware
from advisor.layout import Layout, Plan
from advisor.model import ModelSpec, list_models, load_model
from advisor.precision_search import rank_precisions
from advisor.ranking import PlanSearch, RankedPlan
from advisor.results import Estimate, MemoryReport
from advisor.search import plan
from advisor.stack import Stack, list_stacks, load_stack
from advisor.training import TrainingSetup

__version__ = "0.1.0"

__all__ = [
    "Estimate",
    "Hardware",
    "Layout",
    "MemoryReport",
    "ModelSpec",
    "Plan",
    "PlanSearch",
    "RankedPlan",
    "Stack",
    "TrainingSetup",
    "estimate",
    "launch_config",
    "list_models",
    "list_profiles",
    "list_stacks",
    "load_hardware",
    "load_model",
    "load_stack",
    "plan",
    "rank_precisions",
]
