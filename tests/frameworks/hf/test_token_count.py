"""A step's work is the same on both sides of a comparison: the non-padding tokens of its samples, never the padded
count (``include_num_input_tokens_seen True``), which grows with the per-device batch for the same samples because
each micro-batch is padded to its longest sample. Real trials of unpacked runs at 1 × 8 and 4 × 2: the same tokens
per step, and a throughput ratio that is the ratio of optimizer-step times."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attune.engine.loop import verified
from attune.frameworks.hf import trial_token_flags
from attune.frameworks.hf.logs import UNIT_KEY, HFLogParser, TokenUnit, parse_dict
from attune.frameworks.hf.settings import read
from attune.recipe.model import Recipe
from attune.testing.procs import processes_in
from attune.trial import Measurement, TrialOutcome
from tests.frameworks.hf.helpers import FIXTURES, backend, feed, hf, recipe, request
from tests.frameworks.hf.trl_helpers import build_tiny_sft, offline_env
from tests.reported import baseline_state, succeeded

#: an unpacked SFT run (samples of 40-121 tokens, under max_length) that also asks HF for its padded count
SFT = ["trl", "sft", "--model_name_or_path", "model", "--dataset_name", "data", "--max_length", "128",
       "--packing", "False", "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8",
       "--max_steps", "1000", "--seed", "3", "--use_cpu", "True", "--gradient_checkpointing", "False",
       "--include_num_input_tokens_seen", "True"]
ARGS = {"output_dir": "out", "max_steps": 1000, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8,
        "learning_rate": 1e-3, "seed": 0, "use_cpu": True, "report_to": "none"}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def increments(log: str, key: str) -> list[float]:
    """The per-step increases of a cumulative count in a trial's log (its first four steps)."""
    seen = [float(d[key]) for d in map(parse_dict, log.splitlines()) if d and "loss" in d and key in d][:4]
    return [b - a for a, b in zip([0.0, *seen], seen)]


def layouts(r: Recipe, tmp_path: Path) -> dict[int, tuple[Measurement, list[float], str]]:
    """Real trials of ``r`` at 1 × 8 and 4 × 2: each one's measurement, per-step tokens and log."""
    out = {}
    for pd in (1, 4):
        trial = r.with_knobs(per_device_train_batch_size=pd, **{"env.OMP_NUM_THREADS": "1"})
        res = backend().run(trial, request(tmp_path / f"pd{pd}", timeout_s=180))
        assert res.outcome is TrialOutcome.SUCCEEDED, res.message
        assert res.measurement is not None and res.measurement.reported["gradient_accumulation_steps"] == 8 // pd
        log = (tmp_path / f"pd{pd}" / "trial" / "log.txt").read_text()
        steps = feed(hf().parser(trial), log).steps
        assert len(steps) >= 4  # attune ends the trial after its 4 steps: a fifth may be logged before it stops
        out[pd] = (res.measurement, [s["tokens"] for s in steps[:4]], log)
    assert processes_in(tmp_path) == []
    return out


def assert_same_work(runs: dict[int, tuple[Measurement, list[float], str]]) -> None:
    (m1, tokens1, _), (m4, tokens4, _) = runs[1], runs[4]
    assert m1.reported[UNIT_KEY] == m4.reported[UNIT_KEY] == "non-padding tokens"
    assert tokens1 == tokens4 and len(set(tokens1)) > 1  # the same samples, of many lengths
    assert m1.tokens_per_s * m1.step_time_median_s == pytest.approx(m4.tokens_per_s * m4.step_time_median_s)
    speedup = m4.tokens_per_s / m1.tokens_per_s
    assert speedup == pytest.approx(m1.step_time_median_s / m4.step_time_median_s, rel=1e-9)


@pytest.fixture(scope="module")
def tiny_sft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_sft(tmp_path_factory.mktemp("tiny-sft"))


@pytest.mark.slow
def test_unpacked_trl_sft_counts_the_same_work_at_every_per_device_batch(tmp_path, monkeypatch, tiny_sft):
    for k, v in offline_env().items():
        monkeypatch.setenv(k, v)
    shutil.copytree(tiny_sft, tmp_path / "work")
    runs = layouts(recipe(SFT, tmp_path / "work", devices_per_node=1), tmp_path)
    assert_same_work(runs)
    # the samples really are padded: HF's padded count (the launch's own flag) grows with the per-device batch, while
    # one sample per micro-batch has nothing to pad
    padded1, padded4 = increments(runs[1][2], "num_input_tokens_seen"), increments(runs[4][2], "num_input_tokens_seen")
    assert padded1 == runs[1][1] and all(p >= t for p, t in zip(padded4, runs[4][1])) and padded4 != runs[4][1]
    assert increments(runs[4][2], "num_tokens") == runs[4][1]  # TRL's own count is what attune measures


