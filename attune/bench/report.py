"""Benchmark outputs: ``bench.json``, Markdown tables (``bench.md``) and PNG plots (Agg backend, files only)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

GRID = 41
"""Points of the budget-fraction grid on which anytime curves are resampled and averaged over seeds."""
GROUP_TITLES = {"all": "all recipes", "headroom": "headroom group (optimum ≥ 1.25 × the start)",
                "little-left": "little-left-to-gain group (NVIDIA-published rows and near-optimal starts)"}


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return format(x, spec)


def _ci(ci: Any, spec: str = ".3f") -> str:
    if not ci:
        return ""
    return f" [{_fmt(ci[0], spec)}, {_fmt(ci[1], spec)}]"


def _tuner_table(per: dict[str, Any], tuners: list[str]) -> list[str]:
    lines = ["| tuner | runs | median fraction of optimum [95% CI] | worst (run) | median share of available gain "
             "[95% CI] | trials' worth to 0.95 of optimum, median (reached) | anytime AUC | wasted share | "
             "budget left, median | mean trials (failed) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in tuners:
        s = per.get(t, {})
        if not s.get("available"):
            lines.append(f"| {t} | 0 | not run: {s.get('error', '')} | | | | | | | |")
            continue
        lines.append(
            f"| {t} | {s['runs']} | {_fmt(s['median_fraction_of_optimum'])}{_ci(s['ci_fraction_of_optimum'])} | "
            f"{_fmt(s['min_fraction_of_optimum'])} ({s['worst_run']}) | "
            f"{_fmt(s['median_gain_share'])}{_ci(s['ci_gain_share'])} | "
            f"{_fmt(s['median_trials_to_target'], '.1f') if s['median_trials_to_target'] is not None else 'never'}"
            f" ({s['reached_target']}/{s['runs']}) | {_fmt(s['median_auc'])} | "
            f"{s['wasted_fraction_of_budget']:.1%} | {_fmt(s['median_budget_left'], '.0%')} | "
            f"{s['mean_trials_launched']:.1f} ({s['mean_trials_failed']:.1f}) |")
    return lines


def _budget_sections(doc: dict[str, Any], level: str = "##") -> list[str]:
    tuners = doc["tuners"]
    summary = doc["summary"]
    lines: list[str] = []
    lines += [f"{level} Budget {doc['budget']}: {GROUP_TITLES['all']}", ""] + _tuner_table(summary["tuners"], tuners)
    for g in ("headroom", "little-left"):
        per = summary.get("groups", {}).get(g)
        if per:
            names = ", ".join(c["name"] for c in doc["cases"] if c.get("group") == g)
            lines += ["", f"{level} Budget {doc['budget']}: {GROUP_TITLES[g]}", "", f"Recipes: {names}.", ""]
            lines += _tuner_table(per, tuners)
    llm_rows = []
    for t in tuners:
        rs = [r for r in doc["runs"] if r["tuner"] == t and r.get("available") and
              (r.get("policy_stats") or {}).get("llm_proposals")]
        if rs:
            n = sum(r["policy_stats"]["llm_proposals"] for r in rs)
            tok = sum(r["policy_stats"].get("llm_tokens", 0) for r in rs)
            sec = sum(r["policy_stats"].get("llm_seconds", 0.0) for r in rs)
            fb = sum(r["policy_stats"].get("llm_fallbacks", 0) for r in rs)
            own = n - fb
            llm_rows.append(f"| {t} | {n} | {own} ({own / n:.0%}) | {tok / n:,.0f} | {sec / n:.1f} | "
                            f"{fb} ({fb / n:.0%}) |")
    if llm_rows:
        lines += ["", f"LLM proposals at {doc['budget']} (the model's quality, not the tuner's, decides these; its own "
                      "answers are new and admissible, or they are asked again and then handed over):", "",
                  "| tuner | proposals | the model's own | tokens per proposal | seconds per proposal | "
                  "playbook / random took over |", "|---|---|---|---|---|---|", *llm_rows]
    a = summary["tuners"].get("attune", {})
    if a.get("available"):
        lines += ["", f"How attune's runs ended at {doc['budget']} (median budget left "
                      f"{_fmt(a['median_budget_left'], '.0%')}):", ""]
        lines += [f"- {n}× {reason}" for reason, n in a["stop_reasons"].items()]
    return lines


def _per_recipe(doc: dict[str, Any]) -> list[str]:
    per = doc["summary"]["tuners"]
    avail = [t for t in doc["tuners"] if per.get(t, {}).get("available")]
    lines = [f"## Median fraction of optimum per recipe at {doc['budget']}", "",
             "| recipe | group | devices | seq | optimum × start | " + " | ".join(avail) + " |",
             "|---|---|---|---|---|" + "---|" * len(avail)]
    for c in doc["cases"]:
        o = c["oracle"]
        gain = o["optimum_tps"] / o["baseline_tps"] if o["baseline_tps"] else None
        cells = []
        for t in avail:
            fr = [r["fraction_of_optimum"] for r in doc["runs"]
                  if r["recipe"] == c["name"] and r["tuner"] == t and r.get("available")]
            cells.append(_fmt(statistics.median(fr)) if fr else "—")
        lines.append(f"| {c['name']} | {c.get('group', '')} | {c['devices']} × {c['accelerator']} | "
                     f"{c.get('seq_length', '')} | {_fmt(gain, '.2f')}× | " + " | ".join(cells) + " |")
    return lines


def _oracle(doc: dict[str, Any]) -> list[str]:
    lines = ["## Oracle", "", "| recipe | search space | admissible | OOM | optimum tok/s/dev | optimum knobs |",
             "|---|---|---|---|---|---|"]
    for c in doc["cases"]:
        o = c["oracle"]
        lines.append(f"| {c['name']} | {o['space_size']:,} | {o['admissible']:,} | {o['oom']:,} | "
                     f"{o['optimum_tps']:,.0f} | {', '.join(f'{k}={v}' for k, v in o['optimum_knobs'].items())} |")
    return lines


def _criteria(check: dict[str, Any]) -> list[str]:
    if not check:
        return []
    return ["## Done criteria (issue)", ""] + [f"- {k}: {v}" for k, v in check.items()]


_PREAMBLE = ("Simulator backend; every tuner runs in the same engine behind the same gate, with the same budget "
             "rule (a candidate runs only when the budget left pays for its whole decision at its predicted "
             "worst-case cost). fraction = noiseless throughput of the best kept recipe / exhaustive optimum; share of "
             "available gain = (best − start) / (optimum − start), where the optimum is > 0.5 % above the start; "
             "trials' worth to 0.95 = accelerator-hours until the kept recipe reached 0.95 of the optimum, in units "
             "of one trial of the starting recipe (never = did not within the budget: not counted as the budget; "
             "a median of 'never' means fewer than half the runs got there); anytime AUC = mean fraction of the "
             "optimum over the budget. Confidence intervals: percentile bootstrap over (recipe, seed) runs.")


def markdown(doc: dict[str, Any]) -> str:
    """One budget's benchmark as Markdown: per-tuner summaries (all, per group), per recipe, oracle, criteria."""
    lines = [f"# attune tuner benchmark: `{doc['suite']}`", "",
             f"Budget {doc['budget']} per recipe, {doc['seeds']} seed(s), attune policy `{doc['attune_policy']}`. "
             + _PREAMBLE, "", f"{doc.get('llm', '')}", ""]
    lines += _budget_sections(doc)
    lines += [""] + _per_recipe(doc) + [""] + _oracle(doc)
    crit = _criteria(doc["summary"].get("done_criteria") or {})
    if crit:
        lines += [""] + crit
    return "\n".join(lines) + "\n"


