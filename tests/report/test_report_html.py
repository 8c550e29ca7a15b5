"""report.html: written at the end of every run, self-contained, and right in a real headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attune.report.html import render_report
from attune.report.result import build_result
from attune.report.run import load_run
from attune.report.trials import CATEGORIES, fates
from tests.report.runs import SCRIPT, scripted_run, sim_run


def test_the_run_writes_a_self_contained_report(recorded_run: Path):
    html = (recorded_run / "report.html").read_text()
    # nothing is loaded from anywhere: no external scripts, stylesheets, images or fonts
    assert not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)=["']?(https?:)?//""", html)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "<svg" in html and "<style>" in html
    for section in ("summary", "search", "trial-table", "diff", "loss", "lessons", "provenance"):
        assert f'id="{section}"' in html, section
    assert "report.html" in (recorded_run / "report.md").read_text()


def test_every_trial_is_marked_by_what_happened_to_it(recorded_run: Path):
    result = json.loads((recorded_run / "result.json").read_text())
    fate = fates(result["trials"])
    expected = {json.dumps(change, sort_keys=True): what for change, what in SCRIPT}
    for t in result["trials"]:
        if t["kind"] == "candidate":
            assert fate[t["id"]] == expected[json.dumps(t["change"], sort_keys=True)], t
    html = (recorded_run / "report.html").read_text()
    markers = re.findall(r'class="trial" data-trial="(\d+)" data-category="([a-z_]+)"', html)
    drawn = {int(i): c for i, c in markers}
    for t in result["trials"]:
        if t["kind"] in ("loss_check", "decision"):
            assert t["id"] not in drawn  # launches nothing: its verdict shows on the chain's markers
        else:
            assert drawn[t["id"]] == fate[t["id"]]
    for cat in ("kept", "noise", "gate", "oom", "crashed", "timed_out", "baseline", "calibration"):
        assert cat in drawn.values(), cat
    # the table has one row per trial, with the throughput's noise, hours, gate verdict and loss check
    rows = re.findall(r'<tr id="trial-(\d+)" data-category="([a-z_]+)"', html)
    assert [int(i) for i, _ in rows] == [t["id"] for t in result["trials"]]
    assert "± " in html and "refused" in html and "equivalent" in html
    assert "scripted step 1: expect kept" in html  # the policy's rationale
    assert "compute_bound" in html or "host_overhead" in html or "memory_capacity" in html  # diagnoses


def test_failed_trials_do_not_flatten_the_chart(recorded_run: Path):
    from attune.report.trials import chart_data

    data = chart_data(json.loads((recorded_run / "result.json").read_text()))
    assert {p.category for p in data.failed} == {"oom", "crashed", "timed_out"}
    assert all(p.y is None for p in data.failed) and [p.category for p in data.refused] == ["gate"]
    lo, _ = data.y_range()
    assert lo > 0.5 * min(p.y for p in data.points)  # the axis spans measured throughputs, not zero


def test_the_diff_and_the_loss_evidence(recorded_run: Path):
    view = load_run(recorded_run)
    html = render_report(view)
    # torch renders a launch: the diff is of its command line and spec file, and names the kept knobs
    assert 'data-form="launch"' in html
    assert re.search(r'class="add">\+.*--nproc_per_node=2', html)
    assert re.search(r'class="del">-.*--nproc_per_node=1', html)
    assert "tolerance-band" in html and "loss-baseline" in html and "loss-tuned" in html
    from attune.report.evidence import loss_evidence

    ev = loss_evidence(view.state)
    assert ev["required"] and ev["verdict"] == "passed" and ev["modelled"]
    assert len(ev["tolerance"]) == ev["steps"] and ev["drift_runs"] == 3
    assert all(abs(a - b) <= t for a, b, t in zip(ev["tuned_runs"][0], ev["reference"], ev["tolerance"]))


