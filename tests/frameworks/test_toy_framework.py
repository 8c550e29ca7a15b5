"""A new framework is one package plus one registry line.

The toy framework (``tests/frameworks/toy/toy_framework``) is copied into a temporary directory, put on
``sys.path`` and imported: its one ``attune.registry.register(...)`` call is all that makes attune know it. Then,
through attune's public entry points only, the test imports a toy launch into a recipe, renders it back, runs a
real local tuning run of the toy trainer (``tests/frameworks/toy/train.py``: plain Python, no torch), writes the
run's report and makes a recipe card of it; nothing under ``attune/`` names the toy framework.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import shutil
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from attune import api, registry
from attune.cards.build import make_card
from attune.cards.io import check_card
from attune.gate import evaluate
from attune.recipe.io import load_recipe
from attune.report.html import write_report
from attune.report.run import load_run
from attune.testing.procs import processes_in
from attune.trial import TrialKind, TrialOutcome

TOY = Path(__file__).resolve().parent / "toy"
PACKAGE = Path(__file__).resolve().parents[2] / "attune"
STEPS_PER_TRIAL = 5  # one warm-up step and four measured ones


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy framework package, imported from a temporary directory (so registered); forgotten afterwards."""
    monkeypatch.setenv("ATTUNE_LESSONS", "off")  # no lessons store is read or written
    monkeypatch.setenv("ATTUNE_PLOTS", "off")  # no matplotlib chart; the HTML report is still written
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    plugins = tmp_path / "plugins"
    shutil.copytree(TOY / "toy_framework", plugins / "toy_framework")
    monkeypatch.syspath_prepend(str(plugins))
    assert "toy" not in registry.names()  # nothing in attune knows it before its package is imported
    try:
        module = importlib.import_module("toy_framework")
        assert Path(module.__file__).is_relative_to(plugins) and "toy" in registry.names()
        yield module
    finally:
        registry.unregister("toy")
        sys.modules.pop("toy_framework", None)
    assert "toy" not in registry.names()


@pytest.fixture
def job(tmp_path) -> Path:
    """The user's job directory: the toy trainer script."""
    work = tmp_path / "job"
    work.mkdir()
    shutil.copy(TOY / "train.py", work / "train.py")
    return work


def toy_loss(step: int, lr: float = 0.05, seed: int = 0) -> float:
    """The loss the toy trainer prints at ``step`` (it never depends on --chunk)."""
    return round(1.0 + 2.0 * math.exp(-lr * step) + 0.01 * math.sin(step + seed), 6)


def test_the_toy_framework_is_one_package_and_one_register_call(toy):
    assert registry.get("toy") is toy.FRAMEWORK and "toy" not in registry.BUILTIN
    names_it = re.compile(r"""['"]toy['"]|toy_framework|ToyFramework""")
    named = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py") if names_it.search(p.read_text()))
    assert named == []  # no module of attune's names it


