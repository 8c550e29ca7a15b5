"""Trial launches of Lightning recipes (instrumentation only, config files from copies), and a real trial of the
example through LocalBackend."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from attune.frameworks.lightning import PROBE_CALLBACK, PROBE_MODULE, TRIAL_LOGGER
from attune.testing.procs import processes_in
from attune.trial import TrialOutcome
from tests.frameworks.lightning.helpers import EXAMPLE, POOR, backend, example_recipe, lightning, recipe, request


def test_trial_launch_adds_instrumentation_only(tmp_path):
    r = recipe(POOR, env={"OMP_NUM_THREADS": "1"}).with_knobs(**{"data.batch_size": 4})
    tl = lightning().trial_launch(r, request(tmp_path), tmp_path / "trial")
    argv = list(tl.launch.argv)
    copy = str(tmp_path / "trial" / "lightning-files" / "0-config.yaml")
    rendered = list(lightning().render(r).argv)
    assert argv[:len(POOR)] == [*rendered[:4], copy, *rendered[5:]]  # the user's tokens, the file from its copy
    added = argv[len(POOR):]
    assert added == ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
                     "--trainer.logger", TRIAL_LOGGER, "--trainer.default_root_dir", str(tmp_path / "trial" / "lightning"),
                     "--trainer.enable_checkpointing", "false", f"--trainer.callbacks+={PROBE_CALLBACK}"]
    assert tl.stop_after_steps == 4 and tl.launch.cwd == str(EXAMPLE)
    probe_dir = tmp_path / "trial" / "attune-probe"
    assert tl.launch.files[copy] == (EXAMPLE / "config.yaml").read_text()
    assert "class AttuneStepProbe" in tl.launch.files[str(probe_dir / f"{PROBE_MODULE}.py")]
    assert tl.launch.env["PYTHONPATH"].split(os.pathsep)[0] == str(probe_dir)
    assert tl.launch.env["OMP_NUM_THREADS"] == "1" and tl.launch.env["PYTHONUNBUFFERED"] == "1"
    assert tl.launch.env["ATTUNE_LIGHTNING_LOGS"] == str(tmp_path / "trial" / "lightning-logs")
    assert any("callbacks+=" in note for note in tl.instrumentation)


def test_a_launch_with_its_own_checkpoint_callback_keeps_checkpointing_on(tmp_path):
    (tmp_path / "cfg.yaml").write_text("trainer:\n  callbacks:\n  - class_path: lightning.pytorch.callbacks."
                                       "ModelCheckpoint\n    init_args:\n      every_n_train_steps: 100\n")
    r = recipe("python train.py fit --config cfg.yaml --data.batch_size 4", tmp_path)
    argv = list(lightning().trial_launch(r, request(tmp_path), tmp_path / "trial").launch.argv)
    assert "--trainer.enable_checkpointing" not in argv  # Lightning refuses it with a ModelCheckpoint
    assert argv[argv.index("--trainer.default_root_dir") + 1] == str(tmp_path / "trial" / "lightning")


def test_preflight_finds_a_missing_script(tmp_path):
    r = recipe("python nowhere.py fit --data.batch_size 4", tmp_path)
    problems = lightning().preflight(r, "local")
    assert any("nowhere.py does not exist" in p for p in problems)
    assert lightning().preflight(r, "sim")[0].startswith("framework: lightning recipes run on the local backend")


# -- real trials -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_real_trial_of_the_example(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    r = example_recipe(tmp_path, **{"data.batch_size": 4})
    res = backend().run(r, request(tmp_path, timeout_s=120))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    m = res.measurement
    assert m.steps_measured == 3 and len(m.losses) == 4 and all(5 < x < 6.5 for x in m.losses)
    assert m.tokens_per_s == pytest.approx(32 * 128 / m.step_time_median_s)  # token ids the probe counted
    # the Trainer's own statement of what it trains, checked against the recipe
    assert m.reported["global_batch"] == 32 and m.reported["accumulate_grad_batches"] == 8
    assert m.reported["batch_size"] == 4 and m.reported["max_steps"] == 10000
    assert lightning().report_problems(r, m.reported) == []
    assert (tmp_path / "trial" / "lightning-logs" / "lightning_logs").is_dir()  # the model's self.log went there
    work = tmp_path / "lightning-example"
    assert sorted(p.name for p in work.iterdir()) == sorted(p.name for p in EXAMPLE.iterdir()
                                                             if p.name != "__pycache__")  # nothing written there
    assert not processes_in(tmp_path), "no trial process may outlive the trial"
