"""Build and write a run's results from its state."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from attune.engine.loop import certification_note
from attune.engine.state import RunState
from attune.recipe.io import dump_recipe
from attune.trial import TrialOutcome

log = logging.getLogger(__name__)

#: ``ATTUNE_PLOTS=off``: write no PNG chart (a card verification, a CI job); everything else is written
PLOTS_ENV = "ATTUNE_PLOTS"


def throughput_unit(state: RunState) -> str:
    """What the run's throughputs count: tokens, unless its trials said they counted samples (an HF launch whose
    sample length nothing states: the fixed global batch is then the unit of work)."""
    units = {str(r.measurement.reported.get("throughput_unit", "")) for r in state.baselines() if r.measurement}
    return "samples/s per device" if units == {"samples"} else "tokens/s per device"


def build_result(state: RunState) -> dict[str, Any]:
    """The ``result.json`` document: headline figures and every trial."""
    base = state.baseline_throughput()
    best = state.best_throughput()
    budget = state.budget()
    best_rec = state.best_record()
    trials = []
    for r in state.records:
        m = r.measurement
        trials.append({
            "id": r.id, "kind": r.kind, "change": r.change, "source": r.source, "rationale": r.rationale,
            "verdict": r.verdict, "outcome": r.outcome.value, "message": r.message,
            "throughput": m.tokens_per_s_per_device if m else None,
            "step_time_median_s": m.step_time_median_s if m else None,
            "noise_cv": m.step_time_cv if m else None,
            "peak_memory_mb": m.peak_memory_mb if m else None,
            "charged_hours": r.charged_hours, "wall_s": r.wall_s,
            "accepted": r.accepted, "decision": r.decision, "status": r.status.value, "gain": r.gain,
            "gain_tps": state.throughput_of(r.signature, ("candidate", "confirm")) if r.accepted else None,
            "loss_check": r.loss_check,
            "reported": dict(m.reported) if m else {},  # the contract as the job's own log stated it (verified)
        })
    best_recipe = state.best_recipe()
    certified = state.certified()
    measured = bool(base)
    search_speedup = state.search_speedup()  # exactly 1 when nothing was kept, whatever the baseline's runs measured
    return {
        "recipe": state.baseline.name,
        "framework": state.baseline.framework,
        "status": "finished" if state.finished else "running",
        "stop_reason": state.finished,
        "throughput_unit": throughput_unit(state),
        "baseline_throughput": base,
        "best_throughput": best,
        # the headline: the certified speedup where certification ran, else the search's own estimate
        "speedup": certified.speedup if certified else search_speedup,
        "speedup_low": certified.low if certified else None,
        "speedup_high": certified.high if certified else None,
        "certified": certified.to_dict() if certified else None,
        "certification": certification_note(state, certified) if measured else
        "nothing was measured (no baseline ran to the end), so there is no speedup",
        "search_speedup": search_speedup,
        "noise_floor": state.floor() if state.baselines() else None,
        "budget_hours": state.config.budget_hours,
        "budget_used_hours": budget.used,
        "trials_launched": sum(1 for r in state.records if r.launched),
        "trials_refused": sum(1 for r in state.records if r.outcome is TrialOutcome.REFUSED),
        "trials_failed": sum(1 for r in state.records if r.outcome.failed),
        # measurement faults (a burst of output lines, steps faster than the job's clock, a run far from its twins):
        # never used as measurements, and run again
        "trials_mismeasured": sum(1 for r in state.records if r.outcome is TrialOutcome.MISMEASURED),
        "best_trial": best_rec.id if best_rec else None,
        "best_changes": state.baseline.knob_changes(best_recipe.effective_knobs),
        "kept_without_mechanism": kept_without_mechanism(state),
        "setup": [dict(s) for s in state.setup],  # one-time set-up before the first trial: its own line
        "trials": trials,
    }


def kept_without_mechanism(state: RunState) -> dict[str, str]:
    """Kept changes the framework says cannot change this recipe's throughput (knob → why): undoing one alone
    would be a move that cannot matter, so its measured gain was noise. Flagged in every report, never hidden."""
    best = state.best_recipe()
    measured = state.best_measurement()
    out: dict[str, str] = {}
    for knob in state.baseline.knob_changes(best.effective_knobs):
        try:
            undone = best.with_knobs(**{knob: state.baseline.knob(knob)})
        except Exception:  # noqa: BLE001 - undoing one knob alone can make an invalid recipe: nothing to say
            continue
        why = best.framework_impl.cannot_matter(undone, best, measured)
        if why:
            out[knob] = why
    return out


def write_outputs(state: RunState, run_dir: str | Path, *, plots: bool = True,
                  html: bool | None = None) -> dict[str, Path]:
    """Write result.json, best-recipe.yaml, report.md (and throughput.png and report.html); return their paths.

    ``html`` (default: as ``plots``) writes the self-contained ``report.html`` (:mod:`attune.report.html`).
    """
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    if html is None:
        html = plots
    if os.environ.get(PLOTS_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        plots = False  # no PNG chart (matplotlib); the HTML report, with its own SVG charts, is still written
    try:  # once per run: the machine and software the trials run on, and the command that started them
        from attune.report.environment import ensure

        ensure(out, _journal_backend(out))
    except Exception as err:  # noqa: BLE001 - provenance is best-effort; it must never lose the results
        log.warning("could not record the run's environment: %s", err)
    result = build_result(state)
    paths = {"result": out / "result.json", "best_recipe": out / "best-recipe.yaml", "report": out / "report.md"}
    tmp = paths["result"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(paths["result"])
    dump_recipe(state.best_recipe(), paths["best_recipe"])
    if plots:
        try:
            from attune.report.plots import throughput_plot

            paths["plot"] = throughput_plot(result, out / "throughput.png")
        except Exception as err:  # a plot must never lose the results
            log.warning("could not draw the throughput plot: %s", err)
    if html:
        try:
            from attune.report.html import write_report
            from attune.report.run import view_of

            paths["html"] = write_report(view_of(state, out))
        except Exception as err:  # noqa: BLE001 - the page must never lose the results
            log.warning("could not write the HTML report: %s", err)
    paths["report"].write_text(render_markdown(result, paths.get("plot"), paths.get("html")))
    return paths


def _journal_backend(run_dir: Path) -> str | None:
    """The backend named by the run's first journal line (without reading the whole journal)."""
    try:
        with (run_dir / "journal.jsonl").open() as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return None
    backend = first.get("backend")
    return str(backend) if backend else None


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "—" if x is None else format(x, spec)


