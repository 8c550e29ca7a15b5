"""The HF log parser on real transformers 5.24 output (fixtures/README.md says how each was recorded)."""

from __future__ import annotations

import math

import pytest

from attune.backends.local import classify
from attune.engine.measure import summarise
from attune.frameworks.hf.logs import HFLogParser, PodLogParser, parse_dict
from attune.trial import TrialOutcome
from tests.frameworks.hf.helpers import FIXTURES, POOR, feed, hf, recipe


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


#: the example's samples are all 128 tokens (no padding), so its logged count is also a non-padding count
COUNT = "num_input_tokens_seen"


def test_trial_log_gives_one_record_per_step():
    p = feed(HFLogParser(global_batch=16, t0=99.0, count_key=COUNT), fixture("hf5.24-python-trial.log"), dt=0.5,
             t0=100.0)
    assert [s["step"] for s in p.steps] == list(range(1, 9))
    assert [s["loss"] for s in p.steps[:3]] == [6.265, 6.249, 6.233]
    assert p.steps[0]["grad_norm"] == 0.8155 and p.steps[0]["learning_rate"] == 0.0005
    assert p.steps[0]["step_time_s"] == pytest.approx(0.4436)  # the first step: its train_runtime
    assert all(s["step_time_s"] == pytest.approx(0.5) for s in p.steps[1:])  # arrival-time deltas
    assert all(s["tokens"] == 2048 for s in p.steps)  # num_input_tokens_seen deltas: 16 × 128
    assert not p.errors and not p.done


def test_measurement_from_the_parsed_steps():
    p = feed(HFLogParser(global_batch=16, count_key=COUNT), fixture("hf5.24-python-trial.log"), dt=0.25)
    m = summarise(p.steps, warmup_steps=2, devices=1)
    assert m.steps_measured == 6 and m.step_time_median_s == pytest.approx(0.25)
    assert m.tokens_per_s == pytest.approx(2048 / 0.25) and len(m.losses) == 8


def test_torchrun_log_is_read_once_per_step():
    p = feed(HFLogParser(global_batch=16, count_key=COUNT), fixture("hf5.24-torchrun-2proc-trial.log"))
    assert len(p.steps) == 8 and all(s["tokens"] == 2048 for s in p.steps)  # summed over both processes


def test_without_token_counts_tokens_come_from_the_recipe():
    p = feed(HFLogParser(global_batch=4, tokens_per_sample=128), fixture("hf5.24-tqdm-default.log"))
    assert [s["loss"] for s in p.steps] == [6.26, 6.268, 6.249]
    assert all(s["tokens"] == 4 * 128 for s in p.steps)
    assert p.done and p.summary["train_steps_per_second"] == "11.59"
    p = feed(HFLogParser(global_batch=4), fixture("hf5.24-tqdm-default.log"))
    assert all(s["tokens"] == 4 for s in p.steps)  # samples, where nothing says the sample length


def test_nan_loss_is_divergence():
    p = feed(HFLogParser(global_batch=4), fixture("hf5.24-nan.log"))
    assert len(p.steps) == 8 and p.done
    assert math.isnan(p.steps[2]["loss"]) and not math.isnan(p.steps[1]["loss"])
    assert [e["kind"] for e in p.errors] == ["diverged"]
    outcome, msg = classify(0, False, hf().collect(p, FIXTURES), 8)
    assert outcome is TrialOutcome.DIVERGED and "nan" in msg.lower()


def test_host_out_of_memory():
    p = feed(HFLogParser(global_batch=4), fixture("hf5.24-oom.log"))
    assert not p.steps and [e["kind"] for e in p.errors] == ["oom"]
    outcome, msg = classify(1, False, hf().collect(p, FIXTURES), 4)
    assert outcome is TrialOutcome.OOM and "can't allocate memory" in msg


def test_transformers_4_format_and_prefixes():
    lines = ["{'loss': 6.9561, 'grad_norm': 0.7412, 'learning_rate': 0.0008, 'epoch': 0.0}",
             "[rank0]: {'loss': 6.8, 'grad_norm': 0.9, 'learning_rate': 0.0007, 'epoch': 0.01}",
             "{'loss': nan, 'grad_norm': nan, 'learning_rate': 0.0006, 'epoch': 0.02}",
             "{'eval_loss': 6.5, 'eval_runtime': 1.0, 'epoch': 0.02}",
             ("{'train_runtime': 159.0603, 'train_samples_per_second': 69.181, 'train_steps_per_second': 2.169, "
              "'train_loss': 0.333, 'epoch': 3.0}")]
    p = feed(HFLogParser(global_batch=8, tokens_per_sample=32), "\n".join(lines) + "\n")
    assert [s["loss"] for s in p.steps[:2]] == [6.9561, 6.8] and math.isnan(p.steps[2]["loss"])
    assert len(p.steps) == 3 and p.done and p.errors[0]["kind"] == "diverged"
    assert parse_dict("not a dict {") is None and parse_dict("{'a': len}") is None


def test_parser_of_a_recipe_knows_its_global_batch():
    p = hf().parser(recipe(POOR, tokens_per_sample=128))
    assert isinstance(p, HFLogParser) and p.tokens_per_step == 16 * 128


def test_pod_parser_times_the_first_step_from_the_first_line():
    text = "starting\n{'loss': '6.2', 'grad_norm': '1.0', 'learning_rate': '0.001', 'epoch': '0.1'}\n"
    p = PodLogParser(global_batch=2)
    p.feed(text.splitlines()[0], 1_700_000_000.0)
    p.feed(text.splitlines()[1], 1_700_000_003.5)
    assert p.steps[0]["step_time_s"] == pytest.approx(3.5)
    assert isinstance(hf().pod_parser(recipe(POOR)), PodLogParser)
