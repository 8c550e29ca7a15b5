"""The reconcile step with fake ports: the state machine, failures surfaced as conditions, and the pure builders."""

from __future__ import annotations

import copy

import pytest

from attune.operator import metrics
from attune.operator.manifests import build_pytorchjob, trial_name
from attune.operator.metrics import MetricsUnavailable
from attune.operator.reconcile import reconcile
from attune.operator.resources import MetricsSpec
from tests.k8s.conftest import good_run
from tests.k8s.fakes import FakePorts, ScriptedPrometheus, records, tuning_run
from tests.k8s.fakes import drive as _drive

pytestmark = pytest.mark.k8s




def test_run_tunes_to_succeeded_and_each_trial_runs_once():
    ports = FakePorts()
    run = _drive(tuning_run(), ports)
    st = run["status"]
    assert st["phase"] == "Succeeded", st["message"]
    assert st["tunedRecipe"]["knobs"]["activation_checkpointing"] == "none"
    assert st["best"]["speedup"] == pytest.approx(1.6, rel=1e-3)
    assert len(ports.jobs_created) == len(set(ports.jobs_created))
    conds = {c["type"]: c for c in st["conditions"]}
    # no sidecar configured: the local policy answered and the condition says so
    assert conds["AgentAvailable"]["status"] == "False" and conds["AgentAvailable"]["reason"] == "NoEndpoint"
    assert st["budget"]["hoursUsed"] == pytest.approx(sum(r["charged_hours"] for r in records(ports, run)), abs=1e-6)
    assert "records" not in st  # each trial holds its own record
    cm = ports.configmaps["r-tuned"]  # the tuned recipe, ready to commit
    assert "activation_checkpointing: none" in cm["data"]["recipe.yaml"] and "pytorchjob.yaml" in cm["data"]
    assert st["tunedRecipeRef"] == {"configMap": "r-tuned", "keys": sorted(cm["data"])}


def test_replaying_a_step_changes_nothing():
    """A restarted operator re-reading the same status creates no second trial and charges nothing twice."""
    ports = FakePorts()
    run = tuning_run()
    for _ in range(6):
        res = reconcile(run, ports)
        run["status"] = {**(run.get("status") or {}), **res.status}
        ports.finish()
    before = (records(ports, run), list(ports.jobs_created), sorted(ports.trials))
    stale = copy.deepcopy(run)
    res = reconcile(stale, ports)  # same input twice (e.g. the first patch was lost)
    res2 = reconcile(stale, ports)
    assert res.status["cursor"] == res2.status["cursor"] and records(ports, run)[:len(before[0])] == before[0]
    assert len(ports.jobs_created) == len(set(ports.jobs_created)) >= len(before[1])


def test_unreachable_agent_falls_back_with_a_condition():
    ports = FakePorts()
    run = _drive(tuning_run(agent={"endpoint": "http://127.0.0.1:9", "timeoutSeconds": 1}), ports)
    conds = {c["type"]: c for c in run["status"]["conditions"]}
    assert conds["AgentAvailable"]["reason"] == "AgentUnreachable"
    assert "unreachable" in conds["AgentAvailable"]["message"]
    assert any(r["source"].endswith("-fallback") for r in records(ports, run))


def test_prometheus_unreachable_is_a_condition_not_a_stall():
    ports = FakePorts(measure_error=True)
    run = tuning_run()
    for _ in range(4):
        res = reconcile(run, ports)
        run["status"] = {**(run.get("status") or {}), **res.status}
        ports.finish()
    conds = {c["type"]: c for c in run["status"]["conditions"]}
    assert conds["MetricsAvailable"]["status"] == "False"
    assert conds["MetricsAvailable"]["reason"] == "PrometheusUnreachable"
    assert records(ports, run) == []  # nothing recorded or charged on a guess
    assert conds["Stalled"]["status"] == "False"  # it clears by itself: kstatus readers must not read it as failed
    assert conds["Reconciling"]["status"] == "True" and conds["Reconciling"]["reason"] == "PrometheusUnreachable"