def markdown_combined(doc: dict[str, Any]) -> str:
    """Several budgets: the trend table, each budget's summaries, per-recipe tables, oracle and criteria."""
    budgets = list(doc["budgets"])
    first = doc["budgets"][budgets[0]]
    tuners = doc["tuners"]
    lines = [f"# attune tuner benchmark: `{doc['suite']}` at {', '.join(budgets)}", "",
             f"{len(first['cases'])} recipes, {doc['seeds']} seed(s) per (recipe, tuner, budget), attune policy "
             f"`{doc['attune_policy']}`. " + _PREAMBLE, "", doc.get("llm", ""), "",
             "## Median fraction of optimum by budget", "",
             "| tuner | " + " | ".join(f"{b} all" for b in budgets) + " | "
             + " | ".join(f"{b} headroom" for b in budgets) + " | " + " | ".join(f"{b} little-left" for b in budgets)
             + " |", "|---|" + "---|" * (3 * len(budgets))]
    for t in tuners:
        cells = []
        for g in ("all", "headroom", "little-left"):
            for b in budgets:
                s = doc["budgets"][b]["summary"]
                per = s["tuners"] if g == "all" else s.get("groups", {}).get(g, {})
                v = per.get(t, {})
                cells.append(_fmt(v.get("median_fraction_of_optimum")) if v.get("available") else "—")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    for b in budgets:
        lines += [""] + _budget_sections(doc["budgets"][b])
    for b in budgets:
        lines += [""] + _per_recipe(doc["budgets"][b])
    lines += [""] + _oracle(first)
    crit = _criteria(doc.get("done_criteria") or {})
    if crit:
        lines += [""] + crit
    return "\n".join(lines) + "\n"


