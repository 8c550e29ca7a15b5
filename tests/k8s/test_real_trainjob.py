"""TrainJob trials against Kubeflow Trainer v2.2.0's own TrainJob CRD on the real API server (issue 38's open
question: the emulator copied ``spec.labels`` onto a TrainJob's pods, and the chart's TrainJob PodMonitor selects
pods by the run's label).

Trainer v2.2 has no ``spec.labels``: its structural schema prunes the field, so labels written only there reach
nothing. It takes pod labels from ``spec.runtimePatches`` (one entry per manager), strategic-merged into the
replicated job's pod template (``mergeRuntimePatches`` in ``pkg/runtime/core/trainingruntime.go`` of the release).
Shown here on the real server: what attune writes survives the schema with the run's labels in its runtime patch,
and the chart's TrainJob PodMonitor, as installed, selects a pod carrying those labels and the JobSet's. Not shown:
Trainer's controller and JobSet running (not built here), so the merge itself is the release's code, read, not run."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from attune.operator.resources import LABEL_RUN
from tests.k8s.fakes import FakePorts, drive, trainjob_run
from tests.k8s.harness import NS
from tests.k8s.realcluster import Release
from tests.k8s.realcluster_kubeflow import _module_dir
from tests.k8s.scrape import targets

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
TRAINER = "github.com/kubeflow/trainer/v2"
CRD = "trainjobs.trainer.kubeflow.org"


def _trainjob_crd() -> dict:
    path = _module_dir("crds", TRAINER) / "manifests" / "base" / "crds" / "trainer.kubeflow.org_trainjobs.yaml"
    return yaml.safe_load(path.read_text())


def test_a_trainjob_trial_keeps_the_runs_labels_for_its_pods_on_trainer_v2_2(release: Release) -> None:
    cp = release.cp
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(_trainjob_crd()))
    try:
        cp.wait_established(CRD)
        ports = FakePorts()  # the job exactly as the reconciler builds it
        drive(trainjob_run(), ports)
        job = ports.jobs[ports.jobs_created[0]]
        name = job["metadata"]["name"]
        job["metadata"] = {k: v for k, v in job["metadata"].items() if k != "ownerReferences"}  # no trial here
        job["metadata"]["namespace"] = NS
        job["spec"].pop("suspend", None)
        job.pop("status", None)
        cp.custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", job)
        back = cp.custom.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", name)
        assert "labels" not in back["spec"], "Trainer v2.2's schema has no spec.labels: the server prunes it"
        [ours] = [p for p in back["spec"]["runtimePatches"] if p["manager"] == "attune.dev/operator"]
        [node] = ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert node["name"] == "node"
        pod_labels = node["template"]["spec"]["template"]["metadata"]["labels"]
        assert pod_labels[LABEL_RUN] == "r"
        # the chart's TrainJob PodMonitor (installed with the release) selects such a pod of the trial's JobSet,
        # at the trainer's port number
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"{name}-node-0-0-abcde", namespace=NS, labels={
                **pod_labels, "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": "node"}),
            spec=client.V1PodSpec(containers=[client.V1Container(name="node")]),
            status=client.V1PodStatus(phase="Running", pod_ip="127.0.0.1"))
        monitors = cp.custom.list_cluster_custom_object("monitoring.coreos.com", "v1", "podmonitors")["items"]
        found = targets(monitors, [pod])
        assert [t["targets"] for t in found] == [["127.0.0.1:9464"]], found
        # without the run's label (what a v2.2 pod got from spec.labels alone) nothing is scraped
        pod.metadata.labels = {k: v for k, v in pod.metadata.labels.items() if k != LABEL_RUN}
        assert targets(monitors, [pod]) == []
    finally:  # the worker's later tests expect a cluster without Kubeflow Trainer
        cp.remove_crds(CRD)


def test_a_trainjob_run_succeeds_on_kubeflow_trainer_and_jobset(trainer, crds, prometheus, tmp_path) -> None:
    """A TuningRun whose trial template is a TrainJob of the release's ``torch-distributed`` runtime: the real Trainer
    makes each trial's JobSet, the real JobSet controller its Job, the Job controller its pod, the pod runner runs the
    reference trainer, and the chart's TrainJob PodMonitor (by port number) selects the pod by the labels of attune's
    runtime patch: the trials are measured from Prometheus and the run succeeds."""
    from tests.k8s.harness import Operator, free_port_block, wait_for
    from tests.k8s.scrape import PodMonitorDiscovery

    port = free_port_block(2)
    release = Release(crds, tmp_path, extra_sets=(f"trials.podMonitor.trainJob.portNumber={port}",))
    op = Operator(release, tmp_path, args=release.operator_args())
    discovery = PodMonitorDiscovery(crds.api, prometheus)
    try:
        op.start()
        run = trainjob_run()
        run["metadata"] = {"name": "tj", "namespace": NS}
        run["spec"]["metrics"].update(prometheusUrl=prometheus.url, metricsPort=port, measureSteps=10)
        run["spec"]["budget"].update(maxTrials=2)
        run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
        crds.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
        done = wait_for(lambda: (s := (release.run("tj") or {}).get("status") or {}).get("phase")
                        in ("Succeeded", "Failed") and s, 420, "the TrainJob run to finish", interval=1.0)
        records = release.records("tj")
        assert done["phase"] == "Succeeded", (done.get("message"), [(r["outcome"], r["message"]) for r in records],
                                              op.log()[-2000:])
        measured = [r for r in records if r["outcome"] == "succeeded"]
        assert len(measured) >= 2, [(r["outcome"], r["message"]) for r in records]
        for r in measured:  # every step's loss came back from Prometheus, the window's steps were timed
            assert r["measurement"]["steps_measured"] == 10 and len(r["measurement"]["losses"]) == 12, r
        # the trials' pods were the JobSets' (Trainer's), selected by the chart's TrainJob PodMonitor
        assert any(p.startswith("tj-t001-node-0-0-") for p in discovery.seen), sorted(discovery.seen)
        jobsets = crds.custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NS, "jobsets")["items"]
        assert jobsets and {j["metadata"]["ownerReferences"][0]["kind"] for j in jobsets} == {"TrainJob"}
        # deleting the run: its TrainJobs, their JobSets and pods go with it (the operator or the garbage collector)
        assert release.trainjobs()
        crds.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "tj")
        wait_for(lambda: not release.trainjobs() and not crds.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", NS, "jobsets")["items"], 120, "the run's TrainJobs and JobSets to go")
    finally:
        discovery.close()
        op.stop()
        release.close()


def test_a_trainjob_trial_no_node_can_take_is_stopped_at_its_pending_deadline(trainer, release: Release,
                                                                              real_operator) -> None:
    """A TrainJob trial asking for a GPU the Node does not have: JobSet's pod stays Unschedulable (the real
    scheduler's message), the trial waits uncharged, and at the pending deadline the operator deletes the TrainJob
    and stops the run saying why."""
    from tests.k8s.harness import wait_for

    run = trainjob_run()
    run["metadata"] = {"name": "tj-gpu", "namespace": NS}
    run["spec"]["trialTemplate"]["spec"]["trainer"]["resourcesPerNode"] = {
        "requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 30
    release.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    done = wait_for(lambda: (s := (release.run("tj-gpu") or {}).get("status") or {}).get("phase") == "Failed" and s,
                    180, "the run to stop at the pending deadline", interval=1.0)
    assert "pendingDeadlineSeconds (30 s)" in done["message"] and "Insufficient nvidia.com/gpu" in done["message"], \
        done["message"]
    [rec] = release.records("tj-gpu")
    assert rec["outcome"] == "interrupted" and rec["charged_hours"] == 0
    wait_for(lambda: not release.trainjobs(), 60, "the operator to delete the trial's TrainJob")
    assert any(d["verb"] == "delete" and d["resource"] == "trainjobs" and d["allowed"] for d in release.decisions())
