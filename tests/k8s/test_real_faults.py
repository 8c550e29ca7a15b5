"""API faults on the real API server, where the emulator injected them itself: the real operator (the chart's
arguments, its ServiceAccount's token) reaches kube-apiserver through :mod:`tests.k8s.faultproxy`, which forwards
everything and injects the faults a real cluster shows: a watch cut and resumed from a resourceVersion the server no
longer holds (410 Expired), a discovery outage of an aggregated or unready API group (503), API priority and fairness
throttling a create (429 with Retry-After). The proxy's own checks come first: a watch passes through as the API
server sends it, and it serves and dials loopback only.

No training operator runs here: a trial's PyTorchJob is created and stays unstarted, which is all these need."""

from __future__ import annotations

import json
import re
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from attune.operator.kube import REQUEST_TIMEOUT_S
from tests.k8s.faultproxy import (
    Answer,
    CutWatch,
    Delay,
    Expire,
    FaultProxy,
    FaultProxyError,
    Rule,
    kubeconfig_token,
)
from tests.k8s.harness import NS, Operator, wait_for
from tests.k8s.hfruns import hf_example_run
from tests.k8s.realcluster import ControlPlane, Release

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

RUNS = ("attune.dev", "v1alpha1", NS, "tuningruns")
RUNS_PATH = rf"^/apis/attune\.dev/v1alpha1/namespaces/{NS}/tuningruns$"
JOBS_PATH = rf"^/apis/kubeflow\.org/v1/namespaces/{NS}/pytorchjobs$"


@pytest.fixture()
def viewer(control_plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """A namespace of its own and a bearer token allowed to read everything (its ServiceAccount bound to
    cluster-admin for the test): requests the proxy can carry. Both go when the test ends."""
    cp = control_plane
    ns = cp.namespace("proxy")
    rbac = client.RbacAuthorizationV1Api(cp.api)
    rbac.create_cluster_role_binding({"metadata": {"name": ns}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]})
    try:
        token = wait_for(lambda: _token(cp, ns), 30, f"the ServiceAccount controller to create {ns}/default")
        yield ns, token
    finally:
        rbac.delete_cluster_role_binding(ns)
        cp.delete_namespace(ns)


def _token(cp: ControlPlane, ns: str) -> str | None:
    try:
        return cp.token(ns, "default", seconds=600)
    except client.exceptions.ApiException as err:
        if err.status == 404:
            return None
        raise


def _admin_http(cp: ControlPlane) -> httpx.Client:
    """Straight to the API server, as the admin (its client certificate)."""
    pki = cp.state / "pki"
    tls = ssl.create_default_context(cafile=pki / "ca.crt")
    tls.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    return httpx.Client(base_url=cp.url, verify=tls, timeout=30)


