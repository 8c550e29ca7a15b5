"""The correctness gate: admits a tuned recipe only if it trains the same model as the user's baseline.

``evaluate`` is the single pure rule set (engine, CLI and admission webhook all call it);
``compare_losses`` / ``derive_tolerance`` are the pure half of the empirical loss-equivalence check.
"""

from __future__ import annotations

from attune.gate.equivalence import (
    EquivalenceResult,
    ReorderBound,
    Tolerance,
    compare_losses,
    derive_tolerance,
    first_step_problem,
)
from attune.gate.rules import effective_contract, enforce, equivalent_layout, evaluate
from attune.gate.sets import SetError, apply_sets
from attune.gate.verdict import LOSS_EQUIVALENCE, Reason, ReasonCode, Verdict

__all__ = [
    "LOSS_EQUIVALENCE",
    "EquivalenceResult",
    "Reason",
    "ReasonCode",
    "ReorderBound",
    "SetError",
    "Tolerance",
    "Verdict",
    "apply_sets",
    "compare_losses",
    "derive_tolerance",
    "effective_contract",
    "enforce",
    "equivalent_layout",
    "evaluate",
    "first_step_problem",
]
