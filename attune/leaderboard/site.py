"""``attune leaderboard build CARDS_DIR --out SITE_DIR``: a static site of recipe cards (opens from file://).

* ``index.html``: recipes ranked by tuned throughput per device within each (model, precision, hardware)
  group, with client-side filters (framework, hardware, model size, measured vs simulated, free text);
* ``cards/<id>.html``: one page per card with its search chart, loss curves over the tolerance band, every gate
  verdict, the diff and launch, provenance and the reproduce command; the card's YAML and its run's
  ``result.json`` are copied beside it;
* ``index.json``: the same ranking for tools; ``assets/site.css`` and ``assets/site.js``: everything the pages
  load. Nothing is fetched from the network.

Every card is checked (:func:`attune.cards.io.check_card`) before it is published; a card that disagrees with
its run fails the build.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from attune.cards.io import check_card, find_cards, load_card, result_of
from attune.cards.model import Card
from attune.errors import AttuneError
from attune.leaderboard.assets import SITE_CSS_EXTRA, SITE_JS
from attune.report import svg
from attune.report.environment import iso
from attune.report.html import badge, ev_change, kpis, loss_section
from attune.report.style import BASE_CSS

INDEX_SCHEMA = "attune.dev/leaderboard-index/v1"


@dataclass(frozen=True)
class Entry:
    card: Card
    path: Path
    result: dict[str, Any]

    @property
    def precision(self) -> str:
        training = self.card.recipe.tuned.get("training") or {}
        opt_in = [x for x in training.get("numerics_opt_in") or [] if x]
        base = str(training.get("precision") or "native precision")
        return base + (f" (opts in to {', '.join(opt_in)})" if opt_in else "")

    @property
    def model_label(self) -> str:
        m = self.card.model
        n = m.parameters or 0
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e7 else f"{n / 1e6:.2g}M" if n else "?"
        return f"{m.family or 'native'} {size}"

    @property
    def group(self) -> tuple[str, str, str]:
        arch = json.dumps(self.card.model.architecture, sort_keys=True) if self.card.model.architecture else \
            self.card.model.name
        return (f"{self.model_label}|{arch}", self.precision, self.card.hardware.label)


@dataclass(frozen=True)
class Site:
    out: Path
    entries: list[Entry]
    groups: list[dict[str, Any]]

    @property
    def index(self) -> Path:
        return self.out / "index.html"


def _page(title: str, body: str, *, depth: int, header: str = "") -> str:
    up = "../" * depth
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<link rel="stylesheet" href="{up}assets/site.css">
</head><body>
<header class="page">{header or f'<h1>{escape(title)}</h1>'}</header>
<main>{body}</main>
<footer>attune open recipes · built {escape(iso(time.time()) or "")} · static, no network needed ·
<a href="{up}index.json">index.json</a></footer>
<script src="{up}assets/site.js"></script>
</body></html>
"""


def kind_badge(card: Card) -> str:
    return badge("simulated", "sim") if card.simulated else badge("measured", "real")


def loss_badge(verdict: str) -> str:
    if verdict == "no change kept":
        return '<span class="muted" title="no change was kept: the baseline is the recipe">—</span>'
    return badge(verdict, {"passed": "pass", "failed": "fail"}.get(verdict, "na"))


def _interval(card: Any) -> str:
    """The certified speedup's 95 % interval under the figure, or a note that the claim is not certified."""
    t = card.throughput
    if t.speedup_low is None or t.speedup_high is None:
        return '<div class="muted">not certified</div>'
    return f'<div class="muted">95 % {t.speedup_low:.3f}–{t.speedup_high:.3f}×</div>'


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _flat(d: dict[str, Any], prefix: str = "") -> str:
    """``a.b: v · c: w`` for a nested mapping (provenance rows)."""
    parts = []
    for k, v in d.items():
        if isinstance(v, dict):
            inner = _flat(v, f"{prefix}{k}.")
            if inner:
                parts.append(inner)
        elif v is not None and v != "":
            parts.append(f"{prefix}{k}: {v}")
    return " · ".join(parts)


def _verdict_badge(admitted: bool | None) -> str:
    return badge("admitted", "pass") if admitted else badge("refused", "fail") if admitted is False else "—"


def _diff_line(ln: str) -> str:
    if ln.startswith(("+++", "---", "@@")):
        return f'<span class="hunk">{escape(ln)}</span>'
    if ln.startswith("+"):
        return f'<span class="add">{escape(ln)}</span>'
    if ln.startswith("-"):
        return f'<span class="del">{escape(ln)}</span>'
    return escape(ln) + "\n"


