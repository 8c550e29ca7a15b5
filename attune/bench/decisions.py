"""How often does the shipped decision rule keep a change that does nothing, and how often does it keep a real gain?

``python -m attune.bench.decisions`` (``make bench-decisions``) runs the shipped engine (its paired decision, its
sequential further looks, its budget rule) on the simulator with the run-to-run noise turned up (log-normal sigma
``--noise``, default 0.20: one run's throughput spreads by about 20 %, what a busy 2-core machine shows), over many
seeds. Each run tunes one suite recipe with a policy that proposes exactly one change whose **true** effect is set:
the candidate's noiseless throughput is scaled to exactly ``(1 + effect)`` times the baseline's, so a zero effect is
a change that cannot matter. It prints, per effect, the share of runs that kept the change with its 95 % (Wilson)
interval: at effect 0 that is the false-keep rate, at +10 % and +30 % the power.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from attune.backends.simulated import SimBackend
from attune.bench.suite import load_suite
from attune.engine.loop import Tuner
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.engine.state import TuneConfig
from attune.recipe.change import Change, apply_change, signature
from attune.recipe.model import Recipe
from attune.sim.model import NOISE_SIGMA
from attune.trial import Decision, TrialBackend, TrialRequest, TrialResult

EFFECTS = (0.0, 0.10, 0.30)
#: the simulator's shipped run-to-run noise: issue 40's false-keep target is 2 % at it, 5 % at any noise above
SHIPPED_NOISE = NOISE_SIGMA
#: each run's budget, in trials of its baseline: two baseline runs, a paired decision's looks and the certification
BUDGET_TRIALS = 12


class OneChange(Policy):
    """Proposes one change, once."""

    name = "one-change"

    def __init__(self, change: dict[str, object]) -> None:
        self.change = change

    def propose(self, ctx: PolicyContext) -> Change | Stop:
        if any(r.kind == "candidate" for r in ctx.records):
            return Stop("the one change was tried")
        return Change(set=dict(self.change), rationale="decision benchmark", source=self.name)  # type: ignore[arg-type]


class SetEffect(TrialBackend):
    """The simulator, with the candidate's throughput set to exactly ``(1 + effect)`` × the baseline's (noiseless
    means); its own noise is left as the inner backend draws it. The adaptive window's futility bar is scaled into
    the inner run's units, so the window stops the candidate on its set throughput, not on its natural one."""

    name = "sim"

    def __init__(self, inner: SimBackend, baseline: Recipe, candidate: Recipe, effect: float) -> None:
        self.inner = inner
        self.target = signature(candidate)
        quiet = SimBackend(noise=False, write_files=False)
        req = TrialRequest(0, Path("/nonexistent"), 2, 6, 1e9)
        base, cand = (quiet.run(r, req).measurement for r in (baseline, candidate))
        assert base is not None and cand is not None
        self.factor = (1 + effect) * base.tokens_per_s_per_device / cand.tokens_per_s_per_device

    def estimate_hours(self, recipe: Recipe, request: TrialRequest) -> float | None:
        return self.inner.estimate_hours(recipe, request)

    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        if signature(recipe) != self.target:
            return self.inner.run(recipe, request)
        plan = request.plan
        if plan is not None and plan.futility_tps is not None:  # the window's futility bar, in the inner run's units
            request = replace(request, plan=replace(plan, futility_tps=plan.futility_tps / self.factor))
        res = self.inner.run(recipe, request)
        if res.measurement is None:
            return res
        m = res.measurement
        f = self.factor
        return replace(res, measurement=m.model_copy(update={
            "tokens_per_s_per_device": m.tokens_per_s_per_device * f, "tokens_per_s": m.tokens_per_s * f,
            "step_time_median_s": m.step_time_median_s / f}))


@dataclass(frozen=True)
class Outcome:
    effect: float
    kept: bool
    looks: int  # paired looks the decision took (0: it never reached one)
    trials: int
    first_run: bool = False  # kept on its first run, decisively (no pair)
    ran: bool = True  # the candidate ran at all (False: the engine's gate refused it, or the budget could not pay)
    spent: float = 0.0  # accelerator-hours the run charged, in trials of its baseline (its budget: BUDGET_TRIALS)


def _first_change(recipe: Recipe, rng: random.Random) -> tuple[dict[str, object], Recipe] | None:
    """A random single-knob change of the recipe's search space that the simulator can run (no OOM)."""
    from attune.gate import evaluate

    cat = recipe.catalogue
    space = list(recipe.tuning.search_space) if recipe.tuning else []
    options = [(k, v) for k in space if k in cat.knobs for v in cat.knobs[k].values if v != recipe.knob(k)]
    rng.shuffle(options)
    quiet = SimBackend(noise=False, write_files=False)
    for k, v in options:
        try:
            cand = apply_change(recipe, {k: v})
        except Exception:  # noqa: BLE001 - an invalid combination: try the next
            continue
        if not evaluate(recipe, cand, (), parent=recipe).admitted:
            continue
        res = quiet.run(cand, TrialRequest(0, Path("/nonexistent"), 2, 6, 1e9))
        if res.measurement is not None:
            return {k: v}, cand
    return None


