"""The runtime contract check for Megatron-LM: a trial's own start-up output (``using world size: ...`` and the
argument dump ``_print_args`` writes, real excerpts in ``fixtures/``) states the batch, sequence length, learning
rates, seed, precision and parallel sizes the job resolved; a trial that contradicts its recipe or the baseline's run
is a contract violation. (No Megatron trial runs on this CPU machine: on a GPU, a real Megatron-LM trial's pod log
would prove the same path end to end; the parser and the check are the ones every trial uses.)"""

from __future__ import annotations

import pytest

from attune.engine.loop import TrialPlan, trial_record
from attune.frameworks.megatron.logs import MegatronLogParser
from attune.trial import TrialOutcome
from tests.frameworks.megatron.helpers import FIXTURES, megatron, mlm
from tests.reported import baseline_state, succeeded


def reported(*lines_or_fixtures: str) -> dict:
    p = MegatronLogParser(global_batch=128, seq_length=8192)
    for item in lines_or_fixtures:
        text = (FIXTURES / item).read_text() if item.endswith(".log") else item
        for i, line in enumerate(text.splitlines(keepends=True)):
            p.feed(line, float(i))
    return dict(p.reported)


def test_the_argument_dump_and_world_size_line_of_real_logs_are_read():
    assert reported("mlm-arguments-511.log") == {
        "world_size": 1, "data_parallel_size": 1, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
        "bf16": False, "lr": 0.0001}
    assert reported("mlm-arguments-743.log") == {"global_batch_size": 4}
    assert reported("mlm-arguments-516.log") == {"seed": 1234, "seq_length": 1024}


@pytest.mark.parametrize(("line", "sizes"), [
    # megatron/training/arguments.py validate_args (NVIDIA/Megatron-LM at 307dcf3 and the releases before it)
    ("using world size: 4, data-parallel size: 1, context-parallel size: 1, tensor-model-parallel size: 4, "
     "encoder-tensor-model-parallel size: 0, pipeline-model-parallel size: 1, encoder-pipeline-model-parallel size: 0",
     (4, 1, 1, 4, 1)),
    ("using world size: 16, data-parallel size: 2, context-parallel size: 2, hierarchical context-parallel sizes: "
     "Nonetensor-model-parallel size: 4, encoder-tensor-model-parallel size: 0, pipeline-model-parallel size: 1, "
     "encoder-pipeline-model-parallel size: 0", (16, 2, 2, 4, 1)),
    ("using world size: 16, data-parallel-size: 4, tensor-model-parallel size: 4, pipeline-model-parallel size: 1",
     (16, 4, None, 4, 1)),  # NVIDIA/Megatron-LM issue #184 (v2.6)
])
def test_the_world_size_line_of_each_release(line, sizes):
    rep = reported(line + "\n")
    names = ("world_size", "data_parallel_size", "context_parallel_size", "tensor_model_parallel_size",
             "pipeline_model_parallel_size")
    assert tuple(rep.get(n) for n in names) == sizes


def test_only_lines_in_the_dumps_own_layout_are_read():
    # the dump pads every name with dots to column 48; other aligned output (DeepSpeed's dump pads to 29, a script's
    # own table) is not Megatron's and is not read
    assert reported("  global_batch_size ............. 16\n") == {}
    assert reported("global_batch_size ............................... 4\n") == {}
    assert reported("0:   global_batch_size ............................... 8\n") == {"global_batch_size": 8}
    assert reported("  train_iters ..................................... None\n") == {}


def _dump(**values) -> str:
    """Argument-dump lines in ``_print_args``'s own layout."""
    return "".join(f"  {k} {'.' * (48 - len(k))} {v}\n" for k, v in values.items())


def test_a_trial_agrees_with_the_recipe_it_ran_and_a_misread_one_is_caught():
    r = mlm()  # NVIDIA's Llama-3 8B FP8 recipe: GBS 128, MBS 1, seq 8192, TP 1, CP 1
    ok = reported(_dump(global_batch_size=128, micro_batch_size=1, seq_length=8192, tensor_model_parallel_size=1,
                        context_parallel_size=1, lr=0.00015))
    assert megatron().report_problems(r, ok) == []
    assert megatron().report_problems(r, {**ok, "global_batch_size": 256, "micro_batch_size": 2}) == [
        "Megatron reported global_batch_size = 256, the recipe reads 128",
        "Megatron reported micro_batch_size = 2, the recipe reads 1"]
    # the knobs the trial set are what the job must report
    assert megatron().report_problems(r.with_knobs(micro_batch_size=2), ok) == [
        "Megatron reported micro_batch_size = 1, the recipe reads 2"]


def test_a_contract_change_is_rejected_against_the_baselines_run():
    base = mlm()
    ok = reported(_dump(global_batch_size=128, micro_batch_size=1, seq_length=8192, lr=0.00015, min_lr=1e-05,
                        seed=1234, bf16=True, clip_grad=1.0))
    state = baseline_state(base, succeeded(ok))
    cand = base.with_knobs(micro_batch_size=2)
    plan = TrialPlan(id=2, kind="candidate", recipe=cand, change={"micro_batch_size": 2}, rationale="",
                     source="test", verdict=None)
    assert trial_record(state, plan, succeeded({**ok, "micro_batch_size": 2})).outcome is TrialOutcome.SUCCEEDED
    for name, value in (("lr", 0.0003), ("seed", 42), ("bf16", False), ("global_batch_size", 256)):
        rec = trial_record(state, plan, succeeded({**ok, "micro_batch_size": 2, name: value}))
        assert rec.outcome is TrialOutcome.CRASHED and rec.decision.startswith("rejected"), (name, rec)
        assert f"{name} = {value}" in rec.message and "contract violation" in rec.message
