"""The gate's answer to one proposed recipe: admitted or refused, why, and which checks are still owed.

A :class:`Verdict` is data. The engine journals it, the CLI prints it, and the Kubernetes admission
webhook turns it into an ``AdmissionReview`` response, so it serialises to JSON losslessly and renders
to one screen of text for people.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from attune.recipe.catalogue import Semantics, format_value

#: the empirical check a numerics-drifting or opted-in numerics-changing change must still pass
LOSS_EQUIVALENCE = "loss_equivalence"


class ReasonCode:
    """The reason codes a :class:`Reason` may carry (stable strings; tests and dashboards match on them)."""

    INVALID_RECIPE = "invalid_recipe"  #: the candidate does not validate as a recipe at all
    UNKNOWN_KNOB = "unknown_knob"  #: a knob outside the framework's catalogue
    ILLEGAL_VALUE = "illegal_value"  #: a catalogue knob set to a value outside its domain
    CONSTRAINT = "constraint"  #: a catalogue constraint (divisibility, compatibility) is violated
    CONTRACT = "contract"  #: the effective training contract differs from the baseline
    OPT_IN_CHANGED = "opt_in_changed"  #: training.numerics_opt_in itself was edited
    CONTRACT_KNOB = "contract_knob"  #: a knob whose change alters what is learned
    NUMERICS_NOT_OPTED_IN = "numerics_not_opted_in"  #: a numerics-changing knob without owner opt-in
    REPEAT = "repeat"  #: this exact configuration was already tried
    MULTIPLE_GROUPS = "multiple_groups"  #: more than one coupling group changed at once
    # refusals of the run rather than the rule set: the engine records them as the gate's, at no cost
    OUTSIDE_SEARCH_SPACE = "outside_search_space"  #: a knob the run's tuning.search_space does not name
    BUDGET = "budget"  #: the budget left cannot pay for the candidate's decision at its predicted worst case

    ALL = (INVALID_RECIPE, UNKNOWN_KNOB, ILLEGAL_VALUE, CONSTRAINT, CONTRACT, OPT_IN_CHANGED, CONTRACT_KNOB,
           NUMERICS_NOT_OPTED_IN, REPEAT, MULTIPLE_GROUPS, OUTSIDE_SEARCH_SPACE, BUDGET)


class Reason(BaseModel):
    """Why a candidate was refused: a stable code, the field at fault, and a message with both values and the fix."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str = Field(description="stable reason code, one of ReasonCode.ALL")
    field: str = Field(description="dotted path of the offending field, e.g. training.optimizer.lr or knobs.NAME")
    message: str = Field(description="what is wrong: the field, the baseline and candidate values, and the fix")

    def render(self) -> str:
        """One line: ``[code] field: message``."""
        return f"[{self.code}] {self.field}: {self.message}"


_SEMANTICS_RANK = {
    Semantics.PRESERVING: 0,
    Semantics.NUMERICS_DRIFT: 1,
    Semantics.NUMERICS_CHANGING: 2,
    Semantics.CONTRACT: 3,
}


def worst_semantics(classes: list[Semantics]) -> Semantics:
    """The most consequential semantics class among ``classes`` (preserving when empty)."""
    return max(classes, key=_SEMANTICS_RANK.__getitem__, default=Semantics.PRESERVING)


class Verdict(BaseModel):
    """The gate's decision on one candidate recipe."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    admitted: bool = Field(description="true when the candidate may run; false when it is refused")
    reasons: list[Reason] = Field(default_factory=list, description="every reason for refusal (empty if admitted)")
    owed: list[str] = Field(
        default_factory=list, description="checks the candidate still owes before it may be kept, e.g. loss_equivalence"
    )
    changed_knobs: dict[str, tuple[Any, Any]] = Field(
        default_factory=dict, description="knob name → (parent value, candidate value), effective values (as proposed, "
                                          "even when a proposal's value is no legal knob value at all)"
    )
    changed_groups: list[str] = Field(default_factory=list, description="coupling groups the change touches")
    semantics: Semantics = Field(
        default=Semantics.PRESERVING, description="the most consequential semantics class of the change"
    )

    @property
    def refused(self) -> bool:
        return not self.admitted

    @property
    def codes(self) -> list[str]:
        """The reason codes, in order."""
        return [r.code for r in self.reasons]

    def to_json(self, indent: int | None = 2) -> str:
        """The verdict as JSON (round-trips through ``Verdict.model_validate_json``)."""
        return self.model_dump_json(indent=indent)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.model_dump_json())
        return data

    def summary(self) -> str:
        """One line: the decision, the change and what it owes."""
        change = ", ".join(f"{k}={format_value(new)}" for k, (_, new) in self.changed_knobs.items()) or "no knob change"
        if self.admitted:
            owes = f"; owes {', '.join(self.owed)}" if self.owed else "; nothing owed"
            return f"ADMITTED {change} ({self.semantics.value}{owes})"
        return f"REFUSED {change}: {len(self.reasons)} reason{'s' if len(self.reasons) != 1 else ''}"

    def render(self, max_reasons: int = 12) -> str:
        """A one-screen human rendering: the decision, the knob changes, the owed checks and every reason."""
        lines = [self.summary()]
        for name, (old, new) in self.changed_knobs.items():
            lines.append(f"  knobs.{name}: {format_value(old)} → {format_value(new)}")
        if self.changed_groups:
            lines.append(f"  coupling groups: {', '.join(self.changed_groups)}")
        lines.append(f"  semantics: {self.semantics.value}")
        if self.owed:
            lines.append(f"  owed checks: {', '.join(self.owed)}")
        if self.reasons:
            lines.append("  reasons:")
            for r in self.reasons[:max_reasons]:
                lines.append(f"  - {r.render()}")
            if len(self.reasons) > max_reasons:
                lines.append(f"  … and {len(self.reasons) - max_reasons} more (use --json to see all)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


