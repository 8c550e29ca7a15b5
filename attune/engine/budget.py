"""The accelerator-hour ledger: every launched trial is charged devices × wall-clock, failures included."""

from __future__ import annotations

from collections.abc import Iterable

from attune.trial import TrialKind, TrialOutcome, TrialRecord


def charge(devices: int, wall_s: float) -> float:
    """Accelerator-hours of a trial that held ``devices`` for ``wall_s`` seconds."""
    return devices * max(wall_s, 0.0) / 3600.0


#: the outcomes whose charge says what a whole trial of a configuration costs: its whole window ran (it succeeded,
#: or its measurement was a fault). A trial stopped early (interrupted, timed out, failed) says less: a timed-out
#: hang or a trial cut by the budget's own deadline would make every later trial look that dear (the certification
#: pair of two ordinary recipes included)
COST_EVIDENCE = (TrialOutcome.SUCCEEDED, TrialOutcome.MISMEASURED)


class Budget:
    """How much of ``limit_hours`` the records have used, and whether another trial fits."""

    def __init__(self, limit_hours: float, records: Iterable[TrialRecord] = (), estimate: float | None = None,
                 reserve_hours: float = 0.0, overhead_hours: float = 0.0) -> None:
        self.limit_hours = limit_hours
        #: what a trial may cost beyond its own run: the backend's teardown allowance after a deadline
        self.overhead_hours = overhead_hours
        records = list(records)
        #: kept back from the search for the final certification runs (what those runs spent is taken off it)
        certified = sum(r.charged_hours for r in records if r.kind == TrialKind.CERTIFY)
        self.reserve_hours = max(0.0, reserve_hours - certified)
        self.costs: list[float] = [r.charged_hours for r in records if r.charged_hours > 0]
        #: what each trial that ran its whole window cost (a measurement fault ran it too): the basis of the next
        #: trial's predicted worst case
        self.complete: list[float] = [r.charged_hours for r in records
                                      if r.charged_hours > 0 and r.outcome in COST_EVIDENCE]
        self.estimate = estimate  # the backend's estimate of one trial's cost, before any has run

    @property
    def used(self) -> float:
        return sum(self.costs)

    @property
    def left(self) -> float:
        return max(self.limit_hours - self.used, 0.0)

    @property
    def search_left(self) -> float:
        """What the search may still spend: what is left, less the reserve kept for certification."""
        return max(self.left - self.reserve_hours, 0.0)

    def add(self, record: TrialRecord) -> None:
        if record.charged_hours > 0:
            self.costs.append(record.charged_hours)
            if record.outcome in COST_EVIDENCE:
                self.complete.append(record.charged_hours)

    def expected_cost(self) -> float:
        """Median cost of the trials so far (0 before any ran)."""
        if not self.costs:
            return self.estimate or 0.0
        s = sorted(self.costs)
        return s[len(s) // 2]

    def worst_case(self) -> float:
        """What the next trial may cost: the dearest trial so far that ran its whole window (a configuration can be
        that slow), else the dearest trial at all, else the backend's estimate (0 when it has none)."""
        return max(self.complete or self.costs, default=self.estimate or 0.0)

    def affords(self, trials: int = 1, *, reserved: bool = True) -> bool:
        """True while ``trials`` more trials fit in what is left (less the certification reserve unless
        ``reserved`` is false): the next at its predicted worst case, the rest at the median cost so far."""
        left = self.search_left if reserved else self.left
        need = self.worst_case() + (trials - 1) * self.expected_cost() + trials * self.overhead_hours
        return left > 0 and need <= left

    def affords_another(self) -> bool:
        """True while the next trial, at its predicted worst case, fits in what the search may still spend."""
        return self.affords(1)