def render_markdown(result: dict[str, Any], plot: Path | None = None, html: Path | None = None) -> str:
    lines = [
        f"# attune report: {result['recipe']}",
        "",
        f"- baseline: **{_fmt(result['baseline_throughput'])}** {result['throughput_unit']}" if
        result["baseline_throughput"] else "- baseline: **not measured**",
        f"- speedup: **{result.get('certification') or _fmt(result['speedup'], '.2f') + '×'}**",
        f"- best: **{_fmt(result['best_throughput'])}** (the search's own estimate: "
        f"{_fmt(result.get('search_speedup', result['speedup']), '.2f')}× the baseline)" if
        result["baseline_throughput"] else "- best: nothing was measured",
        f"- changes kept: {', '.join(f'`{k}={v}`' for k, v in result['best_changes'].items()) or 'none'}",
        f"- budget: {result['budget_used_hours']:.4f} of {result['budget_hours']:g} accelerator-hours; "
        f"{result['trials_launched']} trials launched, {result['trials_failed']} failed, "
        f"{result['trials_refused']} refused by the gate"
        + (f", {result['trials_mismeasured']} measurement faults (not used; run again)"
           if result.get("trials_mismeasured") else ""),
        f"- noise floor: {_fmt(result['noise_floor'], '.1%')}; "
        f"stopped because: {result['stop_reason'] or 'still running'}",
        "",
    ]
    for s in result.get("setup") or []:
        lines += [f"- set-up before the first trial (outside every trial and its figures): {s['what']}, "
                  f"{s['wall_s']:.0f} s" + ("" if s.get("ok") else f", failed ({s.get('message')})")]
    if result.get("setup"):
        lines.append("")
    for knob, why in (result.get("kept_without_mechanism") or {}).items():
        lines += [f"> **Warning: kept without a mechanism**: `{knob}`: {why}. Its measured gain was noise; drop it "
                  "from the recipe.", ""]
    if html:
        lines += [f"The full report (charts, diff, loss curves, lessons) is [{html.name}]({html.name}).", ""]
    if plot:
        lines += [f"![throughput per trial]({plot.name})", ""]
    lines += ["| # | kind | change | outcome | tokens/s/dev | CV | hours | decision |",
              "|---|---|---|---|---|---|---|---|"]
    for t in result["trials"]:
        change = ", ".join(f"{k}={v}" for k, v in t["change"].items()) or "(baseline)"
        lines.append(f"| {t['id']} | {t['kind']} | {change} | {t['outcome']} | {_fmt(t['throughput'])} | "
                     f"{_fmt(t['noise_cv'], '.1%')} | {t['charged_hours']:.4f} | {t['decision']} |")
    reported = [t for t in result["trials"] if t.get("reported")]
    if reported:
        names = sorted({k for t in reported for k in t["reported"]})
        lines += ["", "What each trial's own log reported about its contract (checked against its recipe and the "
                      "baseline's run; a contradiction is a contract violation):", "",
                  "| # | " + " | ".join(n.replace("_", " ") for n in names) + " |",
                  "|---|" + "---|" * len(names)]
        lines += [f"| {t['id']} | " + " | ".join(f"{t['reported'][n]:,}" if isinstance(t["reported"].get(n), int)
                                                 else str(t["reported"].get(n, "")) for n in names) + " |"
                  for t in reported]
    return "\n".join(lines) + "\n"
