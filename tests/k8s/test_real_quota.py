"""Issue 39, item 8: the platform's accelerator-hours quota per namespace (operator.hoursQuotas), on the real control
plane: the operator counts each charged trial once in the ledger ConfigMap of its own namespace (created, then
updated, with the chart's RBAC for it), a namespace that has spent its quota launches no new trial (Reconciling,
HoursQuotaSpent: it clears when the period ends, so not Stalled), and the webhook refuses a run asking for more hours
than are left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client

from attune.operator.quota import LEDGER
from tests.k8s.harness import NS, ROOT, Operator, wait_for
from tests.k8s.hfruns import hf_run, master_container
from tests.k8s.realcluster import Release

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def _cond(release: Release, run: str, ctype: str) -> dict:
    st = (release.run(run) or {}).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def test_the_namespaces_hours_are_counted_once_and_the_quota_is_enforced(crds, training_operator,
                                                                         tmp_path: Path) -> None:
    release = Release(crds, tmp_path, extra_sets=("operator.hoursQuotas.ml=1/month",))
    op = Operator(release, tmp_path, args=release.operator_args())
    try:
        op.start()
        run = hf_run("spend")
        crds.set_images({master_container(run["spec"]["trialTemplate"])["image"]: ROOT / "examples" / "hf-trainer"})
        crds.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)

        def ledger():
            try:
                return crds.core.read_namespaced_config_map(LEDGER, release.namespace)
            except client.exceptions.ApiException:
                return None

        # the ledger follows each step's records: created at the first charged trial, updated at the second
        cm = wait_for(lambda: (c := ledger()) is not None and len(json.loads(c.data[NS])["counted"]) >= 2 and c, 300,
                      "two charged trials in the ledger")
        entry = json.loads(cm.data[NS])
        uid = (release.run("spend") or {})["metadata"]["uid"]
        by_key = {f"{uid}/{r['id']}": r["charged_hours"] for r in release.records("spend") if r["charged_hours"] > 0}
        assert set(entry["counted"]) <= set(by_key) and len(entry["counted"]) >= 2, (entry, by_key)
        # each record counted once, with what it was charged
        assert entry["hours"] == pytest.approx(sum(by_key[k] for k in entry["counted"]), abs=1e-5), (entry, by_key)

        # other runs of the namespace spent the rest (the platform's ledger says so): no new trial
        entry["hours"] = 1.0
        cm.data[NS] = json.dumps(entry)
        crds.core.replace_namespaced_config_map(LEDGER, release.namespace, cm)
        held = wait_for(lambda: (c := _cond(release, "spend", "Reconciling")).get("reason") == "HoursQuotaSpent" and c,
                        300, "the run to hold on the spent quota")
        assert "namespace ml has 0 of its 1 accelerator-hours a month left" in held["message"], held
        assert _cond(release, "spend", "Stalled")["status"] == "False"  # the period's end clears it
        assert _cond(release, "spend", "QuotaAvailable")["reason"] == "HoursQuotaSpent"
        st = (release.run("spend") or {})["status"]
        assert st.get("currentTrial") is None and st["phase"] not in ("Succeeded", "Failed")

        # the webhook: a run asking for more hours than are left is refused, naming the quota
        more = hf_run("more")
        more["spec"]["budget"]["acceleratorHours"] = 0.05
        with pytest.raises(client.exceptions.ApiException) as refused:
            crds.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", more)
        assert refused.value.status in (403, 422) and "exceeds the accelerator-hours quota" in str(refused.value.body)
        assert "operator.hoursQuotas" in str(refused.value.body)
    finally:
        op.stop()
        for name in ("spend", "more"):
            try:
                crds.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", name)
            except client.exceptions.ApiException:
                pass
        try:
            crds.core.delete_namespaced_config_map(LEDGER, release.namespace)
        except client.exceptions.ApiException:
            pass
        release.close()
    assert not release.unexpected_denials(), release.unexpected_denials()
