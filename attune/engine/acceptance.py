"""When is a change faster? A noise floor learned from repeated baselines, and a pure ``accept``.

The floor is the larger of
- ``min_gain`` (the user's smallest interesting gain),
- a one-sided 95 % bound on the difference between one new run and the mean of the ``n`` baseline
  runs, ``1.645 · σ · sqrt(1 + 1/n)``, where σ is the relative standard deviation between repeated
  baseline runs (run-to-run noise: process placement, allocator state, neighbours), and
- the standard error of one trial's window median, ``cv / sqrt(window)`` (within-run noise), which
  guards against two baseline runs agreeing by chance.
A candidate is accepted only if its throughput beats the best by more than the floor, and, when
confirmation is on, the mean of its run and a re-run still does.

**Paired measurement** (the default for ``attune tune``): a candidate whose first run is not decisively slower than
the best (its gain exceeds ``min_gain − noise floor``) is measured again in A-B-A order: the current best runs right
after it, then the candidate once more. Both sides then sit at the same mean launch index, so load that drifts
linearly over the runs cancels from the difference of their mean log throughputs. The uncertainty of that difference
is all the noise the decision is exposed to: the run-to-run spread of one run, pooled from every recipe this run
measured more than once (the baseline's repeats, every later reference of the best, earlier candidates' pairs, and
the candidate's own runs) after a common linear drift is taken out, never below the runs' own window-median standard
errors, with Student-t quantiles for its few degrees of freedom (:class:`RunNoise`, :func:`paired_gain`). The change
is kept when the lower end of the one-sided interval is above zero, its estimate is at least ``min_gain``, and the
candidate's own runs agree as runs of one recipe do here (an F test); a candidate whose runs disagree is
inconclusive, never kept on that look. A candidate not shown but still promising (its point gain above half of
``min_gain``) gets another B-A pair where the budget pays for it, up to :data:`MAX_LOOKS` looks in all, each at
Pocock's nominal level (:data:`LOOK_ALPHA`), so the chance of keeping a change that does nothing stays at 1.5 % overall
while a true gain of 1–2 × ``min_gain`` (about one run's noise) is kept far more often than two looks could.
``python -m attune.bench.decisions`` measures that rate and the power on the simulator with its noise turned up. The
noise-floor rule above is the fallback when the reference run fails or pairing is off.

**Certification** (:func:`certified_speedup`) rests on interleaved baseline/best pairs run once the search is over. A
certification run that lies beyond the same recipe's earlier runs in this run by far more than the run-to-run noise
allows (:func:`disturbance`: a neighbour loaded the machine while it ran) is set aside with its pair, never certified
on: one such run taken at face value gives an interval that excludes the truth.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attune.trial import Measurement

Z_95 = 1.645  # one-sided 95 % normal quantile


def noise_floor(baselines: Sequence[Measurement], *, min_gain: float) -> float:
    if not baselines:
        return max(min_gain, 0.05)
    tps = [m.tokens_per_s_per_device for m in baselines]
    mean = statistics.fmean(tps)
    sigma = statistics.stdev(tps) / mean if len(tps) > 1 and mean > 0 else 0.0
    between = Z_95 * sigma * math.sqrt(1 + 1 / len(tps))
    within = max(m.step_time_cv / math.sqrt(max(m.steps_measured, 1)) for m in baselines)
    return max(min_gain, between, within)


def gain(candidate: float, best: float) -> float:
    return candidate / best - 1.0 if best > 0 else math.inf


def clears(candidate: float, best: float, floor: float) -> bool:
    """True when ``candidate`` throughput beats ``best`` by more than the noise floor."""
    return gain(candidate, best) > floor


#: most looks of one paired decision: the A-B-A look, then up to ``MAX_LOOKS - 1`` more B-A pairs while the candidate
#: stays promising and the budget pays for them
MAX_LOOKS = 4
#: the chance, over every look of one paired decision, of keeping a change that does nothing (one-sided): 1.5 %, so
#: that the realised false-keep rate stays within 2 % at a quiet cluster's noise (``make bench-decisions``, 400 seeds
#: a level: at 2.5 % it measured 2.5 % once the benchmark's futility bound judged the set effect, 1.2 % before, when
#: it judged the candidate's natural throughput); 2.5 % from issue 40's first step, 5 % (Pocock 0.0193 a look) before
FALSE_KEEP_ALPHA = 0.015
#: Pocock's nominal one-sided level for a group-sequential test with up to :data:`MAX_LOOKS` equally spaced looks
#: at :data:`FALSE_KEEP_ALPHA` overall: the constant 2.562 (2.362 at 2.5 %, 2.069 at 5 %), from the maximum of the
#: looks' joint normal statistics (tests/engine/test_paired.py simulates it); each look tests at this level, and a
#: decision that stops before its last look (the budget, or no longer promising) only keeps less often
LOOK_ALPHA = 0.0052
#: a candidate not shown at a look stays promising, and gets another B-A pair, while its point gain is above this
#: share of ``min_gain`` (a futility bound that never keeps anything, so it costs none of the 5 %)
PROMISING_SHARE = 0.5
#: a common linear drift is taken out (at the cost of one degree of freedom) where at least this many are there and
#: the runs show one at level TREND_ALPHA; a quiet machine keeps all its degrees of freedom
TREND_MIN_DF = 3
TREND_ALPHA = 0.05
#: level of the test that a candidate's own runs agree as well as runs of one recipe do here
CONSISTENCY_ALPHA = 0.05
#: a noise prior (run-to-run noise measured by past runs on the same cluster) is set aside, and this run decides on
#: its own runs alone, unless its own runs agree with the prior at this lenient level (an F test that drops the
#: prior as soon as they look noisier than it says: with one degree of freedom of its own, whenever their spread
#: exceeds about 1.2× the prior's variance), so a prior that understates this job's noise is seldom used
PRIOR_DROP_ALPHA = 0.30
#: a noise prior counts as at most this many degrees of freedom, so a run's own runs soon outweigh it
PRIOR_MAX_DF = 6


Run = tuple[int, float]
"""One run of a recipe: its place in the run's launch order (the trial id) and its throughput."""


