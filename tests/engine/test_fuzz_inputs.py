"""Property-based fuzzing of what users hand attune: recipe files, `gate check --set` assignments and journals.
Thousands of generated inputs; every one ends in a value or a clear AttuneError, never another exception."""

from __future__ import annotations

import json
import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attune.engine.journal import Journal
from attune.engine.loop import Tuner
from attune.errors import AttuneError
from attune.gate import apply_sets, evaluate
from attune.policies import make_policy
from attune.recipe.io import parse_recipe, parse_recipe_text
from attune.testing.factories import tiny_recipe, tiny_recipe_dict
from attune.testing.fakes import FakeBackend

FUZZ = settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**40, 10**40), st.floats(allow_nan=True),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
PATHS = ["name", "framework", "model.layers", "model.heads", "model.vocab_size", "model", "training",
         "training.global_batch_size", "training.optimizer.lr", "training.optimizer", "training.schedule.warmup_steps",
         "training.data.source", "training.numerics_opt_in", "training.precision", "resources.devices_per_node",
         "resources.accelerator", "knobs", "knobs.micro_batch_size", "knobs.nproc_per_node", "knobs.bogus",
         "tuning.search_space", "tuning.measure_steps", "launch", "launch.argv"]


def mutate(data: dict, path: str, value):
    node = data
    *head, last = path.split(".")
    for part in head:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value
    return data


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=4))
def test_recipe_loading_never_crashes(edits):
    data = tiny_recipe_dict()
    for path, value in edits:
        mutate(data, path, value)
    try:
        parse_recipe(data, "fuzz")
    except AttuneError:
        pass
    try:  # and through YAML text, as a file arrives
        parse_recipe_text(yaml.safe_dump(data, allow_unicode=True), "fuzz.yaml")
    except (AttuneError, yaml.YAMLError):
        pass


@FUZZ
@given(text=st.text(string.printable, max_size=300))
def test_recipe_text_never_crashes(text):
    try:
        parse_recipe_text(text, "fuzz.yaml")
    except AttuneError:
        pass


@FUZZ
@given(sets=st.lists(st.tuples(st.sampled_from(PATHS + ["micro_batch_size", "compile_mode", "env.OMP_NUM_THREADS"]),
                               st.text(string.printable, max_size=20)), min_size=1, max_size=3))
def test_gate_check_set_never_crashes(sets):
    baseline = tiny_recipe()
    try:
        candidate = apply_sets(baseline.model_dump(mode="python"), [f"{p}={v}" for p, v in sets])
    except AttuneError as err:  # names one of the settings it was asked to set
        assert any(_named(str(err), p) for p, _ in sets), f"{sets}: {err}"
        return
    verdict = evaluate(baseline, candidate)
    assert verdict.admitted or verdict.reasons


@pytest.fixture(scope="module")
def journal_lines(tmp_path_factory):
    run = tmp_path_factory.mktemp("src")
    from attune.engine.loop import TuneConfig

    r = tiny_recipe()
    cfg = TuneConfig.from_recipe(r, 10.0, search_space=("micro_batch_size",), max_trials=4)
    Tuner(r, backend=FakeBackend(), policy=make_policy("coordinate"), config=cfg, run_dir=run).run()
    return Journal(run).path.read_text().splitlines()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_journal_replay_never_crashes(tmp_path_factory, journal_lines, data):
    lines = list(journal_lines)
    i = data.draw(st.integers(0, len(lines) - 1))
    event = json.loads(lines[i])
    key = data.draw(st.sampled_from(sorted(event)))
    event[key] = data.draw(values)
    if isinstance(event.get("record"), dict) and event["record"] and data.draw(st.booleans()):
        rkey = data.draw(st.sampled_from(sorted(event["record"])))
        event["record"][rkey] = data.draw(values)
    lines[i] = json.dumps(event, default=str)
    run = tmp_path_factory.mktemp("fuzz")
    (run / "journal.jsonl").write_text("\n".join(lines) + "\n")
    try:
        Tuner.resume(run, backend=FakeBackend(), policy=make_policy("coordinate")).lock.release()
    except AttuneError:
        pass


def _named(message: str, path: str) -> bool:
    """Whether an error's text names the edited setting: its dotted path or one of its parents, as the field of a
    line (``- training.optimizer.lr: …``), never only somewhere in passing."""
    parts = path.split(".")
    prefixes = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    return any(f"{p}:" in message or f"{p}." in message or f"'{p}'" in message or f"`{p}`" in message
               for p in prefixes)


@FUZZ
@given(path=st.sampled_from(PATHS), value=values)
def test_a_refused_recipe_edit_names_the_setting(path, value):
    """One edit that makes the recipe invalid is refused with a message that names the setting edited (or the
    section that holds it), so the user knows what to fix."""
    data = mutate(tiny_recipe_dict(), path, value)
    try:
        parse_recipe(data, "fuzz")
    except AttuneError as err:
        assert _named(str(err), path), f"{path}={value!r}: {err}"


#: edits a valid recipe accepts, with the value each must load as
VALID = {
    "name": st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
    "training.optimizer.lr": st.floats(1e-6, 1.0),
    "tuning.measure_steps": st.integers(2, 200),
    "tuning.warmup_steps": st.integers(0, 20),
    "training.seed": st.integers(0, 2**31 - 1),
    "knobs.micro_batch_size": st.sampled_from([1, 2, 4, 8]),
}


@FUZZ
@given(data=st.data())
def test_a_valid_recipe_edit_loads_with_its_value(data):
    """The other side of the refusals: a valid edit is never refused, and loads as the value given."""
    path = data.draw(st.sampled_from(sorted(VALID)))
    value = data.draw(VALID[path])
    recipe = parse_recipe(mutate(tiny_recipe_dict(), path, value), "fuzz")
    node = recipe.model_dump(mode="python")
    for part in path.split("."):
        node = node[part]
    assert node == value, (path, value, node)
