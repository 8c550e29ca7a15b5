"""The accelerator-hour ledger: every launched trial is charged devices × wall-clock, failures included."""

from __future__ import annotations

from collections.abc import Iterable

from attune.engine.state import TrialRecord


def charge(devices: int, wall_s: float) -> float:
    """Accelerator-hours of a trial that held ``devices`` for ``wall_s`` seconds."""
    return devices * max(wall_s, 0.0) / 3600.0


class Budget:
    """How much of ``limit_hours`` the records have used, and whether another trial fits."""

    def __init__(self, limit_hours: float, records: Iterable[TrialRecord] = (), estimate: float | None = None) -> None:
        self.limit_hours = limit_hours
        self.costs: list[float] = [r.charged_hours for r in records if r.charged_hours > 0]
        self.estimate = estimate  # the backend's estimate of one trial's cost, before any has run

    @property
    def used(self) -> float:
        return sum(self.costs)

    @property
    def left(self) -> float:
        return max(self.limit_hours - self.used, 0.0)

    def add(self, record: TrialRecord) -> None:
        if record.charged_hours > 0:
            self.costs.append(record.charged_hours)

    def expected_cost(self) -> float:
        """Median cost of the trials so far (0 before any ran)."""
        if not self.costs:
            return self.estimate or 0.0
        s = sorted(self.costs)
        return s[len(s) // 2]

    def affords(self, trials: int = 1) -> bool:
        """True while ``trials`` more trials, at the expected cost, fit in what is left."""
        return self.left > 0 and trials * self.expected_cost() <= self.left

    def affords_another(self) -> bool:
        """True while the next trial, at the median cost so far (or the backend's estimate), fits in what is left."""
        return self.affords(1)