@dataclass(frozen=True)
class RunNoise:
    """Run-to-run noise of one run's throughput, pooled over every recipe measured more than once.

    ``sigma`` is the standard deviation of log throughput (≈ the relative spread of one run) left after each
    recipe's own mean and a common linear drift over the launch order (``trend``, per launch) are taken out; ``df``
    its degrees of freedom. Slow drift of the machine's load is what the interleaved design cancels, so it is not
    counted as noise; a single odd run (the slowest reference of a recipe) is."""

    sigma: float
    df: int
    trend: float = 0.0
    prior_df: int = 0  # of ``df``, the degrees of freedom a noise prior contributed (:meth:`with_prior`)

    @classmethod
    def pooled(cls, groups: Iterable[Sequence[Run]]) -> RunNoise:
        logs = [[(float(t), math.log(x)) for t, x in g if x > 0] for g in groups]
        logs = [g for g in logs if len(g) >= 2]
        df = sum(len(g) - 1 for g in logs)
        if not df:
            return cls(0.0, 0)
        centred = []
        for g in logs:
            mt, mx = statistics.fmean(t for t, _ in g), statistics.fmean(x for _, x in g)
            centred += [(t - mt, x - mx) for t, x in g]
        stt = sum(t * t for t, _ in centred)
        ss = sum(x * x for _, x in centred)
        trend = 0.0
        if df >= TREND_MIN_DF and stt > 0:  # a common drift, kept only where the runs show one (an F test)
            slope = sum(t * x for t, x in centred) / stt
            explained = slope * slope * stt
            rest = ss - explained
            from scipy.special import fdtri

            if rest <= 0 or explained / (rest / (df - 1)) > float(fdtri(1, df - 1, 1 - TREND_ALPHA)):
                trend, ss, df = slope, max(rest, 0.0), df - 1
        return cls(sigma=math.sqrt(ss / df), df=df, trend=trend)

    def with_prior(self, prior: RunNoise | None) -> RunNoise:
        """This noise pooled with a ``prior`` (the noise past runs on the same cluster measured, its degrees of
        freedom capped at :data:`PRIOR_MAX_DF`; the pooled spread never below this run's own), or this noise alone
        when there is no prior, when this run has no repeat of its own to check the prior against, or when its own
        runs are noisier than the prior at level :data:`PRIOR_DROP_ALPHA` (the prior does not describe this job)."""
        if prior is None or prior.df <= 0 or not prior.sigma > 0 or not math.isfinite(prior.sigma) or self.df < 1:
            return self
        pdf = min(prior.df, PRIOR_MAX_DF)
        from scipy.special import fdtri

        if self.sigma ** 2 / prior.sigma ** 2 > float(fdtri(self.df, pdf, 1 - PRIOR_DROP_ALPHA)):
            return self
        df = self.df + pdf
        # never below the run's own estimate: a prior lends degrees of freedom, it does not quieten a noisier job
        pooled = math.sqrt((self.sigma ** 2 * self.df + prior.sigma ** 2 * pdf) / df)
        return RunNoise(sigma=max(pooled, self.sigma), df=df, trend=self.trend, prior_df=pdf)

    def residual(self, runs: Sequence[Run]) -> RunNoise:
        """The spread of ``runs`` (one recipe) about their mean, this noise's drift taken out."""
        logs = [(float(t), math.log(x)) for t, x in runs if x > 0]
        if len(logs) < 2:
            return RunNoise(0.0, 0, self.trend)
        mt, mx = statistics.fmean(t for t, _ in logs), statistics.fmean(x for _, x in logs)
        ss = sum((x - mx - self.trend * (t - mt)) ** 2 for t, x in logs)
        return RunNoise(math.sqrt(ss / (len(logs) - 1)), len(logs) - 1, self.trend)

    def residual_pool(self, groups: Iterable[Sequence[Run]]) -> RunNoise:
        """The pooled spread of ``groups`` (one recipe each) about their means, this noise's drift taken out."""
        parts = [self.residual(g) for g in groups]
        df = sum(p.df for p in parts)
        if not df:
            return RunNoise(0.0, 0, self.trend)
        return RunNoise(math.sqrt(sum(p.sigma ** 2 * p.df for p in parts) / df), df, self.trend)