def _via(proxy: FaultProxy, token: str) -> httpx.Client:
    return httpx.Client(base_url=proxy.url, verify=ssl.create_default_context(cafile=proxy.ca),
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _events(http: httpx.Client, path: str, **params: str) -> list[dict[str, Any]]:
    """Every event of a watch that ends by itself (``timeoutSeconds``, or the server ending it). While a new CRD's
    watch cache fills, kube-apiserver answers 429 ``storage is (re)initializing`` (Retry-After 1): asked again."""

    def watch() -> tuple[list[dict[str, Any]]] | None:
        resp = http.get(path, params={"watch": "true", **params})
        if resp.status_code == 429 and "initializing" in resp.text:
            return None
        assert resp.status_code == 200, resp.text
        return ([json.loads(line) for line in resp.text.splitlines() if line.strip()],)

    return wait_for(watch, 30, f"a watch of {path}", interval=0.5)[0]


def _cond(release: Release, name: str, ctype: str) -> dict[str, Any]:
    run = release.run(name) or {}
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _status(release: Release, name: str) -> dict[str, Any]:
    return (release.run(name) or {}).get("status") or {}


# -- the proxy itself ----------------------------------------------------------------------------------------------

def test_a_watch_passes_through_the_proxy_as_the_api_server_sends_it(control_plane: ControlPlane, proxy: FaultProxy,
                                                                     viewer: tuple[str, str]) -> None:
    cp, (ns, token) = control_plane, viewer
    path = f"/api/v1/namespaces/{ns}/configmaps"
    admin, via = _admin_http(cp), _via(proxy, token)
    listed = admin.get(path)
    assert listed.status_code == 200, listed.text
    since = listed.json()["metadata"]["resourceVersion"]
    core = client.CoreV1Api(cp.api)
    for i in range(3):
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"cm{i}"}, "data": {"i": str(i)}})
    core.patch_namespaced_config_map("cm1", ns, {"data": {"i": "one"}})
    core.delete_namespaced_config_map("cm2", ns)
    # the same history, replayed from the cache by both: every event whole, in the server's order
    direct = _events(admin, path, resourceVersion=since, timeoutSeconds="1")
    proxied = _events(via, path, resourceVersion=since, timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in direct] == [
        ("ADDED", "cm0"), ("ADDED", "cm1"), ("ADDED", "cm2"), ("MODIFIED", "cm1"), ("DELETED", "cm2")]
    assert proxied == direct
    # live: an event arrives through the proxy while the stream is still open (passed on as it comes, not held until
    # the stream ends); the API server ends the stream itself after timeoutSeconds
    seen: list[dict[str, Any]] = []
    live = _via(proxy, token)
    since = direct[-1]["object"]["metadata"]["resourceVersion"]

    def read() -> None:
        with live.stream("GET", path, params={"watch": "true", "resourceVersion": since,
                                              "timeoutSeconds": "5"}) as resp:
            for line in resp.iter_lines():
                if line.strip():
                    seen.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stream = wait_for(lambda: next(iter(proxy.seen(watch=True, ended=None)), None), 5, "the live watch to open")
    core.create_namespaced_config_map(ns, {"metadata": {"name": "live"}})
    wait_for(lambda: seen, 5, "the live event through the proxy")
    assert stream.ended is None and stream.events == ["ADDED"]  # the stream goes on
    reader.join(15)
    assert not reader.is_alive()
    wait_for(lambda: stream.ended, 5, "the proxy to note the stream's end")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == [("ADDED", "live")]
    assert [e.status for e in proxy.seen(watch=True)] == [200, 200]  # the replay and the live one


def test_the_proxy_serves_and_dials_loopback_only(control_plane: ControlPlane, tmp_path: Path) -> None:
    pki = control_plane.state / "pki"
    with pytest.raises(FaultProxyError, match=r"listens on loopback addresses only: '0\.0\.0\.0' is not one"):
        FaultProxy(control_plane.url, pki, tmp_path, host="0.0.0.0")
    with pytest.raises(FaultProxyError, match=r"dials loopback addresses only: '10\.0\.0\.1' is not one"):
        FaultProxy("https://10.0.0.1:6443", pki, tmp_path)
    with pytest.raises(FaultProxyError, match=r"dials loopback addresses only: 'kubernetes\.default' is not one"):
        FaultProxy("https://kubernetes.default:443", pki, tmp_path)
    with pytest.raises(FaultProxyError, match=r"upstream must be https://127\.0\.0\.1:<port>"):
        FaultProxy("http://127.0.0.1:6443", pki, tmp_path)


# -- 410: a watch resumed from a resourceVersion the server no longer holds ------------------------------------------

def test_the_real_api_server_expires_a_watch_older_than_it_holds_and_the_proxy_answers_alike(
        crds: ControlPlane, proxy: FaultProxy, viewer: tuple[str, str]) -> None:
    """kube-apiserver serves watches from its watch cache, which holds the runs' history since the CRD was served: a
    watch from an older resourceVersion gets 200 and one ERROR event, a Status 410 Expired, then the stream ends.
    (A version the operator really held expires once the cache drops it: after at least 75 s of history, too slow to
    wait for here.) The proxy's Expire answers in that shape, which the next test gives the operator."""
    _, token = viewer
    path = "/apis/attune.dev/v1alpha1/namespaces/default/tuningruns"
    real = _events(_admin_http(crds), path, resourceVersion="1", allowWatchBookmarks="true")
    assert [e["type"] for e in real] == ["ERROR"], real
    status = real[0]["object"]
    assert (status["kind"], status["status"], status["reason"], status["code"]) == ("Status", "Failure", "Expired",
                                                                                      410), status
    assert re.fullmatch(r"too old resource version: 1 \(\d+\)", status["message"]), status
    expire = proxy.add(Rule(Expire(), watch=True, path=path + "$", times=1))
    faked = _events(_via(proxy, token), path, resourceVersion="1", allowWatchBookmarks="true")
    assert expire.hits == 1 and [e["type"] for e in faked] == ["ERROR"]
    assert faked[0]["object"].keys() == status.keys()
    assert {k: v for k, v in faked[0]["object"].items() if k != "message"} == \
        {k: v for k, v in status.items() if k != "message"}
    assert re.fullmatch(r"too old resource version: 1 \(\d+\)", faked[0]["object"]["message"])