def card_page(e: Entry, rank: int, group_size: int) -> str:
    c = e.card
    r = e.result
    loss = c.evidence.loss_equivalence
    loss_ev = {"reference": loss.baseline_loss[0] if loss.baseline_loss else [], "tolerance": loss.tolerance,
               "baseline_runs": loss.baseline_loss, "tuned_runs": loss.tuned_loss, "verdict": loss.verdict,
               "required": loss.required, "tolerance_basis": loss.tolerance_basis, "drift_runs": loss.drift_runs,
               "comparison": loss.comparison, "modelled": loss.modelled, "checks": loss.checks}
    gate_rows = "".join(
        f"<tr><td class='num'>{g.trial}</td><td>{escape(g.kind)}</td><td><code>{escape(ev_change(g.change))}</code>"
        f"</td><td>{_verdict_badge(g.admitted)}"
        f"</td><td>{escape(g.semantics or '')}</td><td>{escape(', '.join(g.owed))}</td><td>{escape(g.outcome)}</td>"
        f"<td>{escape(g.decision)}<div class='muted'>{escape('; '.join(g.reasons))}</div></td></tr>"
        for g in c.evidence.gate)
    diff_lines = "".join(_diff_line(ln) for ln in c.recipe.launch.diff) or "(no change: the baseline is best)"
    changes = "".join(f"<tr><td><code>{escape(k)}</code></td><td><code>{escape(str(v.from_))}</code></td>"
                      f"<td><code>{escape(str(v.to))}</code></td></tr>" for k, v in c.recipe.changes.items())
    m = c.measurement
    mfu = c.mfu
    mfu_text = (f"{mfu.value:.1%}" if mfu.value is not None else "not computable") + \
        f" <span class='muted'>({escape(mfu.basis)})</span>"
    if mfu.achieved_tflops_per_device is not None:
        mfu_text += f"; achieved {mfu.achieved_tflops_per_device:,.3g} TFLOP/s per device"
    prov = [("backend", f"{m.backend} ({m.kind})"), ("policy", str(m.policy)),
            ("measured", f"{m.started_at} → {m.finished_at}"),
            ("runs", f"{m.runs.get('baseline', 0)} baseline, {m.runs.get('tuned', 0)} of the tuned recipe; "
                     f"{m.window.get('warmup_steps')} warm-up + {m.window.get('measure_steps')} measured steps each"),
            ("machine", _flat(m.machine)), ("software", _flat(m.software)),
            ("framework", f"{c.framework.name} "
                          f"{c.framework.version or '(catalogue covers ' + c.framework.catalogue_versions + ')'}"),
            ("cost", f"{c.cost.accelerator_hours:,.3f} accelerator-hours of a {c.cost.budget_hours:g} budget; "
                     f"{c.cost.trials_launched} trials, {c.cost.trials_failed} failed, {c.cost.trials_refused} "
                     f"refused; stopped: {c.cost.stop_reason}"),
            ("result", f"{c.source.result} sha256 {c.source.result_sha256}")]
    prov_rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in prov)
    vacuous = (' <span class="muted">(the simulator models no loss: the check is vacuous)</span>'
               if loss.verdict in ("passed", "failed") and not loss.modelled else "")
    header = (f'<nav class="crumbs"><a href="../index.html">← all recipes</a></nav><h1>{escape(c.title)}</h1>'
              f'<div class="sub">{escape(c.framework.name)} · {escape(e.model_label)} · {escape(e.precision)} · '
              f'{escape(c.hardware.label)} · {kind_badge(c)} · rank {rank} of {group_size} in its group</div>')
    opted = (" · the owner opted in to another random stream (random_stream): changes that draw other samples or "
             "another random stream were judged against runs that differ the same way, not rounding"
             if "random_stream" in loss.numerics_opt_in else "")
    body = f"""
<section id="summary"><h2>Claim</h2>{kpis(r)}
<p>{escape(c.summary)}</p>
<p>Model-FLOPs utilisation: {mfu_text}</p>
<p>Loss equivalence: {loss_badge(loss.verdict)}{vacuous}{opted}</p>
</section>
<section id="reproduce"><h2>Reproduce</h2><pre class="reproduce">{escape(c.reproduce.command)}</pre>
<p class="muted">Check the claim: <code>attune card verify {escape(c.id)}.yaml</code>.
{escape(c.reproduce.notes)}</p>
<p>Files: <a href="{escape(c.id)}.yaml">{escape(c.id)}.yaml</a> ·
<a href="{escape(c.source.result)}">{escape(c.source.result)}</a></p></section>
<section id="search"><h2>How it was found</h2>{svg.search_chart(r)}{svg.search_legend(r)}</section>
<section id="recipe"><h2>The recipe</h2>
<table class="changes"><thead><tr><th>knob</th><th>baseline</th><th>tuned</th></tr></thead>
<tbody>{changes}</tbody></table>
<p class="muted">{escape(c.recipe.launch.description)}</p>
<pre class="diff">{diff_lines}</pre>
<details><summary>the tuned recipe in full ({escape(c.recipe.launch.form)})</summary>
<pre>{escape(c.recipe.launch.tuned)}</pre></details>
</section>
<section id="loss"><h2>Loss-equivalence evidence</h2>{loss_section(loss_ev, c.simulated)}</section>
<section id="gate"><h2>Every gate verdict</h2><div style="overflow:auto"><table class="gate"><thead><tr>
<th class="num">#</th><th>kind</th><th>change</th><th>verdict</th><th>semantics</th><th>owed</th><th>outcome</th>
<th>decision</th></tr></thead><tbody>{gate_rows}</tbody></table></div></section>
<section id="provenance"><h2>How and when it was measured</h2><table class="prov"><tbody>{prov_rows}</tbody></table>
</section>
"""
    return _page(c.title, body, depth=1, header=header)