@dataclass(frozen=True)
class PairedGain:
    """The decision figures of an interleaved measurement (A-B-A, then B-A pairs): the relative gain of the
    candidate's runs over the best's runs between them, the one-sided half-width at the look's level, and what they
    rest on (the pooled run-to-run noise, its degrees of freedom, the runs on each side, whether the candidate's own
    runs agree as runs of one recipe do)."""

    gain: float
    half_width: float
    sigma: float = 0.0
    df: int = 0
    runs: tuple[int, int] = (2, 1)
    consistent: bool = True
    spread: float = 0.0  # the candidate's own runs: their relative standard deviation
    prior_df: int = 0  # of ``df``, the degrees of freedom that past runs on this cluster contributed

    @property
    def lower(self) -> float:
        return self.gain - self.half_width

    def shows(self, min_gain: float) -> bool:
        """Whether these figures keep the change: a gain shown at the look's level (the interval's lower end above
        zero, which bounds how often a change that does nothing is kept), worth keeping (its estimate at least
        ``min_gain``), on runs of the candidate that agree as runs of one recipe do."""
        return self.consistent and self.lower > 0 and self.gain >= min_gain

    def shortfall(self, min_gain: float) -> str:
        """Why :meth:`shows` is false, for a decision's text."""
        if not self.consistent:
            return "inconclusive"
        if self.lower <= 0:
            return "no gain shown: its lower end is not above 0"
        return f"its gain is below min_gain {min_gain:.0%}"

    def describe(self) -> str:
        a, b = self.runs
        text = (f"paired {self.gain:+.1%} ± {self.half_width:.1%} over {a} candidate and {b} interleaved runs of the "
                f"best (run-to-run noise {self.sigma:.1%} from {self.df} df{prior_note(self.prior_df)}, Student's t)")
        if not self.consistent:
            text += f"; the candidate's own runs disagree by {self.spread:.1%}, beyond that noise"
        return text


