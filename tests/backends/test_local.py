"""The local backend against the real trainer: outcomes, cleanup and budget charging."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from attune import frameworks
from attune.backends.base import TrialRequest
from attune.backends.local import LocalBackend, classify
from attune.frameworks.base import LogParser, Observation
from attune.testing.factories import tiny_recipe
from attune.testing.procs import processes_in, wait_for
from attune.trainer.config import FAULT_ENV
from attune.trial import TrialOutcome


def request(tmp_path, **kw):
    base = dict(trial_id=1, trial_dir=tmp_path / "t", warmup_steps=1, measure_steps=3, timeout_s=120)
    base.update(kw)
    return TrialRequest(**base)


def no_children_left(tmp_path):
    return processes_in(tmp_path) == []


def test_argv_is_a_list_built_from_validated_knobs(tmp_path):
    argv = frameworks.get("torch").argv(tiny_recipe(nproc_per_node=2), str(tmp_path / "spec.json"), python="/py")
    assert list(argv[:5]) == ["/py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert all(isinstance(a, str) for a in argv)


def test_successful_trial_is_measured_and_charged(tmp_path):
    r = tiny_recipe(micro_batch_size=4)
    res = LocalBackend().run(r, request(tmp_path))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    m = res.measurement
    assert m.steps_measured == 3 and len(m.losses) == 4
    assert m.tokens_per_s_per_device == pytest.approx(m.tokens_per_s / 2)
    assert {"forward", "backward", "optimizer"} <= set(m.phases)
    assert res.charged_hours == pytest.approx(2 * res.wall_s / 3600)
    assert no_children_left(tmp_path)


def test_relative_trial_directory(tmp_path, monkeypatch):
    """`attune tune` defaults to a relative run directory (runs/NAME-TIME); the trainer must still find its spec."""
    monkeypatch.chdir(tmp_path)
    res = LocalBackend().run(tiny_recipe(), request(tmp_path, trial_dir=Path("runs") / "r" / "0001"))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    assert (tmp_path / "runs" / "r" / "0001" / "rank0.jsonl").exists()


@pytest.mark.parametrize("fault,outcome", [
    ("oom@2", TrialOutcome.OOM),
    ("nan@2", TrialOutcome.DIVERGED),
    ("crash@2", TrialOutcome.FAILED),
])
def test_failures_are_classified_and_still_charged(tmp_path, fault, outcome):
    res = LocalBackend(extra_env={FAULT_ENV: fault}).run(tiny_recipe(), request(tmp_path))
    assert res.outcome is outcome, res.message
    assert res.charged_hours > 0
    assert "SIG" not in res.message and "-6" not in res.message, res.message  # never the guard's own abort
    assert no_children_left(tmp_path)


def test_a_trial_that_ends_by_itself_keeps_its_own_exit_status_and_first_error(tmp_path):
    """Issue 19: the guard aborted (SIGABRT at interpreter shutdown) whenever its trial exited first, so a trial that
    finished early or failed read "crashed: exit status -6 <no Python frame>"."""
    done = LocalBackend(extra_env={FAULT_ENV: "finish@3"}).run(tiny_recipe(), request(tmp_path / "a"))
    assert done.outcome is TrialOutcome.FINISHED_EARLY, done.message
    assert "exit status 0" in done.message and "after 2 of the 4 steps" in done.message, done.message
    failed = LocalBackend(extra_env={FAULT_ENV: "crash@2"}).run(tiny_recipe(nproc_per_node=1), request(tmp_path / "b"))
    assert failed.outcome is TrialOutcome.FAILED, failed.message
    assert failed.message.startswith("exit status 1:") and "injected crash at step 2" in failed.message, failed.message


@pytest.mark.parametrize("code", [0, 1, 3])
def test_the_guard_exits_with_its_trials_own_status_when_the_trial_ends_first(code):
    import subprocess
    import sys

    from attune.backends.local import GUARD

    proc = subprocess.Popen([sys.executable, GUARD, "--", sys.executable, "-c", f"import sys; sys.exit({code})"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None and proc.stdin is not None
    err = proc.stderr.read()  # stdin stays open until the guard has exited, as while the tuner lives
    proc.wait(timeout=60)
    proc.stdin.close()
    assert proc.returncode == code and b"Fatal Python error" not in err, (proc.returncode, err)


@pytest.mark.slow
def test_oom_under_torchrun_with_two_processes(tmp_path):
    res = LocalBackend(extra_env={FAULT_ENV: "oom@2"}).run(tiny_recipe(nproc_per_node=2), request(tmp_path))
    assert res.outcome is TrialOutcome.OOM  # torchrun exits 1; the error records tell
    assert no_children_left(tmp_path)


@pytest.mark.slow
def test_real_memory_cap_gives_out_of_memory(tmp_path):
    from attune.recipe import parse_recipe
    from attune.testing.factories import tiny_recipe_dict

    d = tiny_recipe_dict(micro_batch_size=8)
    d["resources"]["device_memory_gb"] = 0.001  # 1 MB of headroom: the first micro-batch exceeds it
    res = LocalBackend().run(parse_recipe(d), request(tmp_path))
    assert res.outcome is TrialOutcome.OOM, res.message


@pytest.mark.slow
def test_hang_hits_the_deadline_and_the_whole_group_is_killed(tmp_path):
    t0 = time.monotonic()
    res = LocalBackend(extra_env={FAULT_ENV: "hang@2"}).run(tiny_recipe(nproc_per_node=2),
                                                             request(tmp_path, timeout_s=25))
    assert res.outcome is TrialOutcome.TIMED_OUT
    assert 25 <= res.wall_s < 60 and time.monotonic() - t0 < 70
    assert res.charged_hours == pytest.approx(2 * res.wall_s / 3600)
    assert no_children_left(tmp_path)


def _observed(steps: int, done: bool, log: str) -> tuple[Observation, str]:
    parser = LogParser()
    for line in log.splitlines():
        parser.feed(line, 0.0)
    obs = Observation(steps=[{"event": "step", "step": i} for i in range(1, steps + 1)], errors=parser.errors,
                      done=done, first_error=parser.first_error_line)
    return obs, log


def test_classification_of_teardown_failure_after_all_steps():
    obs, log = _observed(4, True, "terminate called without an active exception")
    outcome, msg = classify(1, False, obs, 4, log_tail=log)
    assert outcome is TrialOutcome.SUCCEEDED and "at shutdown" in msg
    obs, log = _observed(2, False, "RuntimeError: CPU out of memory")
    outcome, _ = classify(1, False, obs, 4, log_tail=log)
    assert outcome is TrialOutcome.OOM
    obs, log = _observed(2, False, "Segmentation fault")
    outcome, msg = classify(-signal.SIGSEGV, False, obs, 4, log_tail=log)
    assert outcome is TrialOutcome.CRASHED and "Segmentation fault" in msg


@pytest.mark.slow
def test_a_killed_guard_ends_the_trial_at_once_and_leaves_no_process_and_no_thread_traceback(tmp_path,
                                                                                             monkeypatch):
    """Someone SIGKILLs the trial's guard (an OOM killer, a stray `kill`) while its trainer hangs: torchrun and its
    workers live on, holding the output pipe. The trial ends at once (not at its deadline) as a failure, every
    process it started is ended (the guard's group by its id, workers in sessions of their own by the trial token
    in their environment), and the output thread ends quietly: no "write to closed file" traceback."""
    errors: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(f"{args.exc_type.__name__}: "
                                                                            f"{args.exc_value}"))
    req = request(tmp_path, timeout_s=600)
    box: dict[str, object] = {}
    runner = threading.Thread(target=lambda: box.setdefault("res", LocalBackend(
        extra_env={FAULT_ENV: "hang@3"}).run(tiny_recipe(nproc_per_node=2), req)))
    runner.start()
    log = req.trial_dir / "log.txt"
    wait_for(lambda: log.exists() and "injecting fault hang" in log.read_text(errors="replace"), 300,
             "the trainer to hang at step 3")
    guard = json.loads((req.trial_dir / "pgid").read_text())["pgid"]
    killed_at = time.monotonic()
    os.kill(guard, signal.SIGKILL)
    runner.join(timeout=300)
    assert not runner.is_alive()
    res = box["res"]
    assert res.outcome is TrialOutcome.CRASHED and "exit status -9" in res.message, res
    assert time.monotonic() - killed_at < 120 < req.timeout_s  # ended by the guard's death, not the deadline
    assert res.charged_hours > 0
    assert wait_for(lambda: no_children_left(tmp_path), 30, "the trial's processes to end")
    assert errors == []


def test_the_reference_trainers_own_timers_tell_a_data_bound_run_from_a_compute_bound_one(tmp_path):
    """The trainer times its phases itself (no sampling): one script, data-bound by simulated slow storage and not,
    gets two diagnoses, each citing the measured shares it rests on, and the playbook's moves follow from them."""
    from attune.agent.diagnose import diagnose
    from attune.policies.playbook import PlaybookPolicy
    from attune.trainer.config import READ_LATENCY_ENV
    from tests.agent.helpers import baseline_record, context

    # five measured steps: the median share then survives a step or two preempted on a loaded machine
    r = tiny_recipe(nproc_per_node=1, micro_batch_size=2)
    slow = LocalBackend(extra_env={READ_LATENCY_ENV: "200", "OMP_NUM_THREADS": "1"}).run(
        r, request(tmp_path / "data", measure_steps=5))
    fast = LocalBackend(extra_env={"OMP_NUM_THREADS": "1"}).run(r, request(tmp_path / "compute", measure_steps=5))
    assert slow.outcome is TrialOutcome.SUCCEEDED and fast.outcome is TrialOutcome.SUCCEEDED
    assert "stack_samples" not in slow.measurement.signals, "the trainer's own timers are used, not samples"
    d_slow, d_fast = diagnose(slow.measurement, r), diagnose(fast.measurement, r)
    assert d_slow.bottleneck == "data_loading" and d_fast.bottleneck != "data_loading", (d_slow, d_fast)
    assert d_slow.shares["data_loading"] > max(0.15, 3 * d_fast.shares["data_loading"]), (d_slow, d_fast)
    assert any("data_loading" in e and "% of the step" in e for e in d_slow.evidence)
    assert any("compute" in e and "% of the step" in e for e in d_fast.evidence)
    pb = PlaybookPolicy(lessons=None)
    ranks = {}
    for name, res in (("data", slow), ("compute", fast)):
        ctx = context(r, records=[baseline_record(r, res.measurement)])
        ranked = pb.candidates(ctx, pb.diagnosis(ctx))
        ranks[name] = next(i for i, c in enumerate(ranked) if c.knob == "dataloader_workers")
    assert ranks["data"] <= 2 and ranks["data"] < ranks["compute"], ranks
    assert no_children_left(tmp_path)
