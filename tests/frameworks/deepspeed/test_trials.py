"""Trial launches of DeepSpeed recipes (logging instrumentation only, the config copied into the trial directory,
one JIT build cache), and real trials of the example through LocalBackend."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attune.backends.base import TrialRequest
from attune.testing.procs import processes_in
from attune.testing.trials import backend
from attune.testing.trials import request as short_request
from attune.trial import TrialOutcome
from tests.frameworks.deepspeed.helpers import EXAMPLE, POOR, POOR_CONFIG, ds, hf_recipe, poor, recipe, write


def request(tmp_path: Path, **kw) -> TrialRequest:
    return short_request(tmp_path, **{"timeout_s": 300, **kw})  # DeepSpeed's start-up is slow


def test_trial_launch_adds_logging_instrumentation_only(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    r = poor(tmp_path)
    tl = ds().trial_launch(r, request(tmp_path), tmp_path / "trial")
    copy = str(tmp_path / "trial" / "ds-files" / "ds_config.json")
    assert list(tl.launch.argv) == [*POOR[:-1], copy] and list(tl.launch.files) == [copy]
    config, own = json.loads(tl.launch.files[copy]), json.loads(POOR_CONFIG)
    assert config.pop("steps_per_print") == 1 and config.pop("log_level") == "info"
    own.pop("steps_per_print")
    assert config == own  # nothing else
    assert tl.stop_after_steps == 4 and tl.launch.cwd == str(tmp_path)
    env = tl.launch.env
    assert env["DS_ACCELERATOR"] == "cpu" and env["PYTHONUNBUFFERED"] == "1"
    assert env["TORCH_EXTENSIONS_DIR"].endswith("attune/torch_extensions")  # one build cache for every trial
    assert ds().trial_launch(r, request(tmp_path), tmp_path / "t2").launch.env["TORCH_EXTENSIONS_DIR"] == \
        env["TORCH_EXTENSIONS_DIR"]
    assert any("steps_per_print: 1" in n for n in tl.instrumentation)


def test_user_extensions_dir_and_monitors(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/opt/ext")
    write(tmp_path, "ds.json", {"train_batch_size": 8, "tensorboard": {"enabled": True, "output_path": "tb"},
                                "wandb": {"enabled": False}})
    r = recipe("deepspeed train.py --deepspeed_config ds.json", tmp_path)
    tl = ds().trial_launch(r, request(tmp_path), tmp_path / "trial")
    config = json.loads(next(iter(tl.launch.files.values())))
    assert config["tensorboard"] == {"enabled": False, "output_path": "tb"} and config["wandb"] == {"enabled": False}
    assert "TORCH_EXTENSIONS_DIR" not in tl.launch.env  # the user's own cache is used as it is


def test_hf_trial_adds_the_trainers_logging_flags(tmp_path):
    r = hf_recipe(tmp_path)
    tl = ds().trial_launch(r, request(tmp_path), tmp_path / "trial")
    argv = list(tl.launch.argv)
    assert argv[argv.index("--logging_steps") + 1] == "1" and argv[argv.index("--report_to") + 1] == "none"
    assert argv[argv.index("--output_dir") + 1] == str(tmp_path / "trial" / "hf-output")
    assert argv[argv.index("--deepspeed") + 1] == str(tmp_path / "trial" / "ds-files" / "ds_zero2.json")
    from attune.frameworks.deepspeed.logs import HFDeepSpeedLogParser

    assert isinstance(ds().parser(r), HFDeepSpeedLogParser)


# -- real trials -------------------------------------------------------------------------------------------

def example_recipe(tmp_path: Path, **knobs):
    """The example's poor launch, run from a copy of the example in ``tmp_path`` (so leftovers are findable)."""
    work = tmp_path / "deepspeed"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__"))
    r = recipe(POOR, work, tokens_per_sample=128, devices_per_node=2)
    return r.with_knobs(**{"env.OMP_NUM_THREADS": "1", **knobs})




@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_trial_of_the_example(tmp_path):
    pytest.importorskip("deepspeed")
    r = example_recipe(tmp_path, train_micro_batch_size_per_gpu=8, **{"zero_optimization.stage": 1})
    res = backend().run(r, request(tmp_path, timeout_s=600))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    m = res.measurement
    assert m.steps_measured == 3 and len(m.losses) == 4 and all(6.3 < x < 6.5 for x in m.losses)
    assert m.tokens_per_s == pytest.approx(32 * 128 / m.step_time_median_s)
    # what DeepSpeed itself resolved, from the trial's own config dump, agrees with the recipe
    assert (m.reported["train_batch_size"], m.reported["train_micro_batch_size_per_gpu"],
            m.reported["gradient_accumulation_steps"], m.reported["world_size"]) == (32, 8, 4, 1)
    assert ds().report_problems(r, m.reported) == []
    log = (tmp_path / "trial" / "log.txt").read_text()
    assert "step=4, skipped=0" in log and "CurrSamplesPerSec" in log and "batch 32 = 8 micro × 4 accumulation" in log
    assert processes_in(tmp_path) == []
    assert (tmp_path / "deepspeed" / "ds_config.json").read_text() == POOR_CONFIG  # the user's file is untouched


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_two_process_trial(tmp_path):
    pytest.importorskip("deepspeed")
    r = example_recipe(tmp_path, nproc_per_node=2, train_micro_batch_size_per_gpu=4, **{"zero_optimization.stage": 2})
    res = backend().run(r, request(tmp_path, timeout_s=600))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    log = (tmp_path / "trial" / "log.txt").read_text()
    assert "batch 32 = 4 micro × 4 accumulation × 2 processes" in log and "dist_world_size=2" in log
    rep = res.measurement.reported
    assert (rep["train_batch_size"], rep["train_micro_batch_size_per_gpu"], rep["world_size"]) == (32, 4, 2)
    assert ds().report_problems(r, rep) == []
    assert processes_in(tmp_path) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_cpu_op_build_runs_once_before_the_first_trial_as_its_own_line(tmp_path):
    """Issue 19: the baseline trial compiled DeepSpeed's CPU ops for minutes, billed silently. The build now runs once,
    before the first trial and outside it, into the cache every trial uses, and the run reports it on its own line."""
    pytest.importorskip("deepspeed")
    from attune.engine.journal import Event, Journal
    from attune.engine.loop import TuneConfig, Tuner
    from attune.policies import make_policy
    from attune.report.result import build_result

    r = example_recipe(tmp_path)
    cfg = TuneConfig.from_recipe(r, 1.0, max_trials=0)
    state = Tuner(r, backend=backend(), policy=make_policy("playbook"), config=cfg, run_dir=tmp_path / "run").run()
    setup = [e for e in Journal(tmp_path / "run").read() if e["event"] == Event.SETUP.value]
    assert len(setup) == 1 and setup[0]["ok"], setup
    assert "shared-memory comm op" in setup[0]["what"] and setup[0]["wall_s"] > 0
    assert not state.records and build_result(state)["setup"][0]["what"] == setup[0]["what"]
    assert (Path(ds().setup(r).env["TORCH_EXTENSIONS_DIR"]) / "deepspeed_shm_comm").is_dir()
    # a resumed run does not build again
    Tuner.resume(tmp_path / "run", backend=backend(), policy=make_policy("playbook")).run()
    assert len([e for e in Journal(tmp_path / "run").read() if e["event"] == Event.SETUP.value]) == 1