def prior_note(prior_df: int) -> str:
    """The words a decision adds when past runs lent its noise estimate degrees of freedom."""
    return f", {prior_df} of them from past runs on this cluster" if prior_df else ""


def _log_gain(a: Sequence[Run], b: Sequence[Run], trend: float) -> float:
    """Mean log throughput of runs ``a`` less that of runs ``b``, a common drift (per launch) taken out."""
    d = statistics.fmean(math.log(x) for _, x in a) - statistics.fmean(math.log(x) for _, x in b)
    return d - trend * (statistics.fmean(t for t, _ in a) - statistics.fmean(t for t, _ in b))


def _rel_se(m: Measurement) -> float:
    """Relative standard error of a run's window-median throughput."""
    return 1.2533 * m.step_time_cv / math.sqrt(max(m.steps_measured, 1))


def paired_gain(candidate: Sequence[tuple[int, Measurement]], reference: Sequence[tuple[int, Measurement]],
                others: Sequence[Sequence[Run]], *, alpha: float = LOOK_ALPHA,
                prior: RunNoise | None = None) -> PairedGain:
    """Gain of a candidate (its runs ``candidate``, each with its launch index) over the best (its runs
    ``reference``, interleaved with them), with a one-sided Student-t bound at level ``alpha``.

    The interleaved order (A-B-A, A-B-A-B-A) puts both sides at the same mean launch index, so a linear drift of the
    machine cancels from the difference of their mean log throughputs. The noise of one run is pooled from
    ``others`` (the runs of every other recipe measured more than once in this run: the baseline's repeats, the
    best's references, earlier pairs) and the candidate's own runs, a common drift taken out where the runs show
    one, and never below the runs' own window-median standard errors (two runs can agree by chance). The candidate
    is *inconsistent* when its own runs disagree beyond the others' noise (an F test at
    :data:`CONSISTENCY_ALPHA`). A ``prior`` (the noise past runs on this cluster measured) is pooled in where this
    run's own runs do not contradict it (:meth:`RunNoise.with_prior`)."""
    a = [(t, m.tokens_per_s_per_device) for t, m in candidate]
    b = [(t, m.tokens_per_s_per_device) for t, m in reference]
    if not a or not b or min(x for _, x in b) <= 0 or min(x for _, x in a) <= 0:
        return PairedGain(gain=-1.0 if b and min(x for _, x in b) > 0 else math.inf, half_width=math.inf,
                          runs=(len(a), len(b)))
    from scipy.special import fdtri, stdtrit  # quantiles of Student's t and F (imported here: 0.4 s, when deciding)

    noise = RunNoise.pooled([*others, a]).with_prior(prior)
    d = _log_gain(a, b, noise.trend)
    within = math.sqrt(statistics.fmean(_rel_se(m) ** 2 for _, m in [*candidate, *reference]))
    sigma = max(noise.sigma, within)
    df = max(noise.df, 1)
    se = sigma * math.sqrt(1 / len(a) + 1 / len(b))
    q = float(stdtrit(df, 1 - alpha))
    g, lower = math.exp(d) - 1, math.exp(d - q * se) - 1
    consistent = True
    rest = RunNoise.pooled(others)
    own = noise.residual(a)
    ref = noise.residual_pool(others)
    if noise.prior_df:
        ref = ref.with_prior(prior)
        rest = RunNoise(rest.sigma, rest.df + ref.prior_df, rest.trend)
    if own.df >= 1 and rest.df >= 1:
        ref_sigma = max(ref.sigma, within)
        if ref_sigma > 0:
            consistent = own.sigma ** 2 / ref_sigma ** 2 <= float(fdtri(own.df, rest.df, 1 - CONSISTENCY_ALPHA))
        else:  # runs that repeat exactly (a deterministic backend): the candidate's must too
            consistent = own.sigma <= 1e-12
    return PairedGain(gain=g, half_width=g - lower, sigma=sigma, df=noise.df, runs=(len(a), len(b)),
                      consistent=consistent, spread=own.sigma, prior_df=noise.prior_df)


