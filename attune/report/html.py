"""``report.html``: one self-contained page per run (inline CSS, SVG and a few lines of JavaScript; no network).

It shows the best-so-far throughput against accelerator-hours with every trial marked by what happened to it,
the trial table (change, diagnosis, the policy's rationale, throughput and noise, hours, gate verdict, loss
check, decision), the baseline → tuned diff in the framework's own form, the loss curves of both recipes over
the tolerance band, and the lessons the run added or changed.
"""

from __future__ import annotations

import json
import time
from html import escape
from pathlib import Path
from typing import Any

from attune.report import evidence as ev
from attune.report import svg
from attune.report.environment import iso
from attune.report.run import RunView
from attune.report.style import BASE_CSS
from attune.report.trials import CATEGORIES, fates, own_category
from attune.trial import FAILED_OUTCOMES

FILENAME = "report.html"

_REPORT_JS = """
(function () {
  var rows = Array.prototype.slice.call(document.querySelectorAll('#trials tbody tr'));
  var sel = document.getElementById('trial-filter');
  function apply() {
    var v = sel.value, shown = 0;
    rows.forEach(function (r) {
      var ok = v === 'all' || r.getAttribute('data-category') === v ||
               (v === 'failed' && r.getAttribute('data-failed') === '1');
      r.style.display = ok ? '' : 'none';
      if (ok) { shown += 1; }
    });
    document.getElementById('trial-count').textContent = shown + ' of ' + rows.length + ' trials';
  }
  sel.addEventListener('change', apply);
  apply();
  Array.prototype.forEach.call(document.querySelectorAll('.chart .trial'), function (m) {
    m.addEventListener('click', function () {
      var row = document.getElementById('trial-' + m.getAttribute('data-trial'));
      if (!row) { return; }
      rows.forEach(function (r) { r.classList.remove('highlight'); });
      row.classList.add('highlight');
      row.scrollIntoView({block: 'center'});
    });
  });
  document.documentElement.setAttribute('data-ready', '1');
})();
"""