def test_kopf_relists_after_its_watch_expires_and_the_operator_reconciles_runs_created_after(
        release: Release, proxy: FaultProxy, proxied_operator: Operator) -> None:
    """kopf's watch of the runs is cut after one event and resumed from that event's version, which the server no
    longer holds: kopf must list the runs again and watch from the list's version, or runs created from then on would
    never be reconciled."""
    token = kubeconfig_token(release.operator_kubeconfig)
    runs_watch: dict[str, Any] = {"method": "GET", "path": RUNS_PATH, "watch": True, "token": token}
    cut = proxy.add(Rule(CutWatch(after_events=1), times=1, **runs_watch))  # the connection drops after one event
    expire = proxy.add(Rule(Expire(), times=1, **runs_watch))  # and the version it resumes from is gone
    proxied_operator.start()
    first = wait_for(lambda: next(iter(proxy.seen(rule=0)), None), 30, "the operator's watch of the runs")
    release.custom.create_namespaced_custom_object(*RUNS, hf_example_run("before"))
    resumed = wait_for(lambda: next((e for e in proxy.seen(rule=1) if e.ended), None), 30,
                       "the operator to resume its watch once cut (and be told its version expired)")
    assert cut.hits == expire.hits == 1 and len(first.events) == 1 and first.last_resource_version
    assert resumed.query.get("resourceVersion") == first.last_resource_version and resumed.events == ["ERROR"]

    def after(e: Any, method: str = "GET", watch: bool = False) -> Any:
        return next((x for x in proxy.seen(method=method, watch=watch, token=token) if x.at > e.at and
                     re.search(RUNS_PATH, x.path)), None)

    # kopf lists the runs again and watches from the list's version, untouched by any fault
    relist = wait_for(lambda: after(resumed), 30, "kopf to list the runs again")
    rewatch = wait_for(lambda: after(relist, watch=True), 30, "kopf to watch the runs again")
    assert relist.status == 200 and rewatch.rule is None and rewatch.status == 200
    assert rewatch.query.get("resourceVersion")  # from the new list's version
    release.custom.create_namespaced_custom_object(*RUNS, hf_example_run("after"))
    wait_for(lambda: "ADDED" in rewatch.events, 30, "the new run's event on the renewed watch")
    st = wait_for(lambda: (s := _status(release, "after")).get("phase") and s.get("currentTrial") and s, 60,
                  "the operator to reconcile the run created after the watch expired")
    assert st["phase"] not in ("Failed", "Pending"), st
    wait_for(lambda: any(t["spec"]["runRef"] == "after" for t in release.trials()), 30, "the new run's trial")
    before = wait_for(lambda: _status(release, "before").get("phase"), 30, "the run seen before the fault reconciled")
    assert before != "Failed"
    assert "Error in the watch-stream" not in proxied_operator.log()  # kopf's fatal WatchingError: the 410 was understood


# -- 503 and 429 ---------------------------------------------------------------------------------------------------