#: a certification run is *disturbed*, and the certification rests on none of its pair, when it lies outside the
#: range of the same recipe's earlier runs in this run by more than Student's t at this one-sided level times the
#: spread of a difference of two runs (σ·√2, :func:`disturbance`): an honest run is flagged at most this often on
#: each side (far less in fact: lying beyond the lowest of several runs is rarer than beyond any one of them), so
#: even ten certification runs set an honest pair aside less than 2 % of the time, while a run at half the slowest
#: earlier run's throughput (a neighbour's load) stands out on any noise below about 12 % with ten degrees of freedom
DISTURBED_ALPHA = 0.001


@dataclass(frozen=True)
class Disturbance:
    """A certification run that disagrees with its recipe's earlier runs in this run (the search's own runs of it)
    by far more than the run's run-to-run noise allows: a neighbour loaded the machine, or it was otherwise not a run
    like the others. ``low``-``high`` is the range of the ``earlier`` runs, ``sigma`` the pooled run-to-run noise."""

    which: str  # "baseline" or "final best"
    trial: int
    throughput: float
    earlier: int
    mean: float  # the earlier runs' geometric mean throughput
    low: float
    high: float
    sigma: float

    def describe(self) -> str:
        """What happened, in words: which run, its throughput against the same recipe's earlier runs."""
        rel = self.throughput / self.mean - 1
        earlier = (f"its {self.earlier} earlier runs in this run measured {self.low:,.0f}–{self.high:,.0f} (mean "
                   f"{self.mean:,.0f})" if self.earlier != 1 else f"its one earlier run in this run measured "
                   f"{self.mean:,.0f}")
        return (f"the {self.which}'s certification run (trial {self.trial}) measured {self.throughput:,.0f} tokens/s "
                f"per device where {earlier}: {abs(rel):.0%} {'below' if rel < 0 else 'above'}, far beyond the "
                f"run-to-run noise ({self.sigma:.1%})")


def disturbance(which: str, run: tuple[int, Measurement], earlier: Sequence[tuple[int, Measurement]],
                groups: Sequence[Sequence[Run]], *, alpha: float = DISTURBED_ALPHA) -> Disturbance | None:
    """The certification ``run`` of one recipe as a :class:`Disturbance` when it disagrees with ``earlier`` (the same
    recipe's runs measured before it in this run) beyond the run-to-run noise pooled from ``groups`` (every recipe
    of the run measured more than once, certification runs left out), else None.

    The rule, in log throughput: the run's distance beyond the earlier runs' range must not exceed
    ``t(df, 1 − alpha) · σ · √2``, where σ is the pooled run-to-run noise (never below the runs' own window-median
    standard errors) and ``df`` its degrees of freedom. For an honest run the distance below the lowest earlier run
    is at most its distance below any one of them, a difference of two runs whose ratio to σ·√2 is Student's t with
    ``df`` degrees of freedom; so it is flagged with probability below ``alpha`` on each side, and Student's t (not
    the normal) keeps that true when σ rests on few runs.

    The rule is applied twice, to the throughputs as measured and with the common linear drift the runs show taken
    out (:meth:`RunNoise.pooled`), and the run is disturbed only when both say so. A machine that slows steadily moves
    every recipe alike, which the interleaved pairs cancel: that is no disturbance, and the drift-free reading does
    not flag it. A quiet machine's runs show a spurious drift one time in twenty, which, extrapolated to the last
    runs of the search, would flag honest certification runs about as often: the reading as measured does not. With
    no earlier run or no repeat anywhere (``df`` 0) nothing tells what a run should measure, and nothing is
    flagged."""
    t, m = run
    x = m.tokens_per_s_per_device
    prior = [(i, e) for i, e in earlier if e.tokens_per_s_per_device > 0]
    drifting = RunNoise.pooled(groups)
    flat = RunNoise(0.0, 0).residual_pool([[(i, v) for i, v in g if v > 0] for g in groups])
    if not prior or x <= 0 or flat.df < 1:
        return None
    from scipy.special import stdtrit

    within = math.sqrt(statistics.fmean(_rel_se(e) ** 2 for _, e in [*prior, run]))

    def beyond(noise: RunNoise) -> bool:
        z = math.log(x) - noise.trend * t
        zs = [math.log(e.tokens_per_s_per_device) - noise.trend * i for i, e in prior]
        gap = max(min(zs) - z, z - max(zs))
        return gap > float(stdtrit(max(noise.df, 1), 1 - alpha)) * max(noise.sigma, within) * math.sqrt(2)

    if not beyond(flat) or (drifting.trend and not beyond(drifting)):
        return None
    tps = [e.tokens_per_s_per_device for _, e in prior]
    return Disturbance(which=which, trial=t, throughput=x, earlier=len(tps),
                       mean=math.exp(statistics.fmean(math.log(v) for v in tps)), low=min(tps), high=max(tps),
                       sigma=max(flat.sigma, within))


