"""Diagnosis that sees a real HF job: the Trainer prints no phase timers, so a local trial's Python stacks are sampled
(py-spy, attached from outside) and the diagnosis cites the measured shares. The same script, data-bound (its
simulated slow storage on) and compute-bound, is diagnosed differently, and the playbook's first move follows."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from attune.agent.diagnose import diagnose
from attune.backends.stacks import attribute, phase_of, sampler
from attune.policies.playbook import PlaybookPolicy
from attune.trial import TrialOutcome
from tests.agent.helpers import baseline_record, context
from tests.frameworks.hf.helpers import backend, example_recipe, request


def test_stacks_are_attributed_to_phases_by_their_frames():
    assert phase_of(["<module> (train.py:9)", "train (trainer.py:2200)",
                     "__next__ (torch/utils/data/dataloader.py:733)", "__call__ (train.py:40)"]) == "data"
    assert phase_of(["<module> (train.py:9)", "training_step (trainer.py:3800)", "backward (torch/_tensor.py:626)",
                     "_engine_run_backward (torch/autograd/graph.py:823)"]) == "backward"
    assert phase_of(["<module> (train.py:9)", "_call_impl (torch/nn/modules/module.py:1750)",
                     "all_reduce (torch/distributed/distributed_c10d.py:2800)"]) == "comm"
    assert phase_of(["<module> (train.py:9)", "log (trainer.py:3500)"]) == "host"
    raw = "\n".join([
        'process 10:"python -m torch.distributed.run";thread (10): MainThread;<module> (run.py:9);_poll (api.py:1) 500',
        'process 10:"launcher";process 11:"python train.py";thread (11): MainThread;<module> (train.py:9);'
        '__next__ (torch/utils/data/dataloader.py:733) 30',
        'process 10:"launcher";process 11:"python train.py";thread (11): MainThread;<module> (train.py:9);'
        '_call_impl (torch/nn/modules/module.py:1750) 60',
        'process 10:"launcher";process 11:"python train.py";thread (11): MainThread;<module> (train.py:9) 10',
        'process 10:"launcher";process 11:"python train.py";thread (12): Thread-1;run (threading.py:1) 900',
    ])
    prof = attribute(raw)
    assert prof is not None and prof.samples == 100 and prof.processes == 1, "the launcher and side threads are out"
    assert prof.shares["data"] == pytest.approx(0.3) and prof.shares["forward"] == pytest.approx(0.6)
    assert prof.phases(2.0)["host"] == pytest.approx(0.2)
    assert attribute("garbage\n\n") is None


def _trial(tmp_path: Path, name: str, extra: list[str]):
    r = example_recipe(tmp_path / name, gradient_checkpointing=False, per_device_train_batch_size=2)
    data = r.model_dump(mode="python")
    data["launch"]["argv"] = [*data["launch"]["argv"], *extra]
    from attune.recipe.io import parse_recipe

    r = parse_recipe(data)
    res = backend().run(r, request(tmp_path / name, timeout_s=150))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    return r, res.measurement


@pytest.mark.slow
@pytest.mark.skipif(sampler(sys.executable) is None, reason="py-spy is not installed (the profile extra)")
def test_a_data_bound_and_a_compute_bound_run_of_one_script_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    slow_r, slow = _trial(tmp_path, "data", ["--read_latency_ms", "60"])
    fast_r, fast = _trial(tmp_path, "compute", [])
    for m in (slow, fast):
        assert m.signals.get("stack_samples", 0) >= 20, "the measurement window was sampled"
        assert set(m.phases) <= {"comm", "data", "optimizer", "backward", "forward", "host"} and m.phases
    d_slow, d_fast = diagnose(slow, slow_r), diagnose(fast, fast_r)
    assert d_slow.bottleneck == "data_loading", d_slow.evidence
    assert d_fast.bottleneck != "data_loading", d_fast.evidence
    assert d_slow.shares["data_loading"] > 0.3 > d_fast.shares.get("data_loading", 0.0)
    for d in (d_slow, d_fast):  # each diagnosis cites the measured shares it rests on, and where they came from
        assert any("% of the step" in e for e in d.evidence) and any("sampled Python stacks" in e for e in d.evidence)
    # the playbook's moves follow from them: more loader workers rank near the top for the data-bound run, by the
    # measured data share, and not for the compute-bound one
    pb = PlaybookPolicy(lessons=None)
    rank, workers = {}, {}
    for name, r, m in (("data", slow_r, slow), ("compute", fast_r, fast)):
        ctx = context(r, records=[baseline_record(r, m)])
        ranked = pb.candidates(ctx, pb.diagnosis(ctx))
        rank[name] = next(i for i, c in enumerate(ranked) if c.knob == "dataloader_num_workers")
        workers[name] = ranked[rank[name]]
    assert rank["data"] <= 1 and rank["data"] < rank["compute"], (rank, workers)
    assert workers["data"].expected_gain > 0.2 > workers["compute"].expected_gain
    assert any("measured phases it addresses" in n for n in workers["data"].notes)