def index_page(entries: list[Entry], groups: list[dict[str, Any]]) -> str:
    def options(values: list[str], label: str) -> str:
        return f'<option value="">{escape(label)}</option>' + "".join(
            f'<option value="{escape(v)}">{escape(v)}</option>' for v in values)

    frameworks = sorted({e.card.framework.name for e in entries})
    hardware = sorted({e.card.hardware.accelerator for e in entries})
    order = ["<100M", "100M-1B", "1B-10B", "10B-100B", ">100B", "unknown"]
    sizes = sorted({e.card.model.size for e in entries}, key=lambda s: order.index(s) if s in order else 99)
    bodies = []
    for g in groups:
        rows = []
        for item in g["entries"]:
            e: Entry = item["entry"]
            c = e.card
            search = " ".join([c.id, c.model.name, c.framework.name, c.hardware.label, e.precision,
                               c.measurement.policy or "", *c.recipe.changes]).lower()
            changes = ", ".join(f"{k}={v.to}" for k, v in c.recipe.changes.items()) or "— (baseline holds)"
            rows.append(
                f'<tr class="entry" data-id="{escape(c.id)}" data-framework="{escape(c.framework.name)}" '
                f'data-hardware="{escape(c.hardware.accelerator)}" data-size="{escape(c.model.size)}" '
                f'data-kind="{escape(c.measurement.kind)}" data-search="{escape(search)}">'
                f'<td class="rank">{item["rank"]}</td>'
                f'<td class="title"><a href="cards/{escape(c.id)}.html">{escape(c.model.name)}</a>'
                f'<div class="muted"><code>{escape(changes)}</code></div></td>'
                f'<td class="num">{c.throughput.tuned:,.0f}</td>'
                f'<td class="num">{c.throughput.speedup:.3f}×{_interval(c)}</td>'
                f'<td class="num">{_fmt(c.mfu.value, ".1%")}</td>'
                f'<td>{escape(c.framework.name)}</td><td>{kind_badge(c)}</td>'
                f'<td>{escape(str(c.measurement.policy))}</td>'
                f'<td class="num">{c.cost.accelerator_hours:,.2f}</td>'
                f"<td>{loss_badge(c.evidence.loss_equivalence.verdict)}</td></tr>")
        bodies.append(f'<tbody class="group" data-group="{escape(g["key"])}"><tr class="group-head"><th colspan="10">'
                      f'{escape(g["model"])} · {escape(g["precision"])} · {escape(g["hardware"])}</th></tr>'
                      + "".join(rows) + "</tbody>")
    n_sim = sum(e.card.simulated for e in entries)
    body = f"""
<section id="board"><h2>Recipes ranked by throughput per device, per model and hardware</h2>
<p class="kind-note">{len(entries)} recipe cards: {len(entries) - n_sim} measured on real hardware, {n_sim}
simulated (attune's analytical cluster model; their numbers are predictions, not measurements). Every card passed
attune's correctness gate and is checked against the run it came from.</p>
<div class="filters">
<label>framework <select id="f-framework">{options(frameworks, "any")}</select></label>
<label>hardware <select id="f-hardware">{options(hardware, "any")}</select></label>
<label>model size <select id="f-size">{options(sizes, "any")}</select></label>
<label><input type="checkbox" id="f-measured" checked> measured</label>
<label><input type="checkbox" id="f-simulated" checked> simulated</label>
<label>search <input type="search" id="f-search" placeholder="model, knob, policy…"></label>
<span id="count"></span>
</div>
<div style="overflow:auto"><table class="board"><thead><tr><th class="num">#</th><th>recipe (kept changes)</th>
<th class="num">tokens/s per device</th><th class="num">speedup</th><th class="num">MFU</th><th>framework</th>
<th>backend</th><th>found by</th><th class="num">accel-hours</th><th>loss check</th></tr></thead>
{"".join(bodies)}</table></div>
</section>
"""
    return _page("attune open recipes: the leaderboard", body, depth=0)