def test_lessons_the_run_added_are_listed(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ATTUNE_LESSONS", str(tmp_path / "lessons.json"))
    run_dir = tmp_path / "with-lessons"
    state = scripted_run(run_dir)
    from attune.agent.lessons import record_run

    record_run(state, None, run_id=run_dir.name)
    html = render_report(load_run(run_dir))
    section = html.split('id="lessons"', 1)[1].split("</section>", 1)[0]
    assert "added" in section and "activation_checkpointing" in section
    monkeypatch.setenv("ATTUNE_LESSONS", "off")
    html = render_report(load_run(run_dir))
    assert "would add" in html.split('id="lessons"', 1)[1]


def test_attune_tune_on_the_simulator_ends_with_a_report(tmp_path: Path):
    run_dir = sim_run(tmp_path / "sim")
    html = (run_dir / "report.html").read_text()
    assert "simulated" in html and 'data-form="knobs"' in html  # megatron renders no launch: YAML knobs
    assert (run_dir / "environment.json").exists()
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["invocation"]["argv"][:2] == ["attune", "tune"] and env["simulator"]["digest"]


def _check_page(browser, url: str, shots: Path, name: str) -> dict:
    page = browser.open(url)
    assert page.errors() == [], page.errors()
    assert page.external_requests() == []
    assert browser.evaluate("document.documentElement.getAttribute('data-ready')") == "1"
    shot = browser.screenshot(shots / name)
    assert shot.stat().st_size > 20_000
    return page


def test_report_in_chromium(browser, recorded_run: Path, shots: Path):
    result = build_result(load_run(recorded_run).state)
    _check_page(browser, (recorded_run / "report.html").as_uri(), shots, "report.png")
    counts = browser.evaluate("""({
        markers: document.querySelectorAll('svg.search-chart .trial').length,
        rows: document.querySelectorAll('#trials tbody tr').length,
        band: document.querySelectorAll('svg.loss-chart .tolerance-band').length,
        curves: document.querySelectorAll('svg.loss-chart polyline').length,
        diffAdds: document.querySelectorAll('pre.diff .add').length,
        kpis: document.querySelectorAll('.kpi').length,
        width: document.querySelector('svg.search-chart').getBoundingClientRect().width
    })""")
    launched = [t for t in result["trials"] if t["kind"] not in ("loss_check", "decision")]  # they launch nothing
    assert counts["markers"] == len(launched)
    assert counts["rows"] == len(result["trials"])
    assert counts["band"] == 1 and counts["curves"] >= 3 and counts["diffAdds"] >= 2 and counts["kpis"] == 6
    assert counts["width"] > 600
    # the filter shows only the trials of one kind; clicking a marker highlights its row
    shown = browser.evaluate("""(() => { const s = document.getElementById('trial-filter');
        s.value = 'gate'; s.dispatchEvent(new Event('change'));
        return [...document.querySelectorAll('#trials tbody tr')].filter(r => r.style.display !== 'none')
               .map(r => r.dataset.category); })()""")
    assert shown == ["gate"]
    hl = browser.evaluate("""(() => { document.querySelector('svg.search-chart .trial[data-category="oom"]')
        .dispatchEvent(new MouseEvent('click', {bubbles: true}));
        return document.querySelector('#trials tr.highlight').dataset.category; })()""")
    assert hl == "oom"
    assert set(CATEGORIES) >= set(browser.evaluate(
        "[...document.querySelectorAll('ul.legend li[data-category]')].map(li => li.dataset.category)"))


def test_report_opens_with_networking_disabled(offline_browser, recorded_run: Path, shots: Path):
    page = _check_page(offline_browser, (recorded_run / "report.html").as_uri(), shots, "report-offline.png")
    assert all(u.startswith(("file:", "data:", "about:")) for u in page.requests)
    assert offline_browser.evaluate("document.querySelectorAll('svg.chart').length") == 3  # search, loss, Δloss


def test_a_missing_asset_fails_the_page_check(browser, tmp_path: Path):
    """The checker itself: a page that loads something absent, or logs an error, is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><html><body><img src="missing.png"><script>console.error("boom")</script>'
                   "</body></html>")
    page = browser.open(bad.as_uri())
    errors = " ".join(page.errors())
    assert "boom" in errors and ("missing.png" in errors or "ERR_FILE_NOT_FOUND" in errors)


@pytest.mark.parametrize("name", ["report"])
def test_attune_report_command_rewrites_the_page(recorded_run: Path, tmp_path: Path, name: str):
    from typer.testing import CliRunner

    from attune.cli import _mount_optional, app

    _mount_optional()
    out = tmp_path / f"{name}.html"
    res = CliRunner().invoke(app, ["report", str(recorded_run), "--out", str(out), "--no-png"])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("<!doctype html>")
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "journal" in res.output


def test_a_run_whose_baseline_fails_still_gets_a_report_but_no_card(tmp_path: Path):
    from attune.cards.build import make_card
    from attune.engine.loop import TuneConfig, Tuner
    from attune.errors import AttuneError
    from attune.report import write_outputs
    from attune.testing.factories import tiny_recipe
    from attune.trial import TrialOutcome
    from tests.report.runs import DriftingFake, Scripted

    recipe = tiny_recipe()
    run_dir = tmp_path / "broken"
    state = Tuner(recipe, backend=DriftingFake(speed=lambda r: TrialOutcome.OOM), policy=Scripted(),
                  config=TuneConfig.from_recipe(recipe, 1.0), run_dir=run_dir).run()
    paths = write_outputs(state, run_dir)
    html = paths["html"].read_text()
    assert "failed: out of memory" in html and "baseline recipe itself fails" in html
    with pytest.raises(AttuneError, match="no successful baseline"):
        make_card(run_dir, tmp_path / "cards")