@dataclass(frozen=True)
class Certified:
    """The run's final speedup, from interleaved runs of the baseline and the final best (A-B-A-B…): the point
    estimate and its two-sided 95 % interval (Student-t on the run's pooled run-to-run noise). ``set_aside``: the
    disturbed certification runs whose pairs it does not rest on (:func:`disturbance`)."""

    speedup: float
    low: float
    high: float
    pairs: int
    sigma: float
    df: int
    set_aside: tuple[Disturbance, ...] = ()

    @property
    def shown(self) -> bool:
        """True when the interval lies above 1: a gain is shown. Otherwise the run says "no gain shown"."""
        return self.low > 1.0

    def describe(self) -> str:
        verdict = "gain shown" if self.shown else "no gain shown"
        text = (f"{self.speedup:.2f}× (95 % interval {self.low:.2f}–{self.high:.2f}×, {self.pairs} interleaved "
                f"baseline/best pair{'s' if self.pairs != 1 else ''}): {verdict}")
        if self.set_aside:
            n = len(self.set_aside)
            text += (f"; {n} disturbed pair{'s' if n != 1 else ''} set aside and not used ("
                     + "; ".join(d.describe() for d in self.set_aside) + ")")
        return text

    def to_dict(self) -> dict[str, float | int | bool | str | list[str]]:
        out: dict[str, float | int | bool | str | list[str]] = {
            "speedup": self.speedup, "low": self.low, "high": self.high, "pairs": self.pairs, "sigma": self.sigma,
            "df": self.df, "shown": self.shown, "summary": self.describe()}
        if self.set_aside:
            out["set_aside"] = [d.describe() for d in self.set_aside]
        return out


def certified_speedup(baseline: Sequence[Run], best: Sequence[Run], others: Sequence[Sequence[Run]], *,
                      level: float = 0.95) -> Certified | None:
    """The speedup of ``best`` over ``baseline`` from their interleaved certification runs (launch index,
    throughput), with the noise of one run pooled from those runs and ``others`` (every recipe of the run measured
    more than once) and any common drift the runs show taken out. ``None`` without a run on each side."""
    a = [(t, x) for t, x in best if x > 0]
    b = [(t, x) for t, x in baseline if x > 0]
    if not a or not b:
        return None
    from scipy.special import stdtrit

    noise = RunNoise.pooled([*others, a, b])
    d = _log_gain(a, b, noise.trend)
    df = max(noise.df, 1)
    half = float(stdtrit(df, 1 - (1 - level) / 2)) * noise.sigma * math.sqrt(1 / len(a) + 1 / len(b))
    return Certified(speedup=math.exp(d), low=math.exp(d - half), high=math.exp(d + half),
                     pairs=min(len(a), len(b)), sigma=noise.sigma, df=noise.df)


def typical_throughput(throughputs: Iterable[float | None]) -> float | None:
    """One configuration's throughput from its runs, as every decision here reads it: the geometric mean (the mean
    log throughput that :func:`paired_gain` and :func:`certified_speedup` compare), so that a headline and the
    decisions behind it rest on one estimate. Runs whose measurement was a fault never reach it (the engine marks
    them ``mismeasured``: :func:`~attune.engine.measure.timing_fault`, ``engine.loop.twin_fault``). None without a
    positive run."""
    logs = [math.log(x) for x in throughputs if x is not None and x > 0]
    return math.exp(statistics.fmean(logs)) if logs else None