@pytest.mark.slow
def test_an_args_file_trainer_job_counts_non_padding_tokens(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "padded_train.py", work)
    (work / "args.json").write_text(json.dumps(ARGS, indent=2))
    r = recipe(["python", "padded_train.py", "args.json"], work, devices_per_node=1)
    runs = layouts(r, tmp_path)
    assert_same_work(runs)
    copy = json.loads((tmp_path / "pd4" / "trial" / "hf-args" / "args.json").read_text())
    assert copy["include_num_input_tokens_seen"] == "non_padding"
    assert increments(runs[4][2], "num_input_tokens_seen") == runs[4][1]
    assert all(t < 8 * 96 for t in runs[4][1])  # real lengths, not 8 padded rows of the longest


# -- without a real trial --------------------------------------------------------------------------------------

def test_only_an_args_file_on_a_recent_transformers_can_ask_for_non_padding_counts(tmp_path):
    (tmp_path / "args.json").write_text(json.dumps(ARGS))
    args_file = recipe(["python", "train.py", "args.json"], tmp_path)
    assert trial_token_flags(read(args_file), args_file) == {"include_num_input_tokens_seen": "non_padding"}
    old = recipe(["python", "train.py", "args.json"], tmp_path, framework_version="4.56.2")
    assert trial_token_flags(read(old), old) == {}  # a bool there: True would count padding
    flags = recipe(["python", "train.py", "--per_device_train_batch_size", "2"], tmp_path)
    assert trial_token_flags(read(flags), flags) == {}  # 5.24 parses the flag as a bool on the command line
    tl = hf().trial_launch(flags, request(tmp_path), tmp_path / "trial")
    assert not any("include_num_input_tokens_seen" in a for a in tl.launch.argv)


def test_trl_sft_steps_are_its_non_padding_count_and_a_padded_count_is_never_used():
    log = fixture("trl1.16-sft-unpacked-pd4.log")
    r_steps = feed(hf().parser(recipe(SFT)), log).steps
    p = feed(HFLogParser(global_batch=8, count_key="num_tokens"), log)
    assert [s["tokens"] for s in p.steps] == [s["tokens"] for s in r_steps] == increments(log, "num_tokens")
    assert p.reported[UNIT_KEY] == "non-padding tokens"
    assert increments(log, "num_input_tokens_seen") != increments(log, "num_tokens")  # padded: not the work
    plain = feed(HFLogParser(global_batch=8, tokens_per_sample=128), log)  # no count asked for: the fixed batch
    assert all(s["tokens"] == 8 * 128 for s in plain.steps) and plain.reported[UNIT_KEY] == str(TokenUnit.BATCH_TOKENS)
    assert feed(HFLogParser(global_batch=8), log).reported[UNIT_KEY] == "samples"


def test_a_step_without_its_count_puts_the_whole_trial_in_the_fixed_unit():
    lines = [ln for ln in fixture("trl1.16-sft-unpacked-pd4.log").splitlines() if "'loss'" in ln]
    lines[2] = lines[2].replace("'num_tokens'", "'other'")
    p = feed(HFLogParser(global_batch=8, tokens_per_sample=100, count_key="num_tokens"), "\n".join(lines))
    assert [s["tokens"] for s in p.steps] == [800] * len(lines)
    assert p.reported[UNIT_KEY] == str(TokenUnit.BATCH_TOKENS)


def test_a_trial_in_another_unit_than_the_baselines_is_not_compared(tmp_path):
    r = recipe(SFT, tmp_path)
    state = baseline_state(r, succeeded({UNIT_KEY: "non-padding tokens"}))
    assert verified(state, r, succeeded({UNIT_KEY: "non-padding tokens"})).outcome is TrialOutcome.SUCCEEDED
    checked = verified(state, r, succeeded({UNIT_KEY: "samples"}))
    assert checked.outcome is TrialOutcome.CRASHED
    assert "throughput_unit = samples, the baseline's run reported non-padding tokens" in checked.message