def test_a_discovery_outage_at_start_is_waited_out_not_a_missing_crd(release: Release, proxy: FaultProxy,
                                                                     proxied_operator: Operator) -> None:
    token = kubeconfig_token(release.operator_kubeconfig)
    outage = proxy.add(Rule(Answer(503), method="GET", path=r"^/apis/kubeflow\.org/v1/?$", token=token))
    proxied_operator.start()
    release.custom.create_namespaced_custom_object(*RUNS, hf_example_run("disc"))
    cond = wait_for(lambda: (c := _cond(release, "disc", "BackendAvailable")) and c, 60, "a BackendAvailable condition")
    assert cond["status"] == "False" and cond["reason"] == "DiscoveryUnavailable", cond
    assert "503" in cond["message"] and "the server is currently unable to handle the request" in cond["message"]
    assert outage.hits >= 1 and _status(release, "disc")["phase"] != "Failed" and not release.jobs()
    # it clears by itself: Reconciling names it; Stalled, which Flux reads as failed, stays False (issue 39, item 14)
    held = wait_for(lambda: (c := _cond(release, "disc", "Reconciling")).get("reason") == "DiscoveryUnavailable" and c,
                    30, "Reconciling=True DiscoveryUnavailable")
    assert held["status"] == "True" and _cond(release, "disc", "Stalled")["status"] == "False"
    proxy.clear()
    wait_for(release.jobs, 60, "the trial's job once discovery answers")
    wait_for(lambda: _cond(release, "disc", "BackendAvailable").get("status") == "True", 30, "BackendAvailable=True")
    assert _status(release, "disc")["phase"] != "Failed"


def test_a_throttled_job_create_is_retried_after_retry_after_and_the_run_goes_on(release: Release,
                                                                                 proxy: FaultProxy,
                                                                                 proxied_operator: Operator) -> None:
    token = kubeconfig_token(release.operator_kubeconfig)
    throttle = proxy.add(Rule(Answer(429, retry_after=3), method="POST", path=JOBS_PATH, token=token, times=1))
    proxied_operator.start()
    release.custom.create_namespaced_custom_object(*RUNS, hf_example_run("busy"))
    job = wait_for(lambda: next(iter(release.jobs()), None), 60, "the trial's job, created after the 429")

    def answered_creates() -> list[Any] | None:
        creates = [c for c in proxy.seen(method="POST", token=token) if re.search(JOBS_PATH, c.path)]
        return creates if creates and creates[-1].status else None

    creates = wait_for(answered_creates, 10, "the create's answer")
    assert throttle.hits == 1 and [c.status for c in creates] == [429, 201], creates
    assert creates[1].at - creates[0].at >= 3, "the operator created the job again before Retry-After"
    trial = next(t for t in release.trials() if t["spec"]["runRef"] == "busy")
    assert job["metadata"]["ownerReferences"][0]["uid"] == trial["metadata"]["uid"]
    # a throttled create is not a refusal: nothing counted against the trial, nothing recorded, the run not failed
    assert not ((trial.get("status") or {}).get("jobCreate") or {}).get("refusals")
    assert not release.records("busy")
    assert _status(release, "busy")["phase"] != "Failed"
    assert not _cond(release, "busy", "JobsAccepted") or _cond(release, "busy", "JobsAccepted")["status"] == "True"


# -- a request the API server never answers ------------------------------------------------------------------------

def test_a_stalled_request_is_given_up_and_the_run_goes_on(release: Release, proxy: FaultProxy,
                                                           proxied_operator: Operator) -> None:
    """A connection accepted and never answered (an API server or a load balancer stalled): the operator's read of
    the run gives up after its request timeout and is tried again, instead of holding the run's step for ever."""
    token = kubeconfig_token(release.operator_kubeconfig)
    path = rf"^/apis/attune\.dev/v1alpha1/namespaces/{NS}/tuningruns/stalled$"
    stall = proxy.add(Rule(Delay(3600), method="GET", path=path, token=token, times=1))
    proxied_operator.start()
    release.custom.create_namespaced_custom_object(*RUNS, hf_example_run("stalled"))
    wait_for(lambda: stall.hits, 30, "the operator's read of the run (it stalls)")
    st = wait_for(lambda: (s := _status(release, "stalled")).get("phase") and s, REQUEST_TIMEOUT_S[1] + 30,
                  "the run to be reconciled once the stalled read is given up")
    assert st["phase"] != "Failed", st
    stalled = proxy.seen(rule=0)[0]
    again = next(e for e in proxy.seen(method="GET", token=token) if e.path == stalled.path and e.at > stalled.at)
    assert stalled.ended is None and again.status == 200  # the stalled one still hangs: the operator moved on
    assert again.at - stalled.at >= REQUEST_TIMEOUT_S[1] - 1, "given up before the request timeout"