def _resample(curve: list[list[float]], budget: float, optimum: float) -> list[float]:
    out, j, cur = [], 0, (curve[0][1] if curve else 0.0)
    for i in range(GRID):
        x = budget * i / (GRID - 1)
        while j < len(curve) and curve[j][0] <= x + 1e-12:
            cur = curve[j][1]
            j += 1
        out.append(cur / optimum if optimum else 0.0)
    return out


def anytime_plot(doc: dict[str, Any], path: Path) -> Path:
    """Median (over seeds) fraction of optimum against the share of budget spent, one panel per recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = doc["cases"]
    cols = min(5, len(cases))
    rows = (len(cases) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), dpi=100, squeeze=False)
    xs = [i / (GRID - 1) for i in range(GRID)]
    for ax, c in zip(axes.flat, cases):
        opt = c["oracle"]["optimum_tps"]
        for t in doc["tuners"]:
            rs = [r for r in doc["runs"] if r["recipe"] == c["name"] and r["tuner"] == t and r.get("available")]
            if not rs:
                continue
            ys = [_resample(r["curve"], r["budget_hours"], opt) for r in rs]
            med = [statistics.median(col) for col in zip(*ys)]
            ax.step(xs, med, where="post", label=t)
        ax.set_title(c["name"], fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6, loc="lower right")
    fig.supxlabel(f"share of budget spent ({doc['budget']})")
    fig.supylabel("best kept throughput / optimum")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def summary_plot(doc: dict[str, Any], path: Path) -> Path:
    """Fraction of optimum per tuner (box over recipes × seeds) and wasted share of budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = doc["summary"]["tuners"]
    tuners = [t for t in doc["tuners"] if per.get(t, {}).get("available")]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    data = [[r["fraction_of_optimum"] or 0.0 for r in doc["runs"] if r["tuner"] == t and r.get("available")]
            for t in tuners]
    if tuners:
        a1.boxplot(data, tick_labels=tuners)
        a2.bar(tuners, [per[t]["wasted_fraction_of_budget"] for t in tuners], color="tab:red")
    a1.set_ylabel(f"fraction of exhaustive optimum ({doc['budget']})")
    a1.axhline(0.95, color="grey", ls="--", lw=0.8)
    a1.grid(alpha=0.3)
    a2.set_ylabel("share of budget spent on failed trials")
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def budget_plot(doc: dict[str, Any], path: Path) -> Path:
    """Median fraction of the optimum (all recipes, headroom group) against the budget, one line per tuner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = list(doc["budgets"])
    xs = list(range(len(budgets)))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), dpi=100)
    for ax, g in zip(axes, ("all", "headroom", "little-left")):
        for t in doc["tuners"]:
            ys = []
            for b in budgets:
                s = doc["budgets"][b]["summary"]
                v = (s["tuners"] if g == "all" else s.get("groups", {}).get(g, {})).get(t, {})
                ys.append(v.get("median_fraction_of_optimum") if v.get("available") else None)
            if any(y is not None for y in ys):
                ax.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o", label=t)
        ax.set_xticks(xs, budgets)
        ax.set_title(GROUP_TITLES[g].split(" (")[0], fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_xlabel("budget (trials' worth)")
    axes[0].set_ylabel("median fraction of optimum")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``bench.json``, ``bench.md``, ``anytime.png`` and ``summary.png`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "markdown": out / "bench.md", "anytime": out / "anytime.png",
             "summary": out / "summary.png"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str))
    paths["markdown"].write_text(markdown(doc))
    anytime_plot(doc, paths["anytime"])
    summary_plot(doc, paths["summary"])
    return paths


def write_combined(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Several budgets: ``bench.md`` and ``budget.png`` under ``out_dir`` (each budget's files are under
    ``out_dir/<budget>/``), plus the largest budget's ``anytime.png`` and the middle budget's ``summary.png``."""
    import shutil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    budgets = list(doc["budgets"])
    paths = {"markdown": out / "bench.md", "budget": out / "budget.png", "anytime": out / "anytime.png",
             "summary": out / "summary.png", "json": out / "bench.json"}
    slim = {k: v for k, v in doc.items() if k != "budgets"}
    slim["budgets"] = {b: {"summary": d["summary"], "cases": d["cases"]} for b, d in doc["budgets"].items()}
    paths["json"].write_text(json.dumps(slim, indent=1, default=str))
    paths["markdown"].write_text(markdown_combined(doc))
    budget_plot(doc, paths["budget"])
    shutil.copyfile(out / budgets[-1] / "anytime.png", paths["anytime"])
    shutil.copyfile(out / budgets[len(budgets) // 2] / "summary.png", paths["summary"])
    return paths