def one_run(seed: int, effect: float, noise: float, work: Path, baseline_repeats: int = 2,
            noise_prior: float | None = None, prior_df: int = 12) -> Outcome | None:
    rng = random.Random(seed)
    cases = load_suite("suite")
    case = cases[seed % len(cases)]
    picked = _first_change(case.recipe, rng)
    if picked is None:
        return None
    change, cand = picked
    backend = SetEffect(SimBackend(seed=seed, noise_sigma=noise, write_files=False), case.recipe, cand, effect)
    # the budget is 12 trials of the baseline as the engine runs them (its warm-up and window, no deadline): a
    # request cut at 300 s priced the big recipes' 600-s trials at half, so a fifth of the runs could not pay for
    # one paired decision after their baseline and decided nothing, whatever the effect
    t = case.recipe.tuning
    one = backend.estimate_hours(case.recipe, TrialRequest(0, work, t.warmup_steps, t.measure_steps, 1e9)) or 1.0
    prior = {} if noise_prior is None else {"noise_prior_sigma": noise_prior, "noise_prior_df": prior_df}
    cfg = TuneConfig.from_recipe(case.recipe, BUDGET_TRIALS * one, loss_check=False,
                                 baseline_repeats=baseline_repeats, **prior)
    state = Tuner(case.recipe, backend=backend, policy=OneChange(change), config=cfg,
                  run_dir=work / f"{seed}-{effect}").run()
    target = signature(cand)
    kept = any(r.accepted and r.signature == target for r in state.records)
    looks = sum(1 for r in state.records if r.signature == target and (r.kind == "decision" or (
        r.kind == "confirm" and r.status is not Decision.PENDING_PAIR)))
    first = any(r.accepted and r.signature == target and r.kind == "candidate" for r in state.records)
    ran = any(r.launched and r.signature == target for r in state.records)
    return Outcome(effect=effect, kept=kept, looks=looks, trials=sum(1 for r in state.records if r.launched),
                   first_run=first, ran=ran, spent=state.budget().used / one)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def run(seeds: int, noise: float, effects: Sequence[float] = EFFECTS, baseline_repeats: int = 2,
        noise_prior: float | None = None, prior_df: int = 12) -> dict[float, list[Outcome]]:
    out: dict[float, list[Outcome]] = {e: [] for e in effects}
    with tempfile.TemporaryDirectory(prefix="attune-decisions-") as tmp:
        for e in effects:
            for seed in range(seeds):
                o = one_run(seed, e, noise, Path(tmp), baseline_repeats, noise_prior, prior_df)
                if o is not None:
                    out[e].append(o)
    return out


def table(results: dict[float, list[Outcome]], noise: float, noise_prior: float | None = None,
          prior_df: int = 12) -> str:
    prior = ("" if noise_prior is None else
             f"; a noise prior of {noise_prior:.3f} from {prior_df} df (what past runs on the cluster would say)")
    lines = [f"run-to-run noise: log-normal sigma {noise:.3g} per run (the simulator's{'' if noise <= SHIPPED_NOISE else ', turned up'}){prior}", "",
             "| true effect | runs | kept | share kept (95 % interval) | kept on the first run | went past the first look "
             "| looks, mean | trials per run | candidate never ran (refused by the engine's gate, or unaffordable) |", "|---|---|---|---|---|---|---|---|---|"]
    for e, outs in results.items():
        k, n = sum(o.kept for o in outs), len(outs)
        lo, hi = wilson(k, n)
        second = sum(o.looks >= 2 for o in outs)
        trials = sum(o.trials for o in outs) / max(n, 1)
        first = sum(o.first_run for o in outs)
        looks = sum(o.looks for o in outs) / max(n, 1)
        lines.append(f"| {e:+.0%} | {n} | {k} | {k / max(n, 1):.1%} ({lo:.1%} – {hi:.1%}) | {first} | {second} | "
                     f"{looks:.2f} | {trials:.1f} | {sum(not o.ran for o in outs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attune.bench.decisions", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=400, help="runs per true effect (default 400)")
    ap.add_argument("--noise", type=float, default=0.20, help="log-normal sigma of one run's step time")
    ap.add_argument("--effects", type=float, nargs="+", default=list(EFFECTS))
    ap.add_argument("--baseline-repeats", type=int, default=2,
                    help="baseline runs (2 as shipped; 3 or more gives the first candidate the noise estimate a "
                         "decisive first-run keep needs)")
    ap.add_argument("--noise-prior", type=float, default=None,
                    help="a noise prior (log-sd) the run starts with, as a warm run's lessons give it; a value below "
                         "--noise is a prior that understates this job's noise")
    ap.add_argument("--prior-df", type=int, default=12, help="the noise prior's degrees of freedom (default 12)")
    args = ap.parse_args(argv)
    results = run(args.seeds, args.noise, args.effects, args.baseline_repeats, args.noise_prior, args.prior_df)
    print(table(results, args.noise, args.noise_prior, args.prior_df))
    zero = results.get(0.0)
    if zero:
        rate = sum(o.kept for o in zero) / len(zero)
        lo, hi = wilson(sum(o.kept for o in zero), len(zero))
        target = 0.02 if args.noise <= SHIPPED_NOISE else 0.05
        print(f"\nfalse keeps at zero effect: {rate:.1%} (95 % interval {lo:.1%} – {hi:.1%}; target ≤ {target:.0%} "
              f"at {'the shipped' if args.noise <= SHIPPED_NOISE else 'this'} noise)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
