"""End to end on the real control plane: a TuningRun whose trial template is an ordinary HuggingFace PyTorchJob
(examples/tuningrun-hf.yaml: its own image and ``python train.py ...``) runs to Succeeded. The chart is installed
with helm and the operator runs with its ServiceAccount's token; the real training operator creates each trial's
pods, the real scheduler binds them, the pod runner runs ``train.py`` from the image's files (examples/hf-trainer);
step times and losses come from the master pod's log read through the API server; the ``<run>-tuned`` ConfigMap is
written; deleting the run lets the real garbage collector remove trials, jobs, pods and (deleteWithRun) the
ConfigMap."""

from __future__ import annotations

import math
import time

import pytest
from kubernetes import client

from tests.k8s.harness import NS, ROOT, Operator, wait_for
from tests.k8s.hfruns import finished, hf_run, master_container
from tests.k8s.realcluster import Release
from tests.k8s.realcluster_kubeflow import TrainingOperator

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.e2e]


def test_hf_run_succeeds_on_the_real_control_plane(training_operator: TrainingOperator, release: Release,
                                                   real_operator: Operator) -> None:
    cp = release.cp
    t0 = time.monotonic()
    run = hf_run("hf", deleteWithRun=True)
    template = master_container(run["spec"]["trialTemplate"])
    cp.set_images({template["image"]: ROOT / "examples" / "hf-trainer"})  # what the image holds in /app
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    done = finished(release, "hf", 600, 1.0)
    elapsed = time.monotonic() - t0
    status = done["status"]
    records = release.records("hf")
    assert status["phase"] == "Succeeded", (status.get("message"), real_operator.log()[-3000:])
    launched = [r for r in records if r["outcome"] != "refused" and r["kind"] != "loss_check"]
    assert [r["kind"] for r in records[:2]] == ["baseline", "baseline"]
    for r in launched:
        if r["outcome"] == "succeeded":
            m = r["measurement"]
            assert "log of its master pod" in r["message"]
            assert m["steps_measured"] == 3 and m["tokens_per_s_per_device"] > 0
            assert all(math.isfinite(v) and 0 < v < 20 for v in m["losses"]), m["losses"]
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

    # deleting the run: the garbage collector takes its trials, their jobs and pods, and the tuned ConfigMap
    cp.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "hf")
    wait_for(lambda: not release.trials() and not release.jobs() and not cp.core.list_namespaced_pod(NS).items
             and not [c for c in cp.core.list_namespaced_config_map(NS).items if c.metadata.name == "hf-tuned"],
             120, "the garbage collector to remove the run's trials, jobs, pods and tuned ConfigMap")
    print(f"\nreal hf e2e: {len(launched)} trials, {elapsed:.1f} s, best {status.get('best')}")
