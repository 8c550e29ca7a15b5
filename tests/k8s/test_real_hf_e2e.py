"""End to end on the real control plane: a TuningRun whose trial template is an ordinary HuggingFace PyTorchJob
(examples/tuningrun-hf.yaml: its own image and ``python train.py ...``) runs to Succeeded. The chart is installed
with helm and the operator runs with its ServiceAccount's token; the real training operator creates each trial's
pods, the real scheduler binds them, the pod runner runs ``train.py`` from the image's files (examples/hf-trainer);
step times and losses come from the master pod's log read through the API server; each trial's job keeps the
template's image and command, the knob change in its args; the operator stops each measured job (no trainer runs on
to its --max_steps); the ``<run>-tuned`` ConfigMap is written; deleting the run lets the real garbage collector remove
trials, jobs, pods and (deleteWithRun) the ConfigMap."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from tests.k8s.harness import NS, ROOT, Operator, wait_for
from tests.k8s.hfruns import finished, hf_run, master_container
from tests.k8s.realcluster import Release
from tests.k8s.realcluster_kubeflow import TrainingOperator

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.e2e]


class CreatedJobs:
    """Every PyTorchJob of the namespace as the API server first stored it (a watch from now): the operator deletes
    each measured trial's job, so a job is read while it exists."""

    def __init__(self, release: Release) -> None:
        self.release, self.specs = release, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="created-jobs")
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.is_set():
            w = watch.Watch()
            for event in w.stream(self.release.custom.list_namespaced_custom_object, "kubeflow.org", "v1", NS,
                                  "pytorchjobs", timeout_seconds=5):
                obj: dict[str, Any] = event["object"]
                self.specs.setdefault(obj["metadata"]["name"], obj)
            w.stop()

    def close(self) -> None:
        self.done.set()
        self.thread.join(30)


def test_hf_run_succeeds_on_the_real_control_plane(training_operator: TrainingOperator, release: Release,
                                                   real_operator: Operator, tmp_path: Path) -> None:
    cp = release.cp
    t0 = time.monotonic()
    run = hf_run("hf", deleteWithRun=True)
    template = master_container(run["spec"]["trialTemplate"])
    cp.set_images({template["image"]: ROOT / "examples" / "hf-trainer"})  # what the image holds in /app
    created = CreatedJobs(release)
    try:
        cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
        done = finished(release, "hf", 600, 1.0)
    finally:
        created.close()
    elapsed = time.monotonic() - t0
    status = done["status"]
    records = release.records("hf")
    assert status["phase"] == "Succeeded", (status.get("message"), real_operator.log()[-3000:])
    launched = [r for r in records if r["outcome"] != "refused" and r["kind"] not in ("loss_check", "decision")]
    names = [f"hf-t{r['id']:03d}" for r in launched]
    assert sorted(release.job_creates()) == sorted(names)  # one job per launched trial
    assert [r["kind"] for r in records[:2]] == ["baseline", "baseline"]
    assert all(r["outcome"] == "succeeded" for r in records[:2])
    # the recipe was imported from the template's own command line
    base = status["baselineRecipe"]
    assert base["framework"] == "hf" and base["launch"]["argv"] == template["command"] + template["args"]
    # every trial's job kept the template's image and command; the knob change went into its args
    for name, rec in zip(names, launched, strict=True):
        job = created.specs[name]
        c = master_container(job)
        assert c["image"] == template["image"] and c["command"] == template["command"], c
        assert c["resources"] == template["resources"] and job["spec"]["nprocPerNode"] == "1"
        args = c["args"]
        assert args[args.index("--logging_steps") + 1] == "1"  # instrumentation, appended
        assert args[args.index("--max_steps") + 1] == "100000"  # the user's schedule is never touched
        pd = args[args.index("--per_device_train_batch_size") + 1]
        acc = args[args.index("--gradient_accumulation_steps") + 1]
        assert int(pd) * int(acc) == 16  # the global batch stays
        assert int(pd) == rec["knobs"]["per_device_train_batch_size"]
    for r in launched:
        if r["outcome"] == "succeeded":
            m = r["measurement"]
            assert "log of its master pod" in r["message"]
            # the window (3 steps) after the warm-up read from the log (at most the 1 step asked for)
            assert m["steps_measured"] == 3 and m["tokens_per_s_per_device"] > 0 and m["warmup_steps"] <= 1
            assert len(m["losses"]) == 3 + m["warmup_steps"] and all(math.isfinite(v) and 0 < v < 20 for v in m["losses"]), m["losses"]
            assert 0 < r["wall_s"] < 240 and r["charged_hours"] == pytest.approx(r["wall_s"] / 3600, rel=1e-6)
    # the operator stopped each measured job (they would train to max_steps 100000): no trainer runs on
    wait_for(lambda: not [p for p in cp.core.list_namespaced_pod(NS).items if p.status.phase in ("Pending", "Running")]
             and not [j for j in release.jobs() if release.job_finished(j["metadata"]["name"]) is None], 120,
             "every trial's job to be stopped and its pods to end")
    # the candidate (per-device batch 1 → 2, accumulation 16 → 8) owed the loss check: it ran on the HF logged losses
    cand = next(r for r in records if r["kind"] == "candidate")
    assert cand["change"] == {"per_device_train_batch_size": 2} and "loss_equivalence" in cand["verdict"]["owed"]
    checks = [r for r in records if r["kind"] == "loss_check"]
    assert checks, "the candidate's loss check never ran"
    check = checks[0]["loss_check"]
    assert check is not None and check["drift_runs"] >= 2 and check["passed"] is True, checks[0]
    assert status["budget"]["hoursUsed"] == pytest.approx(sum(r["charged_hours"] for r in records), abs=1e-6)
    # the pods were the real training operator's, run by the pod runner, and their logs went through the API server
    events = cp.audit(since=release.since)
    log_reads = [e for e in events if (e.get("objectRef") or {}).get("subresource") == "log"
                 and (e.get("user") or {}).get("username", "").endswith(":attune-system:attune")]
    assert log_reads and all((e.get("responseStatus") or {}).get("code", 200) == 200 for e in log_reads[:3])
    pod_creators = {(e.get("user") or {}).get("username") for e in events
                    if e.get("verb") == "create" and (e.get("objectRef") or {}).get("resource") == "pods"
                    and not (e.get("objectRef") or {}).get("subresource")}  # (the scheduler creates pods/binding)
    assert pod_creators == {"attune-admin"}, pod_creators  # the training operator (admin credentials), nobody else

    tuned = client.CoreV1Api(cp.api).read_namespaced_config_map("hf-tuned", NS)
    assert tuned.metadata.owner_references and tuned.metadata.owner_references[0].name == "hf"
    assert any(k.endswith(".yaml") for k in tuned.data), sorted(tuned.data)
    _the_kubectl_plugin_reads_the_run(release, records, tmp_path)

    # deleting the run: the garbage collector takes its trials, their jobs and pods, and the tuned ConfigMap
    cp.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "hf")
    wait_for(lambda: not release.trials() and not release.jobs() and not cp.core.list_namespaced_pod(NS).items
             and not [c for c in cp.core.list_namespaced_config_map(NS).items if c.metadata.name == "hf-tuned"],
             120, "the garbage collector to remove the run's trials, jobs, pods and tuned ConfigMap")
    print(f"\nreal hf e2e: {len(launched)} trials, {elapsed:.1f} s, best {status.get('best')}")


