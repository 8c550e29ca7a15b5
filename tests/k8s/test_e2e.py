"""End to end on the real control plane: the chart installed with helm, the operator with its ServiceAccount's token,
the real training operator creating each trial's pods, the real scheduler binding them, the pod runner running the
reference trainer in them, and a real Prometheus scraping them as the chart's PodMonitor selects them."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from attune.trainer.config import READ_LATENCY_ENV
from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, free_port, free_port_block, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.e2e]
MEASURE = 20


def _phase(kube, name):
    run = kube.run(name) or {}
    return (run.get("status") or {}).get("phase")


def test_run_to_succeeded_survives_an_operator_kill(training_operator, release, real_operator, pod_metrics,
                                                    prometheus, agent):
    """A full run whose candidate (micro_batch_size 1 → 2) owes the loss-equivalence check, read from Prometheus."""
    t0 = time.monotonic()
    run = good_run("tiny", prometheus.url, agent.url, searchSpace=["micro_batch_size"])
    # a data-bound job whose decision no load can turn: each micro-batch read waits 20 ms (the reference trainer's
    # simulated slow storage, a sleep), 8 micro-batches a step, short sequences. Micro-batch 2 halves the reads:
    # 160 ms of waiting a step against 80 ms, whatever the CPUs are doing, far beyond the paired decision's noise
    run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
    pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    pod["containers"][0]["env"] = [{"name": READ_LATENCY_ENV, "value": "20"}]
    # the rendezvous port the training operator gives torchrun (MASTER_PORT): the pod runner's pods share this
    # machine's ports, so not the default 23456 another test's trial may hold
    pod["containers"][0]["ports"] = [{"name": "pytorchjob-port", "containerPort": free_port(), "protocol": "TCP"}]
    run["spec"]["metrics"]["measureSteps"] = MEASURE  # a decisive gain needs no long window
    # room for a second look: the first (the baseline's second run, the candidate, the best's run after it) rests
    # on two degrees of freedom, and a cold first baseline run on a busy CI machine can leave it inconclusive
    run["spec"]["budget"]["maxTrials"] = 7  # (and not a second candidate: micro-batch 4 would gain again)
    run["spec"]["metrics"]["metricsPort"] = free_port_block(2)  # the pod runner's pods share this machine's ports
    # Prometheus behind a token (read from a Secret of the run's namespace, sent to loopback only), and the namespace's
    # lessons already holding an earlier run's entry: this run's is merged in
    kube = release
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_secret(NS, {"metadata": {"name": "prom-token"}, "stringData": {"token": "t0ken"}})
    run["spec"]["metrics"]["prometheus"] = {"bearerTokenSecretRef": {"name": "prom-token", "key": "token"}}
    core.create_namespaced_config_map(NS, {"metadata": {"name": "attune-lessons", "labels": {
        "app.kubernetes.io/managed-by": "attune", "attune.dev/lessons": "true"}}, "data": {"note": "kept"}})
    kube.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    # the second baseline's job is running: kill the operator without grace
    wait_for(lambda: kube.master_running("tiny-t002"), 120, "trial 2's master pod to run", interval=0.2)
    real_operator.kill()
    # the trial finishes while no operator runs
    wait_for(lambda: kube.job_finished("tiny-t002"), 120, "trial 2 to finish without the operator")
    real_operator.start()
    run = wait_for(lambda: _phase(kube, "tiny") in ("Succeeded", "Failed") and kube.run("tiny"), 240,
                   "the run to finish", interval=0.5)
    elapsed = time.monotonic() - t0
    status = run["status"]
    records = kube.records("tiny")
    for r in records:
        print(r["id"], r["kind"], r["change"], r["outcome"], r["message"][:120], "|", r["decision"], "|",
              round(r["wall_s"], 1), "s", (r.get("measurement") or {}).get("steps_measured"),
              (r.get("measurement") or {}).get("tokens_per_s_per_device"))
    print(status.get("message"))
    assert status["phase"] == "Succeeded", status
    assert "records" not in status  # each TuningTrial holds its own record
    ids = [r["id"] for r in records]
    assert ids == sorted(set(ids)), "a record was written twice"
    launched = [r for r in records if r["outcome"] != "refused" and r["kind"] not in ("loss_check", "decision")]
    names = [f"tiny-t{r['id']:03d}" for r in launched]
    # exactly one job per launched trial, none launched twice, across the restart
    assert sorted(kube.job_creates()) == sorted(names)
    assert sorted(t["metadata"]["name"] for t in kube.trials()) == sorted(names)
    # budget: each trial charged once, and the status total is their sum
    assert status["budget"]["hoursUsed"] == pytest.approx(sum(r["charged_hours"] for r in records), abs=1e-6)
    for t in kube.trials():
        rec = next(r for r in records if r["id"] == t["spec"]["index"])
        assert t["status"]["phase"] in ("Succeeded", "Failed")
        assert t["status"]["hoursCharged"] == pytest.approx(rec["charged_hours"])
    assert [r["kind"] for r in records[:2]] == ["baseline", "baseline"]
    assert all(r["outcome"] == "succeeded" for r in records[:2]), [(r["outcome"], r["message"]) for r in records]
    assert records[0]["measurement"]["tokens_per_s_per_device"] > 0
    assert status["baseline"]["throughput"] > 0 and status["best"]["speedup"] > 0
    assert status["tunedRecipe"]["model"]["hidden_size"] == 128
    tuned = client.CoreV1Api(kube.api).read_namespaced_config_map(status["tunedRecipeRef"]["configMap"], NS).data
    import yaml

    committed = yaml.safe_load(tuned["recipe.yaml"])
    assert committed["knobs"] == status["tunedRecipe"]["knobs"] and committed["name"] == status["tunedRecipe"]["name"]
    assert "pytorchjob.yaml" in tuned and "launch.sh" not in tuned  # the user's template, tuned: ready to commit
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Stalled"]["status"] == "False"
    assert conds["Reconciling"]["status"] == "False"
    gen = run["metadata"]["generation"]
    assert all(c["observedGeneration"] == gen and c["lastTransitionTime"] for c in status["conditions"])
    assert status["trials"]["running"] == 0 and not status.get("currentTrial")
    # candidates came from the sidecar over HTTP
    assert any(r["kind"] == "candidate" for r in records)
    assert all(r["source"] == "playbook" for r in records if r["kind"] == "candidate"), records
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["AgentAvailable"]["status"] == "True"
    # every succeeded trial's whole loss curve came back from Prometheus, and each step was timed
    steps = 2 + MEASURE
    for r in records:
        if r["kind"] not in ("loss_check", "decision") and r["outcome"] == "succeeded":
            assert len(r["measurement"]["losses"]) == steps, (r["id"], len(r["measurement"]["losses"]))
            assert r["measurement"]["steps_measured"] == MEASURE
    # the candidate owed the loss check; it ran on curves from Prometheus and passed (same training, new split)
    cand = next(r for r in records if r["kind"] == "candidate")
    assert cand["change"] == {"micro_batch_size": 2} and "loss_equivalence" in cand["verdict"]["owed"]
    assert not cand["decision"].startswith("rejected"), cand["decision"]  # a gain of tens of %; the floor is a few
    checks = [r for r in records if r["kind"] == "loss_check" and r["change"] == cand["change"]]
    assert len(checks) == 1 and checks[0]["loss_check"]["passed"] is True, checks
    assert checks[0]["accepted"] and checks[0]["decision"].startswith("accepted")
    assert any(r["kind"] == "calibration" and r["outcome"] == "succeeded" for r in records)
    runs_of_it = {r["id"] for r in records if r["kind"] in ("candidate", "confirm") and r["change"] == cand["change"]}
    judged = [t for t in kube.trials() if t["spec"]["index"] in runs_of_it]
    assert judged and all(t["status"]["lossCheck"]["passed"] is True for t in judged), \
        [t["status"].get("lossCheck") for t in judged]
    assert status["best"]["knobs"] == {"micro_batch_size": 2}
    # the namespace's lessons learnt from this run (merged into its ConfigMap), and the tuned manifest outlives the run
    lessons = core.read_namespaced_config_map("attune-lessons", NS).data
    assert lessons["note"] == "kept" and any(k.startswith("run.tiny.") for k in lessons), sorted(lessons)
    tuned_cm = core.read_namespaced_config_map(status["tunedRecipeRef"]["configMap"], NS)
    assert not tuned_cm.metadata.owner_references
    kube.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "tiny")
    wait_for(lambda: kube.run("tiny") is None, 90, "the run to be deleted")
    assert core.read_namespaced_config_map(status["tunedRecipeRef"]["configMap"], NS).data == tuned
    print(f"\ne2e: {len(launched)} trials, {elapsed:.1f} s, best speedup {status['best']['speedup']}")
