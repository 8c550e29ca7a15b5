"""A step's work in tokens where the command line states the sample length, and an honest unit where it does not.

Seen on HF's run_clm.py (``--block_size 64``, no ``--tokens-per-sample``): every trial counted samples, and the
summary still said "50 tokens/s per device" where the job ran about 3,900 tokens/s.
"""

from __future__ import annotations

import pytest

from attune.engine.loop import RunState, TuneConfig
from attune.report.result import build_result, throughput_unit
from attune.trial import Measurement, TrialKind, TrialOutcome, TrialRecord
from tests.frameworks.hf.helpers import recipe

RUN_CLM = ("torchrun --standalone --nproc_per_node 1 run_clm.py --config_name cfg --tokenizer_name tok --train_file "
           "train.txt --do_train {block} --per_device_train_batch_size 1 --gradient_accumulation_steps 8 "
           "--max_steps 400 --logging_steps 1 --output_dir out")


@pytest.mark.parametrize("block, expect", [("--block_size 64", 64), ("--block_size=128", 128), ("", None)])
def test_run_clm_block_size_is_the_sample_length(block, expect):
    r = recipe(RUN_CLM.format(block=block))
    assert r.launch.tokens_per_sample == expect
    if expect:
        assert r.framework_impl.tokens_per_step(r) == 8 * expect


def test_an_explicit_sample_length_wins_over_the_block_size():
    r = recipe(RUN_CLM.format(block="--block_size 64"), tokens_per_sample=32)
    assert r.launch.tokens_per_sample == 32


def _state(unit: str) -> RunState:
    r = recipe(RUN_CLM.format(block=""))
    state = RunState(baseline=r, config=TuneConfig.from_recipe(r, 1.0))
    for i in (1, 2):
        m = Measurement(tokens_per_s_per_device=50.0, tokens_per_s=50.0, step_time_median_s=0.16, step_time_cv=0.01,
                        steps_measured=6, losses=[3.1] * 8, reported={"throughput_unit": unit})
        state.records.append(TrialRecord(id=i, kind=TrialKind.BASELINE, change={}, knobs=r.effective_knobs,
                                         signature="base", outcome=TrialOutcome.SUCCEEDED, measurement=m))
    return state


@pytest.mark.parametrize("unit, label", [("samples", "samples/s per device"),
                                         ("batch tokens", "tokens/s per device"),
                                         ("non-padding tokens", "tokens/s per device")])
def test_the_result_names_what_its_throughputs_count(unit, label):
    state = _state(unit)
    assert throughput_unit(state) == label
    assert build_result(state)["throughput_unit"] == label
