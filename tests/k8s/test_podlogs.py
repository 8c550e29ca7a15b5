"""The pure parts of measuring a trial from its pod log: kubelet timestamps, the master pod, parsing, the decision."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from attune.frameworks.base import LogParser
from attune.operator.podlogs import (
    JOB_NAME_LABEL,
    PodLog,
    log_verdict,
    master_pod,
    pod_selector,
    read_log,
    split_timestamp,
)
from attune.trial import TrialOutcome
from tests.k8s.harness import kubeflow_pod_labels, rfc3339_nano

pytestmark = pytest.mark.k8s

T0 = dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC).timestamp()


class StepParser(LogParser):
    """``step N loss X`` lines → step records timed by arrival (what a framework's pod parser does)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: float | None = None

    def parse_line(self, line: str, t: float) -> None:
        m = re.search(r"step (\d+) loss ([\d.na]+)", line)
        if m is None:
            return
        if m.group(2) == "nan":
            self.errors.append({"kind": "diverged", "message": "loss is NaN"})
        if self._last is not None:
            self.steps.append({"step": int(m.group(1)), "step_time_s": t - self._last, "tokens": 64,
                               "loss": float(m.group(2))})
        self._last = t


@pytest.mark.parametrize(("line", "t", "text"), [
    ("2026-12-01T09:30:00.123456789Z hello world", T0 + 0.123456789, "hello world"),
    ("2026-12-01T09:30:00.5Z {'loss': '6.9'}", T0 + 0.5, "{'loss': '6.9'}"),  # Go trims trailing zeros
    ("2026-12-01T09:30:00Z x", T0, "x"),  # no fraction at all
    ("2026-12-01T11:30:00.25+02:00 y", T0 + 0.25, "y"),  # an offset instead of Z
    ("2026-12-01T09:30:00.000000001Z ", T0 + 1e-9, ""),  # an empty line
])
def test_kubelet_timestamps_are_split_off_each_line(line, t, text):
    when, body = split_timestamp(line)
    assert when == pytest.approx(t, abs=1e-6) and body == text


def test_a_line_without_a_timestamp_keeps_its_text():
    assert split_timestamp("no stamp here") == (None, "no stamp here")
    assert split_timestamp("2026-12-01 09:30:00 not rfc3339") == (None, "2026-12-01 09:30:00 not rfc3339")


def test_the_harness_writes_what_the_operator_reads():
    ns = 1_796_117_400_123_456_789
    stamp = rfc3339_nano(ns)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", stamp)
    assert split_timestamp(stamp + " x")[0] == pytest.approx(ns / 1e9, abs=1e-6)


def test_read_log_feeds_each_line_at_its_kubelet_time_and_times_each_step():
    lines = [f"{rfc3339_nano(int((T0 + i * 0.5) * 1e9))} step {i} loss {7 - i * 0.1:.2f}" for i in range(6)]
    lines.insert(2, "a line the kubelet did not stamp")
    log = read_log("\n".join(lines) + "\n", StepParser())
    assert [s["step"] for s in log.steps] == [1, 2, 3, 4, 5]
    assert [round(s["step_time_s"], 6) for s in log.steps] == [0.5] * 5
    assert log.arrivals == pytest.approx([T0 + 0.5 * i for i in range(1, 6)], abs=1e-6)
    assert log.lines == 7 and not log.errors


def test_read_log_keeps_a_torn_last_line_and_failure_signatures():
    text = (f"{rfc3339_nano(int(T0 * 1e9))} step 0 loss 7.0\n"
            f"{rfc3339_nano(int((T0 + 1) * 1e9))} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n"
            f"{rfc3339_nano(int((T0 + 2) * 1e9))} step 1 loss 6.9")
    log = read_log(text, StepParser())
    assert [e["kind"] for e in log.errors] == ["oom"]
    assert log.first_error and "OutOfMemoryError" in log.first_error
    assert len(log.steps) == 1 and log.arrivals == [pytest.approx(T0 + 2)]


def _pod(job, rtype, index, name=None, **extra):
    return {"metadata": {"name": name or f"{job}-{rtype.lower()}-{index}",
                         "labels": {**kubeflow_pod_labels(job, rtype, index), **extra}}}


def test_master_pod_is_the_master_replica_index_0():
    pods = [_pod("j", "Worker", 0), _pod("j", "Worker", 1), _pod("j", "Master", 0), _pod("other", "Master", 0)]
    assert master_pod(pods, "j")["metadata"]["name"] == "j-master-0"
    assert pod_selector("j") == f"{JOB_NAME_LABEL}=j"
    # a job without a Master replica: rank 0 is worker 0
    assert master_pod([_pod("j", "Worker", 1), _pod("j", "Worker", 0)], "j")["metadata"]["name"] == "j-worker-0"
    # another job's pods, or a pod being deleted, are never picked
    gone = _pod("j", "Master", 0)
    gone["metadata"]["deletionTimestamp"] = "2026-12-01T09:30:00Z"
    assert master_pod([_pod("other", "Master", 0), gone], "j") is None


def _log(n, errors=()):
    return PodLog(steps=[{"step": i + 1, "step_time_s": 0.1, "tokens": 8, "loss": 1.0} for i in range(n)],
                  arrivals=[T0 + i for i in range(n)], errors=list(errors))


def test_a_running_job_is_measured_once_the_log_holds_enough_steps():
    assert log_verdict("Running", _log(3), 4).action == "wait"
    assert log_verdict("Running", None, 4).action == "wait"
    assert log_verdict("Running", _log(4), 4).action == "measure"
    assert log_verdict("Running", _log(9), 4).action == "measure"
    assert log_verdict("Succeeded", _log(4), 4).action == "measure"


def test_a_nan_loss_ends_a_running_job_at_once():
    v = log_verdict("Running", _log(2, [{"kind": "diverged", "message": "loss is NaN at step 2"}]), 4)
    assert (v.action, v.outcome, v.stop) == ("fail", TrialOutcome.DIVERGED, True)
    assert "NaN" in v.message


def test_a_job_that_ends_short_of_the_window_is_a_failed_trial():
    v = log_verdict("Succeeded", _log(2), 4)
    assert (v.action, v.outcome) == ("fail", TrialOutcome.CRASHED)
    assert "after 2 of the 4 steps" in v.message
    assert "log is gone" in log_verdict("Succeeded", None, 4).message


@pytest.mark.parametrize(("errors", "reason", "outcome", "text"), [
    ([{"kind": "oom", "message": "out of memory (CUDA): torch.OutOfMemoryError"}], "Error", TrialOutcome.OOM, "CUDA"),
    ([{"kind": "diverged", "message": "loss is NaN"}], "Error", TrialOutcome.DIVERGED, "NaN"),
    ([{"kind": "comm", "message": "NCCL communication error: ncclSystemError"}], "Error", TrialOutcome.CRASHED,
     "NCCL"),
    ([], "DeadlineExceeded", TrialOutcome.TIMED_OUT, "DeadlineExceeded"),
    ([], "Error", None, "job failed: Error exited"),  # nothing in the log: the job's condition decides
])
def test_a_failed_job_is_classified_from_its_log_before_its_condition(errors, reason, outcome, text):
    v = log_verdict("Failed", _log(1, errors), 4, reason=reason, message="exited with 1")
    assert (v.action, v.outcome, v.stop) == ("fail", outcome, False)
    assert text in v.message