def _the_kubectl_plugin_reads_the_run(release: Release, records: list[dict[str, Any]], tmp: Path) -> None:
    """``kubectl attune`` through the real kubectl, which finds ``kubectl-attune`` on PATH as a user's would: the
    run listed with its phase, its trials one row each, its report built from the records, and the tuned manifest
    exported as files the real API server accepts (a server-side dry run of ``kubectl apply``)."""
    from tests.k8s.realcluster_kubeflow import k8s_bin

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(release.cp.kubeconfig)}

    def kubectl(*args: str) -> str:
        res = subprocess.run([str(k8s_bin() / "kubectl"), *args], capture_output=True, text=True, env=env,
                             timeout=300, cwd=tmp)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    listed = kubectl("attune", "list", "-n", NS).splitlines()
    assert listed[0].split()[:3] == ["NAME", "PHASE", "TRIALS"]
    row = next(line for line in listed if line.split()[0] == "hf")
    assert row.split()[1] == "Succeeded", row
    rows = kubectl("attune", "trials", "hf", "-n", NS).splitlines()
    assert len(rows) == 1 + len(records) and rows[1].split()[:2] == ["1", "baseline"], rows
    kubectl("attune", "report", "hf", "-n", NS, "--dir", "report")
    result = json.loads((tmp / "report" / "result.json").read_text())
    assert len(result["trials"]) == len(records) and (tmp / "report" / "report.html").stat().st_size > 1000
    kubectl("attune", "export", "hf", "-n", NS, "--dir", "tuned")
    assert {"pytorchjob.yaml", "tuned.patch.json", "tuned.diff", "recipe.yaml"} <= {p.name for p in (tmp / "tuned").iterdir()}
    applied = kubectl("apply", "--dry-run=server", "-n", NS, "-f", str(tmp / "tuned" / "pytorchjob.yaml"))
    assert "(server dry run)" in applied, applied
