"""Accelerator-hours per namespace and period: the platform's quota, not a run's own budget (issue 39, item 8).

A run's ``spec.budget.acceleratorHours`` is whatever its writer typed; the platform sets what a namespace may spend
in a calendar period (UTC day, ISO week or month): ``--hours-quota NAMESPACE=HOURS/PERIOD`` (repeatable, ``*`` for
every namespace not named; the chart's ``operator.hoursQuotas``). What each namespace spent is kept in a ledger the
tenants cannot edit: the ConfigMap :data:`LEDGER` in the operator's own namespace, one key per namespace, counted
once per trial record (the run's uid and the trial's id), whatever later happens to the run or its trials.

It is enforced twice: at admission, a run (or an edit raising its budget) asking for more hours than the namespace
has left this period is refused; at each trial, a run whose namespace has spent its quota launches no new trial until
the period ends (``Reconciling=True``, reason ``HoursQuotaSpent``; the trial in flight finishes, so a namespace can
overshoot by the trials in flight when the quota ran out).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

#: the ledger ConfigMap, in the operator's own namespace
LEDGER = "attune-hours-ledger"
#: trial records remembered per namespace as already counted (a retried write is not counted twice)
COUNTED_KEPT = 500

_NAMESPACE = re.compile(r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$")
_QUOTA = re.compile(r"^(\d+(\.\d+)?)/(day|week|month)$")


class Period(str, Enum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"

    def bounds(self, now: float) -> tuple[str, float]:
        """The period holding ``now`` (UTC): its key (``2026-12-07``, ``2026-W50``, ``2026-12``) and when it ends."""
        t = datetime.fromtimestamp(now, UTC)
        day = t.replace(hour=0, minute=0, second=0, microsecond=0)
        if self is Period.DAY:
            return day.strftime("%Y-%m-%d"), (day + timedelta(days=1)).timestamp()
        if self is Period.WEEK:
            year, week, weekday = t.isocalendar()
            return f"{year}-W{week:02d}", (day + timedelta(days=8 - weekday)).timestamp()
        month = day.replace(day=1)
        end = month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)
        return month.strftime("%Y-%m"), end.timestamp()


@dataclass(frozen=True)
class HoursQuota:
    hours: float
    period: Period

    def __str__(self) -> str:
        return f"{self.hours:g} accelerator-hours a {self.period.value}"


@dataclass(frozen=True)
class Left:
    """What a namespace has left of its quota in the current period."""

    quota: HoursQuota
    used: float
    ends: float  #: when the period ends (Unix time)

    @property
    def hours(self) -> float:
        return max(self.quota.hours - self.used, 0.0)

    def says(self, namespace: str) -> str:
        until = datetime.fromtimestamp(self.ends, UTC).strftime("%Y-%m-%d %H:%M UTC")
        return (f"namespace {namespace} has {self.hours:.4g} of its {self.quota} left ({self.used:.4g} spent this "
                f"{self.quota.period.value}, which ends {until}; the platform's --hours-quota, the chart's "
                f"operator.hoursQuotas)")


def parse(items: Iterable[str]) -> dict[str, HoursQuota]:
    """``NAMESPACE=HOURS/PERIOD`` items as a mapping; :class:`ValueError` naming the first bad item and the form."""
    out: dict[str, HoursQuota] = {}
    for item in items:
        ns, sep, spec = (part.strip() for part in item.partition("="))
        m = _QUOTA.match(spec)
        if not sep or not _NAMESPACE.match(ns) or m is None:
            raise ValueError(f"--hours-quota {item!r}: expected NAMESPACE=HOURS/PERIOD (a namespace or *, then "
                             "accelerator-hours and day, week or month, e.g. ml=200/month)")
        if ns in out:
            raise ValueError(f"--hours-quota: namespace {ns} is given twice")
        out[ns] = HoursQuota(float(m.group(1)), Period(m.group(3)))
    return out


def quota_for(quotas: dict[str, HoursQuota], namespace: str) -> HoursQuota | None:
    return quotas.get(namespace) or quotas.get("*")


def entry_of(data: dict[str, str] | None, namespace: str) -> dict[str, Any]:
    """A namespace's ledger entry (``period``, ``hours``, ``counted``) from the ConfigMap's data; an unreadable one
    counts as empty (the ledger is the operator's own: only a hand edit could break it)."""
    try:
        entry = json.loads((data or {}).get(namespace) or "{}")
    except ValueError:
        return {}
    return entry if isinstance(entry, dict) else {}


def left(quota: HoursQuota, entry: dict[str, Any], now: float) -> Left:
    key, ends = quota.period.bounds(now)
    used = float(entry.get("hours") or 0.0) if entry.get("period") == key else 0.0
    return Left(quota, used, ends)


def add(entry: dict[str, Any], hours: float, counted_as: str, period: Period, now: float) -> dict[str, Any] | None:
    """``entry`` with ``hours`` more spent in the period of ``now`` (a new period starts from zero); None when
    ``counted_as`` (the run's uid and the trial's id) was counted already."""
    key, _ = period.bounds(now)
    if entry.get("period") != key:
        entry = {"period": key, "hours": 0.0, "counted": []}
    counted = list(entry.get("counted") or [])
    if counted_as in counted:
        return None
    return {"period": key, "hours": round(float(entry.get("hours") or 0.0) + hours, 6),
            "counted": (counted + [counted_as])[-COUNTED_KEPT:]}


class Unledgered:
    """Charged trials not yet counted in the ledger, per namespace: written in order, each once (the ledger skips a
    key it counted), and a write that failed is tried again at the namespace's next step, never dropped."""

    def __init__(self) -> None:
        self.owed: dict[str, list[tuple[str, float]]] = {}

    def settle(self, namespace: str, new: Iterable[tuple[str, float]],
               write: Callable[[str, float], None]) -> Exception | None:
        """Owe ``new`` (``(counted_as, hours)`` items) and write what is owed; the first failure stops there and is
        returned (the rest stays owed)."""
        owed = self.owed.setdefault(namespace, [])
        owed += [(key, hours) for key, hours in new if hours > 0]
        while owed:
            key, hours = owed[0]
            try:
                write(key, hours)
            except Exception as err:
                return err
            owed.pop(0)
        return None


def admission_problem(namespace: str, requested: float | None, before: float | None, room: Left | None) -> str | None:
    """Why a run asking for ``requested`` accelerator-hours (``before``: what it had, on an edit) must be refused
    (None: no quota, or it fits what the namespace has left this period)."""
    if room is None or requested is None:
        return None
    more = requested - (before or 0.0)
    if more <= 0:
        return None
    if more > room.hours + 1e-9:
        what = "spec.budget.acceleratorHours" + (f" raised by {more:.4g}" if before else f" = {requested:g}")
        return (f"{what} exceeds the accelerator-hours quota: {room.says(namespace)}; ask for at most "
                f"{room.hours + (before or 0.0):.4g}, or wait for the next {room.quota.period.value}")
    return None
