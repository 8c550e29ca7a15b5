"""A declaration that cannot measure a trial is refused before anything runs: `attune import`, `attune validate`,
`attune tune` and `attune tune --resume` name the missing field and its fix (the value read from the command line
or the script's own default), and the engine itself turns step records without tokens into a clear failure."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.frameworks.command.helpers import attune_cli, nanoshape_copy


def test_import_names_the_missing_token_count_and_reads_it_from_the_command_or_the_script(tmp_path):
    work = nanoshape_copy(tmp_path, tokens_per_sample=False)
    res = attune_cli("import", "--framework", "command", "--knobs", "knobs.yaml", "--", "python", "train.py",
                     "--batch_size=2", "--block_size=128", cwd=work)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert "tokens_per_sample" in res.stderr and "tokens_per_sample: 128" in res.stderr, res.stderr
    assert "--block_size=128" in res.stderr  # where the value was read
    # no --block_size on the command line: the script's own default, read from its source
    res = attune_cli("import", "--framework", "command", "--knobs", "knobs.yaml", "--", "python", "train.py",
                     "--batch_size=2", cwd=work)
    assert res.returncode != 0 and "tokens_per_sample: 64" in res.stderr and "train.py line" in res.stderr, res.stderr


def _recipe_without_tokens(work) -> None:
    """recipe.yaml imported from a valid declaration, then its copy of the declaration stripped of the token count
    (a recipe written by hand, or by an older attune)."""
    res = attune_cli("import", "--framework", "command", "--knobs", "knobs.yaml", "--devices-per-node", "1", "-o",
                     "recipe.yaml", "--", "python", "train.py", "config/accum1.py", "--batch_size=2", cwd=work)
    assert res.returncode == 0, res.stderr
    data = yaml.safe_load((work / "recipe.yaml").read_text())
    data["launch"]["declaration"].pop("tokens_per_sample")
    (work / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_validate_and_tune_refuse_a_recipe_that_counts_no_tokens_before_any_trial(tmp_path):
    work = nanoshape_copy(tmp_path)
    _recipe_without_tokens(work)
    res = attune_cli("validate", "recipe.yaml", cwd=work)
    assert res.returncode != 0 and "tokens_per_sample" in res.stdout + res.stderr, res.stdout + res.stderr
    res = attune_cli("tune", "recipe.yaml", "--budget", "0.01", "--out", "run", cwd=work)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "tokens_per_sample" in res.stderr
    assert not (work / "run" / "trials").exists()  # nothing was launched


def test_resume_refuses_a_run_whose_trials_cannot_be_measured_instead_of_crashing_again(tmp_path):
    work = nanoshape_copy(tmp_path)
    res = attune_cli("import", "--framework", "command", "--knobs", "knobs.yaml", "--devices-per-node", "1", "-o",
                     "recipe.yaml", "--", "python", "train.py", "config/accum1.py", "--batch_size=2", cwd=work)
    assert res.returncode == 0, res.stderr
    res = attune_cli("tune", "recipe.yaml", "--budget", "1e-9", "--out", "run", cwd=work)  # a journal, no trial
    journal = work / "run" / "journal.jsonl"
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    # the run as an older attune started it: its recipe's declaration counts no tokens
    events[0]["recipe"]["launch"]["declaration"].pop("tokens_per_sample")
    journal.write_text("".join(json.dumps(e) + "\n" for e in events))
    res = attune_cli("tune", "--resume", "run", "--budget", "0.01", cwd=work)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "tokens_per_sample" in res.stderr
    after = [json.loads(line)["event"] for line in journal.read_text().splitlines()]
    assert "trial_started" not in after


def test_step_records_without_tokens_are_a_clear_failure_not_a_type_error():
    from attune.engine.measure import MeasurementError, summarise

    steps = [{"step": i, "step_time_s": 0.1, "tokens": None, "loss": 4.0} for i in range(1, 5)]
    with pytest.raises(MeasurementError, match="carry no token count"):
        summarise(steps, warmup_steps=1, devices=1)


def test_a_real_trial_whose_lines_carry_no_tokens_fails_with_the_reason(tmp_path, monkeypatch):
    from attune.testing.trials import backend, request
    from attune.trial import TrialOutcome
    from tests.frameworks.command.helpers import recipe

    work = nanoshape_copy(tmp_path)
    r = recipe(["python", "train.py", "config/accum1.py", "--batch_size=2"], work,
               decl=yaml.safe_load((work / "knobs.yaml").read_text()), env={})
    # the parser an older recipe gave its trials: the script prints no token count and none was declared
    parser = r.framework_impl.parser(r)
    parser.tokens_per_step = None
    monkeypatch.setattr(type(r.framework_impl), "parser", lambda self, recipe: parser)
    res = backend().run(r, request(tmp_path))
    assert res.outcome is TrialOutcome.FAILED and "carry no token count" in res.message, res.message
