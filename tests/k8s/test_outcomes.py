"""Issue 39, item 14: each way a run ends has its own reason (``status.outcome``, the reason on Ready and Tuned), and
Stalled is True only where someone must change something; the README's table names every reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attune.operator.health import argocd_health, kstatus
from attune.operator.outcomes import HOLDS, RunOutcome
from tests.k8s.fakes import FakePorts, conds, drive, records, step, tuning_run, waited_out

pytestmark = pytest.mark.k8s
README = Path(__file__).resolve().parents[2] / "README.md"


def _ended(run):
    st = run["status"]
    c = conds(run)
    return st["phase"], st.get("outcome"), c["Ready"]["reason"], c["Tuned"]["reason"], c["Stalled"]["status"]


def _room(run):
    run["spec"]["budget"].update(maxTrials=14, acceleratorHours=5)  # room for the certification pairs
    return run


def test_a_certified_gain_an_uncertified_one_and_none_are_told_apart():
    gain = drive(_room(tuning_run()), FakePorts())
    found = drive(tuning_run(), FakePorts())  # maxTrials 5: the search uses them all, no pair certifies
    flat_ports = FakePorts()
    flat_ports.tps = dict.fromkeys(flat_ports.tps, 100.0)  # no knob changes the speed
    flat = drive(_room(tuning_run()), flat_ports)
    assert _ended(gain) == ("Succeeded", "GainCertified", "GainCertified", "GainCertified", "False")
    assert _ended(found) == ("Succeeded",) + ("GainNotCertified",) * 3 + ("False",)
    assert _ended(flat) == ("Succeeded", "NoGainShown", "NoGainShown", "NoGainShown", "False")
    assert gain["status"]["best"]["speedupLow"] > 1 and "speedupLow" not in found["status"]["best"]
    assert flat["status"]["best"]["speedup"] == pytest.approx(1.0)
    # all are Healthy to Argo CD and Current to kstatus: finishing without a gain is not a failure
    assert {argocd_health(r)["status"] for r in (gain, found, flat)} == {"Healthy"}
    assert {kstatus(r) for r in (gain, found, flat)} == {"Current"}


def test_stopping_to_wait_for_accelerators_after_the_baseline_is_its_own_outcome():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 300

    def after_the_baselines(p):
        p.finish()
        if sum(r["kind"] == "baseline" and r["outcome"] == "succeeded" for r in records(p, run)) >= 2:
            p.pods_running = False  # the accelerators are gone: the next trial's pods never run

    run = drive(run, ports, each=after_the_baselines)
    assert _ended(run) == ("Succeeded", "StoppedWaiting", "StoppedWaiting", "StoppedWaiting", "False")
    assert "stopped waiting for accelerators" in run["status"]["message"]


def test_waiting_with_no_baseline_fails_as_stopped_waiting_not_as_no_baseline():
    ports = FakePorts()
    run = waited_out(ports)
    assert _ended(run) == ("Failed", "StoppedWaiting", "StoppedWaiting", "StoppedWaiting", "True")


def test_no_samples_and_no_baseline_are_their_own_outcomes():
    ports = FakePorts()
    ports.missing_points = True
    lost = drive(tuning_run(), ports)
    assert lost["status"]["outcome"] == "NoSamples" and conds(lost)["Stalled"]["reason"] == "NoSamples"
    failing = drive(tuning_run(), FakePorts(), each=lambda p: p.finish(ok=False, reason="Error"))
    assert failing["status"]["outcome"] == "NoBaseline" and "baseline recipe itself fails" in failing["status"]["message"]
    assert failing["status"]["phase"] == "Failed" and conds(failing)["Stalled"]["status"] == "True"


def test_a_hold_that_needs_a_change_stalls_and_one_that_clears_does_not():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["metrics"]["prometheus"] = {"bearerTokenSecretRef": {"name": "prom-token", "key": "token"}}
    run["spec"]["metrics"]["prometheusUrl"] = "https://prom.ml.svc"
    for _ in range(3):
        step(run, ports)
        ports.finish()
    c = conds(run)
    assert c["Stalled"]["status"] == "True" and c["Stalled"]["reason"] == "SecretNotFound", c["Stalled"]
    assert kstatus(run) == "Failed" and argocd_health(run)["status"] == "Degraded"
    ports.secrets[("prom-token", "token")] = "t"  # someone created it: the run goes on
    step(run, ports)
    assert conds(run)["Stalled"]["status"] == "False"

    ports = FakePorts(measure_error=True)  # Prometheus down: clears by itself
    run = tuning_run()
    for _ in range(3):
        step(run, ports)
        ports.finish()
    c = conds(run)
    assert c["Stalled"]["status"] == "False" and c["Reconciling"]["reason"] == "PrometheusUnreachable"
    assert kstatus(run) == "InProgress" and argocd_health(run)["status"] == "Progressing"


def test_the_readme_documents_every_outcome_and_hold():
    text = README.read_text()
    table = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", text, re.M)}
    assert {o.value for o in RunOutcome} <= table, {o.value for o in RunOutcome} - table
    assert set(HOLDS) <= table, set(HOLDS) - table


def test_max_trials_is_a_hard_cap_even_while_a_decision_is_inconclusive():
    """maxTrials is "stop after this many launched trials": a noisy candidate's paired runs used to go on past it
    (HF's run_clm.py on the real control plane: maxTrials 6, 11 trials launched, the decision inconclusive)."""
    import random

    rng = random.Random(3)
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["budget"].update(maxTrials=6, acceleratorHours=5)

    def noisy(p):
        for knob in p.tps:  # 25 % run-to-run noise: no decision settles in a pair
            p.tps[knob] = 100.0 * rng.uniform(0.75, 1.25) * (1.1 if knob != "full" else 1.0)
        p.finish()

    run = drive(run, ports, each=noisy)
    launched = [r for r in records(ports, run) if r["kind"] not in ("loss_check", "decision")  # launch nothing
                and r["outcome"] != "refused"]
    assert len(launched) <= 6, [(r["id"], r["kind"], r["decision"]) for r in launched]
    assert run["status"]["phase"] == "Succeeded" and "max_trials (6)" in run["status"]["message"]