def build_site(cards_dir: str | Path, out: str | Path) -> Site:
    """Check every card under ``cards_dir`` and write the site into ``out`` (replacing what the build wrote)."""
    paths = find_cards(cards_dir)
    if not paths:
        raise AttuneError(f"no recipe cards (*.yaml) under {cards_dir}; make some with `attune card RUN_DIR`")
    problems = []
    entries = []
    for p in paths:
        bad = check_card(p)
        if bad:
            problems.append(f"{p}: " + "; ".join(bad))
            continue
        card = load_card(p)
        _, result = result_of(card, p)
        entries.append(Entry(card=card, path=p, result=result))
    if problems:
        raise AttuneError("cards that disagree with their runs cannot be published:\n" +
                          "\n".join(f"  - {p}" for p in problems))
    ids = [e.card.id for e in entries]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise AttuneError(f"card ids must be unique; repeated: {', '.join(dup)}")
    grouped: dict[tuple[str, str, str], list[Entry]] = {}
    for entry in entries:
        grouped.setdefault(entry.group, []).append(entry)
    groups: list[dict[str, Any]] = []
    for key, members in grouped.items():
        members.sort(key=lambda m: (-m.card.throughput.tuned, m.card.cost.accelerator_hours, m.card.id))
        first = members[0]
        groups.append({"key": "|".join(key), "model": first.model_label, "precision": first.precision,
                       "hardware": first.card.hardware.label,
                       "entries": [{"rank": i + 1, "entry": e} for i, e in enumerate(members)]})
    groups.sort(key=lambda g: (g["model"], g["hardware"], g["precision"]))
    site = Path(out)
    for sub in ("cards", "assets"):
        if (site / sub).is_dir():
            shutil.rmtree(site / sub)
    (site / "cards").mkdir(parents=True, exist_ok=True)
    (site / "assets").mkdir(parents=True, exist_ok=True)
    (site / "assets" / "site.css").write_text(BASE_CSS + SITE_CSS_EXTRA, encoding="utf-8")
    (site / "assets" / "site.js").write_text(SITE_JS, encoding="utf-8")
    index_entries = []
    for g in groups:
        for item in g["entries"]:
            e: Entry = item["entry"]
            c = e.card
            shutil.copyfile(e.path, site / "cards" / f"{c.id}.yaml")
            shutil.copyfile(e.path.parent / c.source.result, site / "cards" / c.source.result)
            (site / "cards" / f"{c.id}.html").write_text(card_page(e, item["rank"], len(g["entries"])),
                                                        encoding="utf-8")
            index_entries.append({
                "id": c.id, "rank": item["rank"], "group": g["key"].split("|", 1)[0] + f" · {e.precision} · "
                                                                                       f"{c.hardware.label}",
                "title": c.title, "model": c.model.name, "family": c.model.family, "parameters": c.model.parameters,
                "size": c.model.size, "precision": e.precision, "framework": c.framework.name,
                "accelerator": c.hardware.accelerator, "devices": c.hardware.devices, "hardware": c.hardware.label,
                "kind": c.measurement.kind, "backend": c.measurement.backend, "policy": c.measurement.policy,
                "tokens_per_s_per_device": c.throughput.tuned, "baseline_tokens_per_s_per_device":
                    c.throughput.baseline, "speedup": c.throughput.speedup, "mfu": c.mfu.value,
                "accelerator_hours": c.cost.accelerator_hours, "loss_equivalence": c.evidence.loss_equivalence.verdict,
                "changes": {k: v.to for k, v in c.recipe.changes.items()},
                "page": f"cards/{c.id}.html", "card": f"cards/{c.id}.yaml", "result": f"cards/{c.source.result}",
                "result_sha256": c.source.result_sha256, "reproduce": c.reproduce.command})
    (site / "index.json").write_text(json.dumps({"schema": INDEX_SCHEMA, "generated_at": iso(time.time()),
                                                 "count": len(index_entries), "cards": index_entries}, indent=2),
                                     encoding="utf-8")
    (site / "index.html").write_text(index_page(entries, groups), encoding="utf-8")
    return Site(out=site, entries=entries, groups=groups)