def test_import_render_tune_report_and_card_of_a_toy_framework(toy, job, tmp_path):
    # -- import: the user's own command line → a recipe of the toy framework -------------------------------------
    user = [sys.executable, "train.py", "--steps", "1000", "--chunk", "1", "--lr", "0.05", "--seed", "0"]
    recipe = api.import_launch("toy", user, cwd=job, env={})
    assert recipe.framework == "toy" and recipe.framework_impl is registry.get("toy")
    assert list(recipe.launch.argv) == user and recipe.launch.cwd == str(job)
    assert recipe.knobs == {"chunk": 1} and recipe.tuning.search_space == ("chunk",)
    assert recipe.tokens_per_step == 512 and api.preflight(recipe, "local") == []
    assert "backend" in api.preflight(recipe, "sim")[0]  # the seam's default: the toy runs on local only

    # -- render: unchanged it is the user's command exactly; a knob change edits just its flag --------------------
    same, launch = api.render(recipe)
    assert same is recipe and list(launch.argv) == user and launch.cwd == str(job)
    changed, launch = api.render(recipe, ["chunk=4"])
    assert changed.knob("chunk") == 4
    assert list(launch.argv) == [*user[:5], "4", *user[6:]]
    # the gate reads the toy's contract through the seam: a change to the launch's learning rate is refused
    data = recipe.model_dump(mode="python")
    data["launch"]["argv"] = [*user[:7], "0.5", *user[8:]]
    verdict = evaluate(recipe, data)
    assert not verdict.admitted and [r.field for r in verdict.reasons] == ["toy.lr"]

    # -- a local tuning run of real trials --------------------------------------------------------------------------
    run_dir = tmp_path / "run"
    state, files = api.tune(recipe, backend="local", budget_hours=0.05, out_dir=run_dir, warmup_steps=1,
                            measure_steps=STEPS_PER_TRIAL - 1, trial_timeout_s=30, max_trials=24)
    assert state.finished, "the run did not finish"
    launched = [r for r in state.records if r.launched]
    assert launched and all(r.outcome is TrialOutcome.SUCCEEDED for r in launched), \
        [(r.id, r.kind, r.outcome, r.message) for r in launched]
    baselines = state.baselines()
    assert len(baselines) >= 2  # the noise floor is learned from repeated baselines
    candidates = [r for r in launched if r.kind is TrialKind.CANDIDATE]
    assert candidates and all(set(r.change) == {"chunk"} for r in candidates)
    # every trial's steps were read by the toy's parser: the window, the loss of every step, the phase timers (the
    # adaptive window may end a trial before its last step: every step it ran, and never more than the fixed window)
    expected = [toy_loss(s) for s in range(1, STEPS_PER_TRIAL + 1)]
    for r in launched:
        m = r.measurement
        assert m is not None and m.warmup_steps is not None and m.ended in ("precise", "futile", "cap")
        ran = m.warmup_steps + m.steps_measured
        assert m.steps_measured >= 3 and ran <= STEPS_PER_TRIAL and m.losses == expected[:ran]
        assert set(m.phases) == {"compute", "host"}
        assert m.tokens_per_s == pytest.approx(512 / m.step_time_median_s)
    # a bigger chunk pays the host overhead fewer times: the run keeps the biggest
    best = state.best_recipe()
    assert best.knob("chunk") == 4 and state.best_record().kind in (TrialKind.CANDIDATE, TrialKind.CONFIRM, TrialKind.DECISION)
    base_step = min(b.measurement.step_time_median_s for b in baselines)
    assert state.best_measurement().step_time_median_s < 0.8 * base_step
    # the speedup is certified by interleaved runs of the baseline and the best
    certify = [r.knobs["chunk"] for r in launched if r.kind is TrialKind.CERTIFY]
    assert len(certify) >= 2 and set(certify) == {1, 4}
    # each trial's own output: the trainer ran the request's steps and ended by itself (the toy's trial_launch), or
    # the adaptive window ended it once it had measured enough (at its last step, or before it)
    logs = sorted(run_dir.glob("trials/*/log.txt"))
    assert len(logs) == len(launched)
    for log, r in zip(logs, sorted(launched, key=lambda r: r.id), strict=True):
        lines = log.read_text().splitlines()
        steps = [x for x in lines if x.startswith("toy step ")]
        assert lines[0].startswith("toy step 1 time_s") and len(steps) <= STEPS_PER_TRIAL
        m = r.measurement
        assert m is not None and len(steps) >= m.warmup_steps + m.steps_measured
        if len(steps) < STEPS_PER_TRIAL:  # ended before its last step: by the window, never by anything else
            assert m.ended in ("precise", "futile"), (log, m.ended)
        else:  # ran them all: it ended by itself, or the window ended it as its last step arrived
            assert lines[-1] in ("toy done", steps[-1]), log

    # -- the report files tune wrote ---------------------------------------------------------------------------------
    assert {"result", "best_recipe", "report", "html"} <= set(files)
    assert all(p.is_file() and p.parent == run_dir.resolve() for p in files.values())
    result = json.loads(files["result"].read_text())
    assert result["framework"] == "toy" and len(result["trials"]) == len(state.records)
    assert result["best_throughput"] > result["baseline_throughput"] > 0
    tuned = load_recipe(files["best_recipe"])
    assert tuned.framework == "toy" and tuned.knob("chunk") == best.knob("chunk")
    _, tuned_launch = api.render(tuned)  # the tuned recipe renders to the user's command with the kept chunk
    assert list(tuned_launch.argv) == [*user[:5], str(best.knob("chunk")), *user[6:]]
    assert "toy" in files["report"].read_text()
    # `attune report DIR`: the page rebuilt from the journal alone
    page = write_report(load_run(run_dir), tmp_path / "report.html")
    html = page.read_text()
    assert "toy" in html and "--chunk" in html

    # -- a recipe card of the finished run ---------------------------------------------------------------------------
    card_files = make_card(run_dir, tmp_path / "cards")
    card = card_files.card
    assert card.framework.name == "toy" and card.framework.title == toy.ToyFramework.title
    assert card.framework.catalogue_versions == toy.ToyFramework.versions
    change = card.recipe.changes["chunk"]
    assert list(card.recipe.changes) == ["chunk"] and (change.from_, change.to) == (1, 4)
    assert card.recipe.launch.form == "launch"  # the baseline → tuned diff is the toy's own rendered launch
    assert [ln for ln in card.recipe.launch.diff if ln.startswith(("+", "-")) and ln[:3] not in ("---", "+++")] == \
        ["-    --chunk 1 \\", "+    --chunk 4 \\"]
    assert card.throughput.speedup > 1.25 and card.throughput.speedup_low is not None
    assert card.mfu.value is None  # no model section: no FLOP count
    # the framework's own distribution (Framework.distribution) is what the card records
    assert card.framework.version == metadata.version("PyYAML")
    assert yaml.safe_load(card_files.card_path.read_text())["framework"]["name"] == "toy"
    assert check_card(card_files.card_path) == []

    # -- nothing is left running --------------------------------------------------------------------------------------
    assert processes_in(tmp_path) == []
