"""The reconcile step for trials measured from their pod log (an HF TuningRun), with fake ports: a trial is done as
soon as its log holds the steps, its job is stopped after the record is stored, failures come from the log."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from attune.operator.podlogs import LogsUnavailable
from attune.operator.reconcile import parse_time, reconcile, resolve_recipe
from attune.operator.resources import TuningRunSpec
from attune.operator.webhook import run_problems
from attune.recipe.io import recipe_to_dict
from tests.k8s.fakes import FakePorts, records
from tests.k8s.harness import kubeflow_pod_labels, rfc3339_nano
from tests.k8s.schema import validator

pytestmark = pytest.mark.k8s
ROOT = Path(__file__).resolve().parents[2]
START = "2026-01-01T00:00:00Z"


def hf_run(**spec) -> dict[str, Any]:
    run = yaml.safe_load((ROOT / "examples" / "tuningrun-hf.yaml").read_text())
    run["metadata"].update(name="h", uid="run-uid", generation=1)
    run["spec"]["agent"]["endpoint"] = None
    run["spec"].update(spec)
    return run


def step_line(i: int, loss: float | str) -> str:
    """A step's dict as a flag launch's trial prints it (no token counts: on the command line HF takes only the
    padded count, which attune does not ask for)."""
    return f"{{'loss': '{loss}', 'grad_norm': '0.9', 'learning_rate': '0.001', 'epoch': '{4e-06 * i:.3g}'}}"


class LogPorts(FakePorts):
    """FakePorts whose jobs have a master pod and a timestamped log; ``emit`` appends lines to running jobs."""

    def __init__(self) -> None:
        super().__init__()
        self.logs: dict[str, list[str]] = {}
        self.deleted: list[str] = []
        self.log_error: LogsUnavailable | None = None
        self.step_s = {1: 0.4, 2: 0.3, 4: 0.35}  # seconds per step by per-device batch size

    def create_job(self, job):
        super().create_job(job)
        job["status"]["startTime"] = START
        self.pod_start[job["metadata"]["name"]] = parse_time(START)  # its pods run from the job's start
        self.logs[job["metadata"]["name"]] = []

    def completion_time(self) -> str:
        return "2026-01-01T00:00:36Z"

    def delete_job(self, namespace, name, kind="PyTorchJob"):
        self.deleted.append(name)
        super().delete_job(namespace, name, kind)

    def emit(self, name: str, steps: int, loss: Any = None) -> None:
        """The job's log gets a start line and ``steps`` step lines, at its pace, from the job's start."""
        t0 = parse_time(START) + 5.0
        args = self.jobs[name]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
        pace = self.step_s[int(args[args.index("--per_device_train_batch_size") + 1])]
        lines = [f"{rfc3339_nano(int(t0 * 1e9))} LlamaForCausalLM: 0.99M parameters, world size 1"]
        for i in range(1, steps + 1):
            stamp = rfc3339_nano(int((t0 + pace * i) * 1e9))
            lines.append(f"{stamp} {step_line(i, loss if loss is not None and i == steps else 7 - i / 10)}")
        self.logs[name] = lines

    def list_pods(self, namespace, label_selector):
        assert label_selector == "training.kubeflow.org/job-name=" + label_selector.split("=", 1)[1]
        running = {"phase": "Running", "containerStatuses": [{"name": "pytorch",
                                                              "state": {"running": {"startedAt": START}}}]}
        return [{"metadata": {"name": f"{n}-worker-0", "labels": kubeflow_pod_labels(n, "Worker", 0)},
                 "status": running} for n in self.jobs] + \
               [{"metadata": {"name": f"{n}-master-0", "labels": kubeflow_pod_labels(n, "Master", 0)},
                 "spec": {"containers": [{"name": "pytorch"}]}, "status": running} for n in self.jobs]

    def read_pod_log(self, namespace, pod, container):
        assert container == "pytorch" and pod.endswith("-master-0")
        if self.log_error is not None:
            raise self.log_error
        return "".join(line + "\n" for line in self.logs.get(pod.removesuffix("-master-0"), []))

    def measure(self, *a, **kw):
        raise AssertionError("an hf trial must not be measured through Prometheus")


def step(run, ports):
    res = reconcile(run, ports)
    run["status"] = {k: v for k, v in {**(run.get("status") or {}), **res.status}.items() if v is not None}
    ports.t += 5
    return res


def test_the_hf_example_resolves_and_validates():
    doc = yaml.safe_load((ROOT / "examples" / "tuningrun-hf.yaml").read_text())
    assert not [e.message for e in validator().iter_errors(doc)]
    run = hf_run()
    assert run_problems(run) == []
    recipe = resolve_recipe(TuningRunSpec.model_validate(run["spec"]), "ml", run_name="h")
    assert recipe.framework == "hf" and recipe.name == "h" and recipe.resources.devices == 1
    assert recipe.launch.argv[:2] == ("python", "train.py")
    # the same recipe given inline (what `attune import --framework hf` prints) resolves alike
    inline = hf_run(recipe={"inline": recipe_to_dict(recipe)})
    assert inline["spec"]["recipe"]["inline"]["framework"] == "hf" and run_problems(inline) == []
    assert resolve_recipe(TuningRunSpec.model_validate(inline["spec"]), "ml") == recipe


def _fixed(run: dict[str, Any]) -> dict[str, Any]:
    run["spec"].setdefault("metrics", {})["adaptiveWindow"] = False
    return run


def test_a_trial_is_measured_from_its_log_as_soon_as_it_holds_the_steps():
    ports, run = LogPorts(), _fixed(hf_run())
    step(run, ports)  # baseline trial created
    step(run, ports)  # its job created
    assert ports.jobs_created == ["h-t001"]
    job = ports.jobs["h-t001"]
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    tpl = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["image"] == tpl["image"] and container["command"] == tpl["command"]
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "None"  # the log outlives a failed job
    ports.emit("h-t001", 3)  # warm-up 1 + measure 3 = 4 needed
    step(run, ports)
    assert not records(ports, run) and ports.deleted == []
    cond = {c["type"]: c for c in run["status"]["conditions"]}["MetricsAvailable"]
    assert cond["status"] == "True" and "3 of 4 steps" in cond["message"] and "h-t001-master-0" in cond["message"]
    ports.emit("h-t001", 6)  # more than needed: only the first 4 count
    step(run, ports)
    rec = records(ports, run)[0]
    assert rec["outcome"] == "succeeded" and "log of its master pod" in rec["message"]
    meas = rec["measurement"]
    assert meas["steps_measured"] == 3 and meas["step_time_median_s"] == pytest.approx(0.4, abs=1e-6)
    assert meas["tokens_per_s"] == pytest.approx(4 / 0.4, rel=1e-6)  # the global batch: 4 samples a step
    assert meas["losses"] == pytest.approx([6.9, 6.8, 6.7, 6.6])
    # charged from when its pods ran to the 4th step's kubelet time
    assert rec["wall_s"] == pytest.approx(5.0 + 4 * 0.4, abs=1e-6)
    assert rec["charged_hours"] == pytest.approx((5.0 + 4 * 0.4) / 3600, rel=1e-6)
    # the job is stopped only once the record is stored: the trial's record, then the deletion
    ops = [op for op in ports.ops if op[1] == "h-t001"]
    assert ops[-3:] == [("patch", "h-t001"), ("delete", "h-t001"), ("patch", "h-t001")], ops
    assert ports.deleted == ["h-t001"] and ports.trials["h-t001"]["status"]["phase"] == "Succeeded"
    assert "jobStopping" not in ports.trials["h-t001"]["status"]
    step(run, ports)
    replay = copy.deepcopy(run)
    step(replay, ports)  # nothing is stopped or recorded twice
    assert ports.deleted == ["h-t001"] and len(records(ports, replay)) == 1


def test_an_hf_run_tunes_to_succeeded_with_the_loss_check_from_logged_losses():
    ports, run = LogPorts(), hf_run()
    for _ in range(80):
        step(run, ports)
        for name in ports.jobs:
            ports.emit(name, 4)
        if run["status"].get("phase") in ("Succeeded", "Failed"):
            break
    st = run["status"]
    assert st["phase"] == "Succeeded", st["message"]
    recs = records(ports, run)
    kinds = [r["kind"] for r in recs]
    assert kinds[:2] == ["baseline", "baseline"] and "candidate" in kinds and "loss_check" in kinds, kinds
    assert "reference" in kinds  # the paired A-B-A re-measurement runs as a trial of its own
    cand = next(r for r in recs if r["kind"] == "candidate")
    assert cand["change"] == {"per_device_train_batch_size": 2} and "loss_equivalence" in cand["verdict"]["owed"]
    check = next(r for r in recs if r["kind"] == "loss_check")
    assert check["loss_check"]["passed"] is True, check
    assert st["best"]["knobs"] == {"per_device_train_batch_size": 2}
    assert st["best"]["speedup"] == pytest.approx(0.4 / 0.3, rel=1e-3)
    assert sorted(ports.deleted) == sorted(ports.jobs_created)  # every trial's job was stopped by the operator


def test_an_unreadable_log_is_a_condition_and_the_trial_waits():
    ports, run = LogPorts(), hf_run()
    step(run, ports)
    step(run, ports)
    ports.emit("h-t001", 5)
    ports.log_error = LogsUnavailable("Forbidden", 'pods "h-t001-master-0" is forbidden: cannot get resource '
                                                   '"pods/log"')
    step(run, ports)
    cond = {c["type"]: c for c in run["status"]["conditions"]}["MetricsAvailable"]
    assert cond["status"] == "False" and cond["reason"] == "PodLogForbidden" and "pods/log" in cond["message"]
    assert not records(ports, run)
    ports.finish()  # the job ends while the log stays forbidden: still waiting, nothing recorded on a guess
    step(run, ports)
    assert not records(ports, run)
    ports.log_error = None  # a fixed Role: the trial is measured from its (kept) pod's log
    step(run, ports)
    assert records(ports, run)[0]["outcome"] == "succeeded"


@pytest.mark.parametrize(("line", "outcome", "text"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom", "out of memory"),
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", "comm_crash", "NCCL"),
    ("ValueError: something else broke", "crashed", "something else broke"),
])
def test_a_failed_job_is_classified_from_its_log(line, outcome, text):
    ports, run = LogPorts(), hf_run()
    step(run, ports)
    step(run, ports)
    ports.emit("h-t001", 1)
    ports.logs["h-t001"].append(f"{rfc3339_nano(int((parse_time(START) + 9) * 1e9))} {line}")
    ports.finish(ok=False, reason="Error")
    step(run, ports)
    rec = records(ports, run)[0]
    assert rec["outcome"] == ("crashed" if outcome == "comm_crash" else outcome) and text in rec["message"], rec
    assert rec["charged_hours"] == pytest.approx(36 / 3600)  # the job's start to its completion time
    assert {c["type"]: c for c in run["status"]["conditions"]}["TrialsHealthy"]["reason"] == "JobFailed"


def test_a_nan_loss_stops_a_running_job_as_diverged():
    ports, run = LogPorts(), hf_run()
    step(run, ports)
    step(run, ports)
    ports.emit("h-t001", 2, loss="nan")
    step(run, ports)
    rec = records(ports, run)[0]
    assert rec["outcome"] == "diverged" and "nan" in rec["message"]
    step(run, ports)
    assert ports.deleted == ["h-t001"]


@pytest.mark.parametrize(("ok", "text"), [(True, "master pod's log is gone"), (False, "job failed: Error")])
def test_a_finished_job_whose_pod_is_gone_is_recorded_from_the_job(ok, text):
    ports, run = LogPorts(), hf_run()
    step(run, ports)
    step(run, ports)
    ports.log_error = LogsUnavailable("NotFound", 'pods "h-t001-master-0" not found')
    ports.finish(ok=ok, reason="" if ok else "Error")
    step(run, ports)
    rec = records(ports, run)[0]
    assert rec["outcome"] == "crashed" and text in rec["message"], rec
    assert {c["type"]: c for c in run["status"]["conditions"]}["MetricsAvailable"]["reason"] == "PodLogNotFound"


def test_the_adaptive_window_ends_a_steady_trial_from_its_log_before_its_fixed_steps():
    """The operator honours the adaptive window (issue 40): three steady steps of the baseline's log are a window
    whose median is known, so the trial is measured (and its job stopped) before the fixed warm-up 1 + measure 3."""
    ports, run = LogPorts(), hf_run()
    assert run_problems(run) == []
    step(run, ports)
    step(run, ports)
    ports.emit("h-t001", 2)
    step(run, ports)
    assert not records(ports, run)  # two steps: too few to know the level
    ports.emit("h-t001", 3)
    step(run, ports)
    rec = records(ports, run)[0]
    assert rec["outcome"] == "succeeded" and "(3 steps)" in rec["message"]
    meas = rec["measurement"]
    assert meas["ended"] == "precise" and meas["warmup_steps"] == 0 and meas["steps_measured"] == 3
    assert meas["step_time_median_s"] == pytest.approx(0.4, abs=1e-6) and len(meas["losses"]) == 3
    assert rec["wall_s"] == pytest.approx(5.0 + 3 * 0.4, abs=1e-6)  # charged to its 3rd step, not a 4th

