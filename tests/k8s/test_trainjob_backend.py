"""TrainJob trials (Kubeflow Trainer v2) through :func:`reconcile`: a TrainJob template runs its trials as
TrainJobs, and a cluster without the TrainJob CRD says so in a condition."""

from __future__ import annotations

import pytest

from tests.k8s.fakes import FakePorts, conds, drive, step, trainjob_run

pytestmark = pytest.mark.k8s


# -- TrainJob ------------------------------------------------------------------------------------------------------

def test_a_trainjob_template_runs_its_trials_as_trainjobs():
    ports = FakePorts()
    run = drive(trainjob_run(), ports)
    assert run["status"]["phase"] == "Succeeded", run["status"]["message"]
    job = ports.jobs[ports.jobs_created[0]]
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    trainer = job["spec"]["trainer"]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert '"max_steps":62' in env["ATTUNE_TRIAL_SPEC"] and trainer["numProcPerNode"] == 1
    assert job["spec"]["runtimeRef"] == {"name": "torch-distributed"} and job["spec"]["labels"]["attune.dev/run"] == "r"
    assert "ports" not in trainer
    assert ports.trials["r-t001"]["status"]["jobRef"]["kind"] == "TrainJob"
    assert run["status"]["best"]["speedup"] == pytest.approx(1.6, rel=1e-3)


def test_a_missing_trainjob_crd_is_a_clear_condition():
    ports = FakePorts()
    ports.served_kinds = {"pytorchjobs"}  # Kubeflow Trainer not installed
    run = trainjob_run()
    step(run, ports)
    res = step(run, ports)
    assert run["status"]["phase"] == "Failed" and not ports.jobs_created
    c = conds(run)["BackendAvailable"]
    assert c["reason"] == "CRDNotInstalled" and "trainer.kubeflow.org/v1alpha1 trainjobs" in c["message"]
    assert res.permanent
