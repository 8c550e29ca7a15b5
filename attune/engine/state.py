"""A tuning run's configuration and its state: what it was asked (:class:`TuneConfig`) and what its records say
(:class:`RunState`: the baseline, the best so far, the budget, the certification runs), with the record helpers every
part of the engine reads them through. Pure: nothing here launches, decides or writes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from attune.engine.acceptance import (
    Z_95,
    Certified,
    Disturbance,
    RunNoise,
    certified_speedup,
    disturbance,
    noise_floor,
    typical_throughput,
)
from attune.engine.budget import Budget, charge
from attune.errors import AttuneError
from attune.recipe.catalogue import Semantics
from attune.recipe.change import signature
from attune.recipe.model import Recipe
from attune.trial import (
    MAX_REMEASURES,
    SEARCH_KINDS,
    Measurement,
    TrialKind,
    TrialOutcome,
    TrialRecord,
)


@dataclass(frozen=True)
class TuneConfig:
    """How one tuning run is conducted (defaults come from the recipe's ``tuning`` section)."""

    budget_hours: float
    search_space: tuple[str, ...]
    warmup_steps: int = 2
    measure_steps: int = 6
    #: the adaptive window (:func:`measure_plan`): warm-up detected, measurement ended once precise enough
    adaptive_window: bool = False
    baseline_repeats: int = 2
    confirm: bool = True
    min_gain: float = 0.02
    trial_timeout_s: float = 300.0
    max_trials: int | None = None
    max_consecutive_refusals: int = 25
    loss_check: bool = True
    paired: bool = False  # decide a promising candidate on an A-B-A paired measurement against the best
    max_failed_trials: int | None = None  # stop once this many launched trials failed (None: no limit)
    #: share of the budget kept back for the final certification runs (0: none); the recipe's default is 0.15
    certify_share: float = 0.0
    certify_max_pairs: int = 5
    #: records (trials and refusals) after which the run ends whatever happens: a guard against a policy that keeps
    #: proposing (None: no limit; the benchmark sets one)
    max_records: int | None = None
    #: run-to-run noise that past runs on the same cluster measured (log-sd and its degrees of freedom; 0: none),
    #: pooled into this run's decisions where its own runs do not contradict it (``RunNoise.with_prior``); the
    #: certification rests on this run's own runs alone
    noise_prior_sigma: float = 0.0
    noise_prior_df: int = 0

    def noise_prior(self) -> RunNoise | None:
        """The noise prior of this run's decisions, or None."""
        if self.noise_prior_df > 0 and self.noise_prior_sigma > 0:
            return RunNoise(sigma=self.noise_prior_sigma, df=self.noise_prior_df)
        return None

    @classmethod
    def from_recipe(cls, recipe: Recipe, budget_hours: float, **overrides: Any) -> TuneConfig:
        t = recipe.tuning
        space = t.search_space or tuple(
            name for name, k in recipe.catalogue.knobs.items()
            if len(k.values) > 1 and k.semantics is not Semantics.NUMERICS_CHANGING
        ) + tuple(name for name in t.explore if name in recipe.catalogue)  # settings the owner lets it explore
        base: dict[str, Any] = dict(
            budget_hours=budget_hours, search_space=tuple(space), warmup_steps=t.warmup_steps,
            measure_steps=t.measure_steps, adaptive_window=t.adaptive_window, baseline_repeats=t.baseline_repeats, confirm=t.confirm,
            min_gain=t.min_gain, trial_timeout_s=t.trial_timeout_s, paired=t.paired, certify_share=t.certify_share)
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:  # a typed config: a misspelt setting is named, never passed on or dropped
            raise AttuneError(f"unknown run setting{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                              f"known: {', '.join(f.name for f in fields(cls))}")
        base.update({k: v for k, v in overrides.items() if v is not None})
        if "search_space" in base:
            base["search_space"] = tuple(base["search_space"])
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: the kinds of run that measure a recipe for the search (a decision's runs and its references): the evidence of what
#: one run of a recipe measures here, and of how much runs vary (:func:`repeated_runs`)
MEASURING_KINDS: tuple[TrialKind, ...] = (TrialKind.BASELINE, TrialKind.REFERENCE, TrialKind.CANDIDATE,
                                          TrialKind.CONFIRM)


@dataclass(frozen=True)
class CertificationCheck:
    """The certification runs (trial id, throughput) a certified speedup rests on, each side's disturbed runs and
    their partners left out, and the disturbed runs (:meth:`RunState.certification_check`)."""

    baseline: list[tuple[int, float]]
    best: list[tuple[int, float]]
    disturbed: tuple[Disturbance, ...] = ()
    pairs_set_aside: int = 0


@dataclass
class RunState:
    """Everything the loop knows, folded from the journal's (or the resource status's) records."""

    baseline: Recipe
    config: TuneConfig
    records: list[TrialRecord] = field(default_factory=list)
    finished: str | None = None
    cost_estimate: float | None = None  # the backend's estimate of one trial's hours (before any trial ran)
    teardown_s: float = 0.0  # the backend's teardown allowance after a trial's deadline (charged, so budgeted)
    #: one-time set-up run before the first trial, outside every trial (what, wall_s, ok, message)
    setup: list[dict[str, Any]] = field(default_factory=list)
    #: name of the backend that runs the trials (``local``, ``sim``...); ``None`` when unknown
    backend: str | None = None
    #: the most one trial of a recipe can be charged, where the backend can tell before it runs (the simulator);
    #: with it, a candidate is proposed only when the budget left pays for its whole decision (:func:`decision_hours`)
    trial_price: Callable[[Recipe], float] | None = field(default=None, repr=False, compare=False)

    def baselines(self) -> list[TrialRecord]:
        return [r for r in self.records if r.kind == TrialKind.BASELINE and r.outcome is TrialOutcome.SUCCEEDED]

    def floor(self) -> float:
        base = [r.measurement for r in self.baselines() if r.measurement]
        floor = noise_floor(base, min_gain=self.config.min_gain)
        prior = self.config.noise_prior()
        if prior is not None and len(base) < 2:  # one baseline run (a noise prior stood in for the second)
            floor = max(floor, Z_95 * prior.sigma * math.sqrt(1 + 1 / max(len(base), 1)))
        return floor

    def best_record(self) -> TrialRecord | None:
        accepted = [r for r in self.records if r.accepted]
        return accepted[-1] if accepted else None

    def best_recipe(self) -> Recipe:
        rec = self.best_record()
        if rec is None:
            return self.baseline
        return self.baseline.with_knobs(**self.baseline.knob_changes(rec.knobs))

    def throughput_of(self, sig: str, kinds: tuple[str, ...]) -> float | None:
        """The throughput of a configuration from its successful runs of ``kinds``, by the estimator its decisions
        use (:func:`~attune.engine.acceptance.typical_throughput`: the geometric mean); a run whose measurement
        was a fault (``mismeasured``) is never among them."""
        tps = [r.throughput for r in self.records
               if r.signature == sig and r.kind in kinds and r.outcome is TrialOutcome.SUCCEEDED and r.throughput]
        return typical_throughput(tps)

    def baseline_throughput(self) -> float | None:
        """The baseline's throughput from all its runs in the search: its repeats and the reference runs of it
        (while it was the best), as :meth:`best_throughput` reads it while nothing is kept: the two are then the
        same figure, and the speedup exactly 1."""
        return self.throughput_of(signature(self.baseline), (TrialKind.BASELINE, TrialKind.REFERENCE))

    def search_speedup(self) -> float | None:
        """The best over the baseline as the search measured them: 1 when nothing was kept (the baseline is the
        best, whatever its runs measured), None before the baseline has a successful run."""
        base = self.baseline_throughput()
        if base is None:
            return None
        if self.best_record() is None:
            return 1.0
        best = self.best_throughput()
        return best / base if best else None

    def _best_key(self) -> tuple[str, tuple[str, ...]]:
        """The best recipe's signature and the kinds of its runs that measure it (the reference runs among them)."""
        rec = self.best_record()
        if rec is None:
            return signature(self.baseline), (TrialKind.BASELINE, TrialKind.REFERENCE)
        return rec.signature, (TrialKind.CANDIDATE, TrialKind.CONFIRM, TrialKind.REFERENCE)

    def best_throughput(self) -> float | None:
        """Mean throughput of the best recipe's runs: its own (as a candidate, or the baseline's) and the reference
        runs later decisions made of it."""
        return self.throughput_of(*self._best_key())

    def best_runs(self) -> int:
        """How many successful runs :meth:`best_throughput` rests on."""
        sig, kinds = self._best_key()
        return sum(1 for r in self.records if r.signature == sig and r.kind in kinds
                   and r.outcome is TrialOutcome.SUCCEEDED and r.throughput)

    def best_measurement(self) -> Measurement | None:
        rec = self.best_record()
        sig = rec.signature if rec else signature(self.baseline)
        pool = [r for r in self.records if r.outcome is TrialOutcome.SUCCEEDED and r.measurement
                and r.signature == sig and r.kind in SEARCH_KINDS]
        return pool[-1].measurement if pool else None

    def budget(self) -> Budget:
        return Budget(self.config.budget_hours, self.records, estimate=self.cost_estimate,
                      reserve_hours=self.config.certify_share * self.config.budget_hours,
                      overhead_hours=charge(self.baseline.resources.devices, self.teardown_s))

    def certification_runs(self) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """The successful certification runs (trial id, throughput): the baseline's and the final best's."""
        base_sig = signature(self.baseline)
        runs = [(r.signature, r.id, r.throughput) for r in self.records
                if r.kind == TrialKind.CERTIFY and r.outcome is TrialOutcome.SUCCEEDED and r.throughput]
        return ([(i, tp) for sig, i, tp in runs if sig == base_sig],
                [(i, tp) for sig, i, tp in runs if sig != base_sig])

    def certification_check(self) -> CertificationCheck:
        """The certification runs a certified speedup may rest on, and the disturbed ones it may not.

        Each certification run is checked against the same recipe's earlier runs in this run (the baseline's repeats
        and reference runs; the final best's candidate, confirmation and reference runs) on the run's pooled
        run-to-run noise (:func:`~attune.engine.acceptance.disturbance`). A disturbed run is set aside with the other
        run of its interleaved pair (the baseline's i-th certification run pairs with the best's i-th), so that the
        pairs left keep the A-B balance that cancels a drift of the machine's load."""
        runs = sorted((r for r in self.records if r.kind == TrialKind.CERTIFY and r.outcome is TrialOutcome.SUCCEEDED
                       and r.throughput and r.measurement is not None), key=lambda r: r.id)
        base_sig = signature(self.baseline)
        base = [r for r in runs if r.signature == base_sig]
        best = [r for r in runs if r.signature != base_sig]
        groups = repeated_runs(self)
        found: list[tuple[int, Disturbance]] = []
        for which, side in (("baseline", base), ("final best", best)):
            for i, r in enumerate(side):
                assert r.measurement is not None
                earlier = [(e.id, e.measurement) for e in self.records
                           if e.signature == r.signature and e.id < r.id and e.kind in MEASURING_KINDS
                           and e.outcome is TrialOutcome.SUCCEEDED and e.measurement is not None]
                d = disturbance(which, (r.id, r.measurement), earlier, groups)
                if d is not None:
                    found.append((i, d))
        out = {i for i, _ in found}

        def keep(side: list[TrialRecord]) -> list[tuple[int, float]]:
            return [(r.id, r.throughput or 0.0) for i, r in enumerate(side) if i not in out]

        return CertificationCheck(baseline=keep(base), best=keep(best),
                                  disturbed=tuple(d for _, d in sorted(found, key=lambda f: f[1].trial)),
                                  pairs_set_aside=len(out))

    def certified(self) -> Certified | None:
        """The final speedup with its 95 % interval, from the certification runs (None before any pair ran, or when
        every pair that ran was disturbed: :meth:`certification_check`)."""
        check = self.certification_check()
        cert = certified_speedup(check.baseline, check.best, repeated_runs(self))
        if cert is not None and check.disturbed:
            cert = replace(cert, set_aside=check.disturbed)
        return cert

    def tried(self) -> set[str]:
        """Signatures of configurations tried as candidates or baselines (not calibration runs)."""
        return {r.signature for r in self.records if r.signature and r.kind in SEARCH_KINDS
                and r.outcome is not TrialOutcome.INTERRUPTED}

    def history(self) -> list[Recipe]:
        """Recipes tried so far, for the gate's never-repeat rule."""
        seen: dict[str, Recipe] = {}
        tried = self.tried()
        for r in self.records:
            if r.signature in tried and r.signature not in seen and r.knobs:
                seen[r.signature] = self.baseline.with_knobs(**self.baseline.knob_changes(r.knobs))
        return list(seen.values())

    def next_id(self) -> int:
        return max((r.id for r in self.records), default=0) + 1


def settled(state: RunState) -> list[TrialRecord]:
    """The records that count: not the interrupted trials, nor the measurement faults that are run again (both are
    run once more, as if they had not been)."""
    again = rerun_ids(state.records)
    return [r for r in state.records if r.outcome is not TrialOutcome.INTERRUPTED and r.id not in again]


def fault_streak(records: list[TrialRecord], kind: TrialKind, sig: str) -> int:
    """How many trials of ``kind`` of the recipe ``sig`` in a row, at the end of ``records``, were measurement
    faults (interrupted trials between them are passed over)."""
    n = 0
    for r in reversed(records):
        if r.outcome is TrialOutcome.INTERRUPTED:
            continue
        if r.outcome is not TrialOutcome.MISMEASURED or r.kind != kind or r.signature != sig:
            break
        n += 1
    return n


def rerun_ids(records: list[TrialRecord]) -> set[int]:
    """The ids of the measurement faults that are run again (the first :data:`MAX_REMEASURES` of a streak):
    unsettled, as interrupted trials are; a later fault of the streak settles."""
    out: set[int] = set()
    streak, key = 0, None
    for r in sorted(records, key=lambda r: r.id):  # one pass: what fault_streak counts before each record
        if r.outcome is TrialOutcome.INTERRUPTED:
            continue
        if r.outcome is not TrialOutcome.MISMEASURED:
            streak, key = 0, None
            continue
        streak = streak + 1 if (r.kind, r.signature) == key else 1
        key = (r.kind, r.signature)
        if streak <= MAX_REMEASURES:
            out.add(r.id)
    return out


def repeated_runs(state: RunState, sig: str | None = None,
                  kinds: tuple[str, ...] = MEASURING_KINDS,
                  ) -> list[list[tuple[int, float]]]:
    """The runs (trial id, throughput) of every recipe of this run measured more than once (the baseline's repeats,
    the best's reference runs, earlier candidates' pairs), the recipe ``sig`` (a candidate being judged) left out:
    the evidence of how much one run varies here. Certification runs are not in it unless ``kinds`` names them."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for r in state.records:
        if r.signature != sig and r.outcome is TrialOutcome.SUCCEEDED and r.measurement is not None \
                and r.kind in kinds:
            groups.setdefault(r.signature, []).append((r.id, r.measurement.tokens_per_s_per_device))
    return [g for g in groups.values() if len(g) > 1]
