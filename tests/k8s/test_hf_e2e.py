"""End to end: a TuningRun whose trial template is an ordinary HuggingFace PyTorchJob (its own image and command,
`python train.py ...` of examples/hf-trainer), against the real operator process. The stand-in training operator
runs each job's own command as local processes and keeps a kubelet-style timestamped log, served through the
(emulated) API as the master pod's log: step times and losses come from there, not from Prometheus."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from tests.k8s.harness import NS
from tests.k8s.hfruns import finished, hf_run, master_container

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[2]


def test_hf_trial_template_run_to_succeeded_measured_from_pod_logs(kube, operator, kubeflow, prometheus):
    t0 = time.monotonic()
    run = hf_run("hf")
    template = master_container(run["spec"]["trialTemplate"])
    kubeflow.images[template["image"]] = ROOT / "examples" / "hf-trainer"  # what the image holds in /app
    assert (ROOT / "examples" / "hf-trainer" / "train.py").exists()
    kube.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    done = finished(kube, "hf", 420, 0.5)
    elapsed = time.monotonic() - t0
    status = done["status"]
    records = kube.records("hf")
    print(status.get("message"), kubeflow.errors)
    assert status["phase"] == "Succeeded", (status.get("message"), operator.log()[-3000:])
    assert not kubeflow.errors, kubeflow.errors
    launched = [r for r in records if r["outcome"] != "refused" and r["kind"] != "loss_check"]
    names = [f"hf-t{r['id']:03d}" for r in launched]
    assert sorted(kubeflow.launched) == sorted(names)
    # the recipe was imported from the template's own command line
    base = status["baselineRecipe"]
    assert base["framework"] == "hf" and base["launch"]["argv"] == template["command"] + template["args"]

    # every trial's job kept the template's image and command; the knob change went into its args
    for name, rec in zip(names, launched, strict=True):
        job = kubeflow.specs[name]
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

    # step times came from the pod logs: no Prometheus target was ever given for these jobs
    assert not kubeflow.scraped and not list(prometheus.sd_dir.glob("hf-*.json"))
    for r in launched:
        if r["outcome"] == "succeeded":
            m = r["measurement"]
            assert "log of its master pod" in r["message"]
            assert m["steps_measured"] == 3 and m["tokens_per_s_per_device"] > 0
            assert len(m["losses"]) == 4 and all(math.isfinite(v) and 0 < v < 20 for v in m["losses"]), m["losses"]
            assert 0 < r["wall_s"] < 240 and r["charged_hours"] == pytest.approx(r["wall_s"] / 3600, rel=1e-6)
        log = (kubeflow.workdir / f"hf-t{r['id']:03d}" / "kubelet.log").read_text()
        assert "'loss':" in log
    assert [r["kind"] for r in records[:2]] == ["baseline", "baseline"]
    assert all(r["outcome"] == "succeeded" for r in records[:2])

    # the operator stopped each measured job (they would train to max_steps 100000): no process is left
    assert all(not kubeflow.alive(n) for n in names)
    assert not [j for j in kube.jobs() if (j.get("status") or {}).get("conditions", [{}])[-1].get("type") == "Running"]

    # the candidate (per-device batch 1 → 2, accumulation 16 → 8) owed the loss check: it ran on the HF logged losses
    cand = next(r for r in records if r["kind"] == "candidate")
    assert cand["change"] == {"per_device_train_batch_size": 2} and "loss_equivalence" in cand["verdict"]["owed"]
    checks = [r for r in records if r["kind"] == "loss_check"]
    assert checks, "the candidate's loss check never ran"
    check = checks[0]["loss_check"]
    print("loss check:", checks[0]["decision"], check)
    assert check is not None and check["drift_runs"] >= 2 and check["passed"] is True, checks[0]
    assert status["budget"]["hoursUsed"] == pytest.approx(sum(r["charged_hours"] for r in records), abs=1e-6)
    print(f"\nhf e2e: {len(launched)} trials, {elapsed:.1f} s, best {status['best']}")
