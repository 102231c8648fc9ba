"""What every candidate plan of one evaluation shares: the model, the hardware, the training stack and the
scalar part of the training setup, with the stack's tables resolved once for this model and precision."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.hardware import Hardware
from advisor.model import DecoderLayer, ModelSpec
from advisor.stack import RECOMPUTED, Stack, StackError, StackTables
from advisor.training import Attention, Optimizer, Precision, TrainingSetup


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    hw: Hardware
    stack: Stack
    seq_len: int
    precision: Precision
    attention: Attention
    optimizer: Optimizer
    layer: DecoderLayer
    tables: StackTables

    @classmethod
    def of(cls, model: ModelSpec, hw: Hardware, stack: Stack, setup: TrainingSetup) -> "Workload":
        layer = model.layer
        sel = stack.engine.selective
        if sel is not None:
            known = {lin.name for lin in layer.linears} | set(RECOMPUTED)
            unknown = [op for op in sel.recomputes if op not in known]
            if unknown:
                raise StackError(f"stack {stack.name}: its selective recomputation reruns {', '.join(unknown)}, which "
                                 f"{model.name}'s layer does not have (it has {', '.join(sorted(known))})")
        return cls(model, hw, stack, setup.seq_len, setup.precision, setup.attention, setup.optimizer, layer,
                   stack.tables(setup.precision.mode.value, setup.attention.value, layer))

    @property
    def selective_recomputes(self) -> tuple[str, ...]:
        """What the stack's selective recomputation reruns (empty: it offers none)."""
        sel = self.stack.engine.selective
        return tuple(sel.recomputes) if sel is not None else ()

    @property
    def math(self) -> str:
        return self.precision.math

    @property
    def act_bytes(self) -> float:
        return self.precision.activation_bytes

    @property
    def eager(self) -> bool:
        return self.attention is Attention.eager