def test_failed_jobs_end_the_run():
    ports = FakePorts()
    run = _drive(tuning_run(), ports, each=lambda p: p.finish(ok=False, reason="Error"))
    st = run["status"]
    assert st["phase"] == "Failed" and "fails" in st["message"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["TrialsHealthy"]["reason"] == "JobFailed"
    assert conds["Stalled"]["status"] == "True" and conds["Ready"]["status"] == "False"


class _KilledPorts(FakePorts):
    """Each trial's trainer is OOM-killed, as on a real cluster: the training operator's Failed condition says only
    that the job failed; the kubelet's terminated state on its (kept) master pod says how."""

    def list_pods(self, namespace, label_selector):
        from attune.operator.reconcile import iso

        pods = super().list_pods(namespace, label_selector)
        job = self.jobs.get(label_selector.split("=", 1)[1]) or {}
        if any(c["type"] == "Failed" for c in (job.get("status") or {}).get("conditions") or []):
            for pod in pods:
                started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
                pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "pytorch", "state": {"terminated": {
                    "exitCode": 137, "reason": "OOMKilled", "startedAt": started, "finishedAt": iso(self.t)}}}]}
        return pods


def test_a_failed_jobs_pod_says_how_its_trainer_ended():
    """The record and the condition say the exit code and the kubelet's reason, and an OOM kill is an OOM (the
    playbook's memory diagnosis), not a crash; the trial's job keeps its finished pods for that."""
    ports = _KilledPorts()
    run = _drive(tuning_run(), ports, each=lambda p: p.finish(ok=False, reason="PyTorchJobFailed"))
    recs = records(ports, run)
    assert recs and all(r["outcome"] == "oom" for r in recs), [(r["outcome"], r["message"]) for r in recs]
    assert recs[0]["message"] == ("job failed: PyTorchJobFailed; container pytorch of pod r-t001-master-0 exited "
                                  "with 137 (OOMKilled)"), recs[0]["message"]
    healthy = {c["type"]: c for c in run["status"]["conditions"]}["TrialsHealthy"]
    assert healthy["reason"] == "JobFailed" and "exited with 137 (OOMKilled)" in healthy["message"]
    policy = next(iter(ports.jobs.values()))["spec"]["runPolicy"]
    assert policy["cleanPodPolicy"] == "Running"  # finished pods stay with the job; running ones go