def _fmt(x: float | None, spec: str = ",.0f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def badge(text: str, cls: str = "", colour: str | None = None) -> str:
    style = f' style="background:{colour}"' if colour else ""
    return f'<span class="badge {cls}"{style}>{escape(text)}</span>'


def category_badge(cat: str) -> str:
    label, colour = CATEGORIES.get(cat, (cat, "#888"))
    return badge(label, f"cat-{cat}", colour)


def backend_badge(backend: str | None) -> str:
    if backend in ("sim", "fake"):
        return badge("simulated" if backend == "sim" else "fake backend (test)", "sim")
    return badge("measured" + (f" ({backend})" if backend else ""), "real")


#: what the gate column says of runs that are no proposal: they run recipes the gate already judged
NOT_PROPOSALS = {"baseline": "the baseline recipe itself (nothing to gate)",
                 "reference": "a re-run of the best recipe (each of its changes was admitted when it was tried)"}


def verdict_cell(verdict: dict[str, Any] | None, kind: str | None = None) -> str:
    if kind in NOT_PROPOSALS:
        return f'<span class="muted">{escape(NOT_PROPOSALS[kind])}</span>'
    if not verdict:
        return '<span class="muted">—</span>'
    if verdict.get("admitted"):
        owed = verdict.get("owed") or []
        text = f"admitted · {verdict.get('semantics', '')}" + (f" · owes {', '.join(owed)}" if owed else "")
        return f'<span class="gate-ok">{escape(text)}</span>'
    reasons = "; ".join(f"[{r.get('code')}] {r.get('field')}: {r.get('message')}" for r in verdict.get("reasons", []))
    return f'<span class="gate-refused">refused</span> <span class="muted">{escape(reasons)}</span>'


def loss_cell(t: dict[str, Any]) -> str:
    lc = t.get("loss_check")
    if not lc:
        return '<span class="muted">—</span>'
    ok = bool(lc.get("passed"))
    return (badge("equivalent" if ok else "differs", "pass" if ok else "fail")
            + f' <span class="muted">{escape(str(lc.get("reason", "")))}</span>')


def diff_html(diff: dict[str, Any]) -> str:
    lines = []
    for line in diff.get("diff") or []:
        cls = ("hunk" if line.startswith(("@@", "+++", "---")) else "add" if line.startswith("+")
               else "del" if line.startswith("-") else "")
        lines.append(f'<span class="{cls}">{escape(line)}</span>' if cls else escape(line) + "\n")
    body = "".join(lines) if lines else "(no difference: the tuned recipe is the baseline)"
    changes = diff.get("changes") or {}
    rows = "".join(f"<tr><td><code>{escape(k)}</code></td><td><code>{escape(str(c['from']))}</code></td>"
                   f"<td><code>{escape(str(c['to']))}</code></td></tr>" for k, c in changes.items())
    table = (f'<table class="changes"><thead><tr><th>knob</th><th>baseline</th><th>tuned</th></tr></thead>'
             f"<tbody>{rows}</tbody></table>") if rows else ""
    return (f'<p class="muted">{escape(diff.get("label", ""))}</p>{table}'
            f'<pre class="diff" data-form="{escape(diff.get("form", ""))}">{body}</pre>')


def loss_section(evidence: dict[str, Any], simulated: bool) -> str:
    parts = [svg.loss_chart(evidence), svg.loss_diff_chart(evidence), svg.loss_legend()]
    verdict = evidence.get("verdict", "")
    cls = {"passed": "pass", "failed": "fail"}.get(verdict, "na")
    parts.append(f'<p>Loss-equivalence verdict for the tuned recipe: {badge(verdict, cls)}'
                 f'{" (required: a kept change reorders floating-point sums)" if evidence.get("required") else ""}'
                 "</p>")
    if evidence.get("tolerance_basis"):
        tol = evidence.get("tolerance") or [0.0]
        parts.append(f'<p class="muted">Tolerance band: {escape(evidence["tolerance_basis"])}; derived from '
                     f'{evidence.get("drift_runs")} equivalent runs; widest {max(tol):.3g}.</p>')
    if evidence.get("comparison"):
        parts.append(f'<p class="muted">Tuned vs baseline: {escape(str(evidence["comparison"]["reason"]))}</p>')
    if not evidence.get("modelled"):
        parts.append('<p class="muted">The losses are all zero: '
                     + ("the simulator models step time and memory, not training loss, so this check is vacuous "
                        "for simulated runs." if simulated else "this backend recorded no loss values.") + "</p>")
    checks = evidence.get("checks") or []
    if checks:
        rows = "".join(
            f"<tr><td>{c['trial']}</td><td><code>{escape(ev_change(c.get('change')))}</code></td>"
            f"<td>{badge('passed' if c.get('passed') else 'failed', 'pass' if c.get('passed') else 'fail')}</td>"
            f"<td class='num'>{_fmt(c.get('max_abs_diff'), '.3g')}</td><td class='num'>"
            f"{_fmt(c.get('tolerance_max'), '.3g')}</td><td>{escape(str(c.get('reason', c.get('decision', ''))))}"
            "</td></tr>" for c in checks)
        parts.append('<h3>Every loss-equivalence check of the run</h3><table class="loss-checks"><thead><tr>'
                     '<th>#</th><th>change</th><th>verdict</th><th class="num">max |Δloss|</th>'
                     f'<th class="num">widest tolerance</th><th>reason</th></tr></thead><tbody>{rows}</tbody></table>')
    return "".join(parts)


def ev_change(change: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (change or {}).items()) or "(baseline)"


def steered_table(lessons: dict[str, Any]) -> str:
    """The proposals lessons moved in this run and what came of them."""
    def gain(t: dict[str, Any]) -> str:
        return "—" if t.get("gain") is None else f"{t['gain']:+.1%}"

    rows = "".join(
        f"<tr><td>{t['trial']}</td><td>{escape(ev_change(t.get('change')))}</td>"
        f"<td><code>{escape(', '.join(t.get('lessons') or []))}</code></td><td>{escape(str(t.get('outcome')))}</td>"
        f"<td>{gain(t)}</td><td>{'kept' if t.get('kept') else 'not kept'}</td></tr>"
        for t in lessons.get("steered") or [])
    if not rows:
        return ""
    return ('<p>Proposals the lessons moved in this run, and what came of them:</p><table class="lessons"><thead><tr>'
            "<th>trial</th><th>change</th><th>lessons</th><th>outcome</th><th>gain</th><th></th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def lessons_section(lessons: dict[str, Any]) -> str:
    items = lessons.get("lessons") or []
    note = f'<p class="muted">{escape(lessons["note"])}</p>' if lessons.get("note") else ""
    moved = steered_table(lessons)
    if not items:
        return (note or '<p class="muted">No lessons.</p>') + moved
    rows = "".join(f"<tr><td>{escape(str(i.get('change')))}</td><td><code>{escape(str(i.get('id') or '—'))}</code>"
                   f"</td><td>{escape(str(i.get('summary')))}</td><td>{escape(str(i.get('status')))}</td>"
                   f"<td>{escape(str(i.get('scope')))}</td></tr>" for i in items)
    store = f'<p class="muted">Store: <code>{escape(lessons["store"])}</code></p>' if lessons.get("store") else ""
    return (f'{note}{store}<table class="lessons"><thead><tr><th></th><th>id</th><th>lesson</th><th>status</th>'
            f"<th>scope</th></tr></thead><tbody>{rows}</tbody></table>{moved}")


def trial_table(result: dict[str, Any], diag: dict[int, dict[str, Any]]) -> str:
    trials = result.get("trials") or []
    fate = fates(trials)
    rows = []
    for t in trials:
        cat = fate.get(t["id"], own_category(t))
        own = own_category(t)
        d = diag.get(t["id"])
        dtext = (f"{d['label']} ({d['confidence']:.0%})" if d else "—")
        devid = escape("; ".join(d["evidence"][:3])) if d and d.get("evidence") else ""
        tp, cv = t.get("throughput"), t.get("noise_cv")
        noise = f" ± {tp * cv:,.0f}" if tp and cv is not None else ""
        what = category_badge(cat)
        if own != cat:
            what += f' <span class="muted">(at this step: {escape(CATEGORIES.get(own, (own, ""))[0])})</span>'
        failed = "1" if t.get("outcome") in FAILED_OUTCOMES else "0"
        message = f'<div class="muted">{escape(str(t.get("message")))}</div>' if t.get("message") else ""
        decision = f'<div class="decision">{escape(str(t.get("decision") or ""))}</div>' if t.get("decision") else ""
        gate = verdict_cell(t.get("verdict"), t.get("kind"))
        if t.get("loss_check"):
            gate += f'<div>loss check: {loss_cell(t)}</div>'
        rows.append(
            f'<tr id="trial-{t["id"]}" data-category="{cat}" data-failed="{failed}" data-kind="{escape(t["kind"])}">'
            f'<td class="num">{t["id"]}</td><td>{escape(t["kind"])}</td>'
            f'<td><code>{escape(ev_change(t.get("change")))}</code></td>'
            f"<td>{what}{decision}{message}</td>"
            f'<td title="{devid}">{escape(dtext)}</td>'
            f'<td class="rationale">{escape(str(t.get("rationale") or ""))}'
            f'<div class="muted">{escape(str(t.get("source") or ""))}</div></td>'
            f'<td class="num">{_fmt(tp)}{noise}</td>'
            f'<td class="num">{_fmt(t.get("charged_hours"), ".4f")}</td>'
            f"<td class=\"gate\">{gate}</td></tr>")
    cats = sorted({fate.get(t["id"], own_category(t)) for t in trials}, key=list(CATEGORIES).index)
    options = ['<option value="all">every trial</option>']
    options += [f'<option value="{c}">{escape(CATEGORIES[c][0])}</option>' for c in cats]
    if any(t.get("outcome") in FAILED_OUTCOMES for t in trials):
        options.append('<option value="failed">any failure</option>')
    return (f'<div class="filters"><label>Show <select id="trial-filter">{"".join(options)}</select></label>'
            f'<span id="trial-count" class="muted"></span></div>'
            '<div style="overflow:auto"><table id="trials"><thead><tr><th class="num">#</th><th>kind</th>'
            "<th>change</th><th>what happened</th><th>diagnosis</th><th>rationale (source)</th>"
            f'<th class="num">{escape(str(result.get("throughput_unit", "")).replace(" per device", "/device"))}'
            " ± noise</th>"
            '<th class="num">accel-hours</th><th>gate verdict and loss check</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _interval(result: dict[str, Any]) -> str:
    c = result["certified"]
    return (f"95 % interval {c['low']:.3f}–{c['high']:.3f}× ({c['pairs']} pair{'s' if c['pairs'] != 1 else ''}); "
            + ("gain shown" if c["shown"] else "no gain shown"))


def kpis(result: dict[str, Any]) -> str:
    sp = result.get("speedup")
    items = [
        ("baseline", f"{_fmt(result.get('baseline_throughput'))}", result.get("throughput_unit", "")),
        ("tuned", f"{_fmt(result.get('best_throughput'))}", result.get("throughput_unit", "")),
        ("speedup", f"{_fmt(sp, '.3f')}×", _interval(result) if result.get("certified") else
         (f"{(sp - 1) * 100:+.1f} %, not certified" if sp else "")),
        ("accelerator-hours", f"{result.get('budget_used_hours', 0):,.3f}", f"of {result.get('budget_hours', 0):g}"),
        ("trials", str(result.get("trials_launched", 0)),
         f"{result.get('trials_failed', 0)} failed, {result.get('trials_refused', 0)} refused"),
        ("noise floor", _fmt(result.get("noise_floor"), ".1%"), "smallest gain kept"),
    ]
    return '<div class="kpis">' + "".join(
        f'<div class="kpi" data-kpi="{escape(k)}"><div class="k">{escape(k)}</div><div class="v">{escape(v)}</div>'
        f'<div class="k">{escape(s)}</div></div>' for k, v, s in items) + "</div>"


def report_context(view: RunView) -> dict[str, Any]:
    """Everything the page shows, as data (the card builder reuses it)."""
    from attune.report.result import build_result

    state = view.state
    result = build_result(state)
    tuned = state.best_recipe()
    return {"result": result, "diff": ev.recipe_diff(state.baseline, tuned), "loss": ev.loss_evidence(state),
            "diagnoses": ev.diagnoses(state), "lessons": ev.run_lessons(state, view.name, view.backend)}


def render_report(view: RunView, context: dict[str, Any] | None = None) -> str:
    ctx = context or report_context(view)
    result = ctx["result"]
    state = view.state
    res = state.baseline.resources
    title = f"attune report: {result['recipe']}"
    stop = result.get("stop_reason") or ("still running" if view.status == "running" else "not finished")
    when = " · ".join(x for x in (f"started {iso(view.started_at)}" if view.started_at else "",
                                  f"finished {iso(view.finished_at)}" if view.finished_at else "") if x)
    env = view.environment or {}
    sw = env.get("software") or {}
    prov = ", ".join(f"{k} {v}" for k, v in sw.items() if v)
    if env.get("simulator"):
        prov += f"; simulator digest {env['simulator'].get('digest')}"
    names = [n for n in ("result.json", "best-recipe.yaml", "journal.jsonl", "throughput.png", "environment.json")
             if (view.run_dir / n).exists()] + ["report.md"]  # report.md is written right after this page
    files = " · ".join(f'<a href="{n}">{n}</a>' for n in names)
    kept = escape(ev_change(result.get("best_changes"))) if result.get("best_changes") else \
        "nothing (the baseline stays best)"
    moot = "".join(f'<p class="warn" id="kept-without-mechanism"><strong>Kept without a mechanism:</strong> '
                   f'<code>{escape(k)}</code>: {escape(why)}. Its measured gain was noise; drop it from the recipe.'
                   '</p>' for k, why in (result.get("kept_without_mechanism") or {}).items())
    data_json = json.dumps({"recipe": result["recipe"], "speedup": result.get("speedup"),
                            "trials": len(result.get("trials") or [])}).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{BASE_CSS}</style>
</head><body>
<header class="page"><h1>{escape(title)}</h1>
<div class="sub">{escape(state.baseline.framework)} · {res.nodes} × {res.devices_per_node} {escape(res.accelerator)}
 ({res.devices} devices) · policy {escape(str(view.policy or "?"))} · {backend_badge(view.backend)} ·
 run <code>{escape(view.name)}</code>{(" · " + escape(when)) if when else ""}</div></header>
<main>
<section id="summary"><h2>Summary</h2>{kpis(result)}
<p>Stopped because: {escape(str(stop))}</p>
<p id="certification">Final speedup: {escape(str(result.get("certification") or "—"))}</p>
<p>Kept: {kept}</p>{moot}
</section>
<section id="search"><h2>Best-so-far throughput against accelerator-hours</h2>
{svg.search_chart(result)}
{svg.search_legend(result)}
<p class="muted">Each marker is one trial at the accelerator-hours spent when it finished; whiskers are ± one
standard deviation of its step times. Failed trials and gate refusals sit in lanes of their own (they have no
throughput). Click a marker to find its row.</p>
</section>
<section id="trial-table"><h2>Trials</h2>{trial_table(result, ctx["diagnoses"])}</section>
<section id="diff"><h2>Baseline → tuned recipe</h2>{diff_html(ctx["diff"])}</section>
<section id="loss"><h2>Loss curves and the tolerance band</h2>{loss_section(ctx["loss"], view.simulated)}</section>
<section id="lessons"><h2>Lessons this run added or changed</h2>{lessons_section(ctx["lessons"])}</section>
<section id="provenance"><h2>Provenance</h2>
<p>Backend: {escape(str(view.backend))} · software: {escape(prov or "unknown")}</p>
<p class="muted">Files: {files}</p></section>
</main>
<footer>written by attune at {escape(iso(time.time()) or "")}; this page needs no network.</footer>
<script type="application/json" id="report-data">{data_json}</script>
<script>{_REPORT_JS}</script>
</body></html>
"""


def write_report(view: RunView, path: str | Path | None = None) -> Path:
    """Write ``report.html`` of the run (into its directory unless ``path`` says otherwise)."""
    out = Path(path) if path is not None else view.run_dir / FILENAME
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(render_report(view), encoding="utf-8")
    tmp.replace(out)
    return out