def test_pytorchjob_keeps_the_template_and_sets_the_knobs():
    run = tuning_run()
    from attune.recipe.io import parse_recipe

    recipe = parse_recipe(run["spec"]["recipe"]["inline"]).with_knobs(intra_op_threads=2)
    trial = {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningTrial",
             "metadata": {"name": trial_name("r", 3), "namespace": "ml", "uid": "t-uid"},
             "spec": {"index": 3, "change": {"intra_op_threads": 2}}}
    job = build_pytorchjob(run, trial, recipe)
    assert job == build_pytorchjob(run, trial, recipe)  # deterministic
    assert job["metadata"]["name"] == "r-t003"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "t-uid"
    assert job["metadata"]["labels"] == {"attune.dev/run": "r", "attune.dev/trial": "r-t003", "attune.dev/index": "3"}
    assert job["spec"]["nprocPerNode"] == "1" and job["spec"]["runPolicy"]["backoffLimit"] == 0
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    tpl = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["nodeSelector"] == tpl["nodeSelector"]
    c = pod["containers"][0]
    assert c["image"] == tpl["containers"][0]["image"] and c["resources"] == tpl["containers"][0]["resources"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["OMP_NUM_THREADS"] == "2" and '"max_steps":62' in env["ATTUNE_TRIAL_SPEC"]


def test_promql_selects_the_trials_pods():
    m = MetricsSpec(prometheusUrl="http://p", podLabel="exported_pod")
    sel = metrics.pod_selector(m, "ml", "r.x-t001")
    assert sel == '{namespace="ml", exported_pod=~"r\\\\.x-t001-(master|worker)-[0-9]+"}'
    q = metrics.dcgm_queries(m, "ml", "r-t001", 300)
    # DCGM's labels are its own scrape's: exported_namespace/exported_pod by default, whatever podLabel says
    assert q["sm_active"] == ('avg(avg_over_time(DCGM_FI_PROF_SM_ACTIVE{exported_namespace="ml", '
                              'exported_pod=~"r-t001-(master|worker)-[0-9]+"}[300s]))')
    honored = MetricsSpec(prometheusUrl="http://p", dcgm={"podLabel": "pod", "namespaceLabel": "namespace"})
    assert '{namespace="ml", pod=~"r-t001-' in metrics.dcgm_queries(honored, "ml", "r-t001", 300)["sm_active"]
    assert q["fb_free_mib_min"].startswith("min(")
    recs = metrics.step_records([(1, 1), (2, 1), (3, 3), (4, 4)], [(1, .5), (2, .5), (3, .4), (4, .3)], 512)
    assert [r["step"] for r in recs] == [1, 3, 4] and recs[1]["step_time_s"] == .4


def test_curve_query_reads_every_step_of_rank_0_over_the_trial():
    m = MetricsSpec(prometheusUrl="http://p")
    q = metrics.curve_query(m, "ml", "r-t001", metrics.STEP_LOSS, 90.2)
    assert q == ('max by (step) (max_over_time(attune_trainer_step_loss{namespace="ml", '
                 'pod=~"r-t001-(master|worker)-[0-9]+", rank="0"}[91s]))')


def test_curve_is_complete_or_nothing():
    samples = [({"step": str(s)}, 10.0 - s) for s in (3, 1, 2)]
    assert metrics.complete_curve(samples, 3) == [9.0, 8.0, 7.0]
    assert metrics.complete_curve(samples, 4) == []  # step 4 missing
    assert metrics.complete_curve(samples[:2], 3) == []  # step 2 missing
    assert metrics.complete_curve([*samples[:2], ({"step": "2"}, float("inf"))], 3) == []
    assert metrics.complete_curve([], 0) == []


@pytest.mark.parametrize("missing", [None, 2])
def test_measure_trial_keeps_the_whole_curve_though_scrapes_sampled_few_steps(missing):
    m = MetricsSpec(prometheusUrl="http://p", warmupSteps=1, measureSteps=4, minMeasuredFraction=0.75)
    losses = {s: 5.0 - s / 10 for s in range(1, 6) if s != missing}
    prom = ScriptedPrometheus(losses, sampled=[1, 3, 5])
    meas = metrics.measure_trial(prom, m, "ml", "r-t001", 1000.0, 1010.0, tokens_per_step=512, devices=1)
    assert meas is not None and meas.steps_measured == 4 - (missing is not None) and meas.tokens_per_s == 1024
    if missing is None:
        assert meas.losses == [4.9, 4.8, 4.7, 4.6, 4.5] and meas.grad_norms == meas.losses
    else:
        assert meas.losses == [] and meas.grad_norms == []
    promql, at = prom.queries[0]
    assert at == 1010.0 + metrics.CURVE_MARGIN_S and f"[{10 + 2 * metrics.CURVE_MARGIN_S}s]" in promql


def test_measure_trial_falls_back_to_sampled_step_times():
    m = MetricsSpec(prometheusUrl="http://p", warmupSteps=1, measureSteps=4, minMeasuredFraction=0.5)
    prom = ScriptedPrometheus(dict.fromkeys(range(1, 6), 1.0), sampled=[1, 3, 5], per_step_times=False)
    meas = metrics.measure_trial(prom, m, "ml", "r-t001", 1000.0, 1010.0, tokens_per_step=512, devices=1)
    assert meas is not None and meas.steps_measured == 2 and meas.tokens_per_s == 2048 and len(meas.losses) == 5


def test_prometheus_client_errors_are_metrics_unavailable():
    with pytest.raises(MetricsUnavailable):
        metrics.PrometheusClient("http://127.0.0.1:9", timeout_s=1).query("up")


def test_runs_longer_than_the_per_step_series_cap_are_refused():
    from attune.operator.webhook import run_problems
    from attune.trainer.sinks import STEP_SERIES_CAP

    run = good_run("r", "http://p.ml.svc", None)
    assert run_problems(run) == []
    run["spec"]["metrics"]["measureSteps"] = STEP_SERIES_CAP
    assert any("per-step losses for at most" in p for p in run_problems(run))


def test_a_run_whose_policy_stops_certifies_its_best_before_it_succeeds():
    run = tuning_run()
    run["spec"]["budget"].update(maxTrials=14, acceleratorHours=5)
    ports = FakePorts()
    st = _drive(run, ports)["status"]
    assert st["phase"] == "Succeeded" and st["message"].startswith("policy stopped")
    kinds = [r["kind"] for r in records(ports, run)]
    certify = [k for k in kinds if k == "certify"]
    assert kinds[-len(certify):] == certify and len(certify) == 8  # A-B pairs after the search, within maxTrials
    best = st["best"]
    assert best["speedup"] == pytest.approx(1.6, rel=1e-3) and best["searchSpeedup"] == pytest.approx(1.6, rel=1e-3)
    assert best["speedupLow"] <= best["speedup"] <= best["speedupHigh"]
    assert "4 interleaved baseline/best pairs" in best["certification"]
    assert st["searchStopped"] == st["message"]


def test_without_room_for_a_pair_the_status_says_why_the_speedup_is_uncertified():
    st = _drive(tuning_run(), FakePorts())["status"]  # maxTrials 5: the search uses them all
    assert "speedupLow" not in st["best"] and st["best"]["certification"].startswith("not certified: max_trials (5)")
