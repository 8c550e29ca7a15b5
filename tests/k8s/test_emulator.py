"""The emulated API server behaves as a real one where the operator's tests rely on it: the promise kopf's
list-then-watch relies on (a watch started from a list's resourceVersion sends every object the list did not hold,
even a create that raced the list for the store's lock); apimachinery's validation of names, labels, annotations and
selectors; builtin and CRD schemas (pruning, defaulting, the status subresource); RBAC for the operator's
ServiceAccount in each install mode of the chart; injected faults; and webhook timeouts."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import httpx
import kmock
import pytest
import yaml
from kubernetes import client

from tests.k8s.conftest import ROOT, good_run
from tests.k8s.harness import NS, KubeAPI, free_port
from tests.k8s.kmock_plus import KubernetesEmulatorPlus
from tests.k8s.rbac import OPERATOR_USER

pytestmark = [pytest.mark.k8s,
              pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")]  # kmock's own


async def _until(cond: Callable[[], bool], what: str, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _waiting(lock: asyncio.Lock) -> int:
    return len(lock._waiters or ())  # noqa: SLF001 - the only way to see who queues on the emulator's store


@pytest.mark.asyncio
async def test_a_create_racing_a_list_is_sent_by_the_watch_from_the_lists_version():
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v1/namespaces/{NS}/configmaps"
    async with KubernetesEmulatorPlus() as emu, kmock.Server(emu, host="127.0.0.1", port=port), \
            aiohttp.ClientSession() as http:
        emu.resources.load_bundled()
        lock = emu._lock  # noqa: SLF001 - the store's lock, held by a write while its event is delivered
        await lock.acquire()
        listing = asyncio.create_task(http.get(base))
        await _until(lambda: _waiting(lock) == 1, "the list to queue on the store")
        lock.release()  # kmock's request handler takes the lock once before the list's snapshot takes it again:
        await lock.acquire()  # hold it again, so that the list waits to take its snapshot
        await _until(lambda: _waiting(lock) == 1, "the list to queue for its snapshot")
        creating = asyncio.create_task(http.post(base, json={"metadata": {"name": "late"}, "data": {}}))
        await _until(lambda: _waiting(lock) == 2, "the create to queue behind it")
        lock.release()
        listed = await (await listing).json()
        assert (await creating).status == 201
        assert [o["metadata"]["name"] for o in listed["items"]] == []  # the list came first: it cannot hold it
        since = listed["metadata"]["resourceVersion"]
        async with http.get(base, params={"watch": "true", "resourceVersion": since, "timeoutSeconds": "1"}) as resp:
            events = [json.loads(line) for line in (await resp.text()).splitlines() if line.strip()]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "late")]


# --- the emulated API server is as strict as a real one: through the official client, as the operator talks to it

RUNS = ("attune.dev", "v1alpha1", NS, "tuningruns")


@pytest.fixture(scope="module", params=["namespaced", "cluster"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    api = KubeAPI(tmp_path_factory.mktemp(f"emu-{request.param}"), install=request.param)
    yield api
    api.close()


@pytest.fixture()
def kapi(cluster: KubeAPI):
    cluster.clear_faults()
    return cluster


def _refused(call, *args, **kwargs) -> client.exceptions.ApiException:
    with pytest.raises(client.exceptions.ApiException) as err:
        call(*args, **kwargs)
    return err.value


def _cm(name: str, labels: dict | None = None, annotations: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}, "data": {"a": "b"}}


def _run(name: str) -> dict:
    return good_run(name, "http://127.0.0.1:9", None, suspend=True)  # loopback: a host the operator may fetch


def _body(err: client.exceptions.ApiException) -> dict:
    return json.loads(err.body)


def _raw(api: client.ApiClient, method: str, path: str, body: dict | None = None,
         query: list[tuple[str, str]] | None = None) -> dict:
    """A request the typed API has no method for (discovery, a query parameter it does not send), through the client."""
    params = api.param_serialize(method=method, resource_path=path, query_params=query or [], body=body,
                                 header_params={"Content-Type": "application/json", "Accept": "application/json"},
                                 auth_settings=["BearerToken"])
    resp = api.call_api(*params)
    resp.read()
    return api.response_deserialize(resp, {"2XX": "object"}).data


def _msg(err: client.exceptions.ApiException) -> str:
    return str(_body(err)["message"])


class TestValidation:
    """apimachinery's checks of metadata, in its words (422 Invalid), and the schemas of builtin and custom kinds."""

    def test_a_label_value_of_64_characters_is_refused_63_accepted(self, kapi):
        core = client.CoreV1Api(kapi.api)
        err = _refused(core.create_namespaced_config_map, NS, _cm("long-label", {"app": "x" * 64}))
        assert err.status == 422 and _body(err)["reason"] == "Invalid"
        assert _body(err)["message"] == (f'ConfigMap "long-label" is invalid: metadata.labels: Invalid value: '
                                         f'"{"x" * 64}": must be no more than 63 characters')
        core.create_namespaced_config_map(NS, _cm("label-63", {"app": "x" * 63}))
        err = _refused(core.patch_namespaced_config_map, "label-63", NS, {"metadata": {"labels": {"app": "y" * 64}}})
        assert err.status == 422  # a patch is checked on the object it would store
        assert core.read_namespaced_config_map("label-63", NS).metadata.labels == {"app": "x" * 63}

    def test_an_invalid_label_key_and_annotation_key_are_refused(self, kapi):
        core = client.CoreV1Api(kapi.api)
        err = _refused(core.create_namespaced_config_map, NS, _cm("bad-key", {"-bad": "v"}))
        assert err.status == 422 and "metadata.labels: Invalid value: \"-bad\": name part must consist of" in _msg(err)
        err = _refused(core.create_namespaced_config_map, NS, _cm("bad-key", {"a/b/c": "v"}))
        assert err.status == 422 and "a qualified name must consist of" in _msg(err)
        err = _refused(core.create_namespaced_config_map, NS, _cm("bad-ann", annotations={"Bad Key": "v"}))
        assert err.status == 422 and "metadata.annotations: Invalid value: \"Bad Key\"" in _msg(err)
        err = _refused(core.create_namespaced_config_map, NS, _cm("big-ann", annotations={"a": "x" * 262144}))
        assert err.status == 422 and "metadata.annotations: Too long: may not be more than 262144 bytes" in _msg(err)
        core.create_namespaced_config_map(NS, _cm("good-keys", {"example.com/Name_1": "v"}, {"x.io/A": "y"}))

    def test_invalid_names_are_refused(self, kapi):
        core = client.CoreV1Api(kapi.api)
        err = _refused(core.create_namespaced_config_map, NS, _cm("Bad_Name"))
        assert err.status == 422 and 'ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a ' \
            "lowercase RFC 1123 subdomain must consist of" in _msg(err)
        err = _refused(kapi.custom.create_namespaced_custom_object, *RUNS, _run("Bad_Run"))
        assert err.status == 422 and 'TuningRun.attune.dev "Bad_Run" is invalid: metadata.name' in _msg(err)
        err = _refused(core.create_namespace, {"metadata": {"name": "a.b"}})  # a Namespace's name is a DNS label
        assert err.status == 422 and "a lowercase RFC 1123 label must consist of" in _msg(err)
        core.create_namespaced_config_map(NS, _cm("a.b"))  # a ConfigMap's may be a subdomain
        made = core.create_namespaced_config_map(NS, {"metadata": {"generateName": "gen-"}, "data": {}})
        assert made.metadata.name.startswith("gen-") and len(made.metadata.name) == 9

    def test_an_invalid_label_selector_is_a_bad_request(self, kapi):
        core = client.CoreV1Api(kapi.api)
        core.create_namespaced_config_map(NS, _cm("sel-a", {"sel": "a", "tier": "x"}))
        core.create_namespaced_config_map(NS, _cm("sel-b", {"sel": "b"}))
        for selector, words in ((f"app={'v' * 64}", "must be no more than 63 characters"),
                                ("app in ()", "values set can't be empty"), ("app b", "expected: in, notin"),
                                ("-app=x", "name part must consist of")):
            err = _refused(core.list_namespaced_config_map, NS, label_selector=selector)
            assert err.status == 400 and _body(err)["reason"] == "BadRequest" and words in _msg(err), selector
        def names(selector):
            return {c.metadata.name for c in core.list_namespaced_config_map(NS, label_selector=selector).items}
        assert names("sel in (a,b),!tier") == {"sel-b"}
        assert names("sel=a,tier") == {"sel-a"}
        assert names("sel notin (a)") >= {"sel-b"} and "sel-a" not in names("sel notin (a)")
        assert names("sel!=a,sel") == {"sel-b"}

    def test_an_object_violating_its_schema_is_refused(self, kapi):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad-port"},
               "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": "http"}]}]}}
        err = _refused(_raw, kapi.api, "POST", f"/api/v1/namespaces/{NS}/pods", pod)
        assert err.status == 422 and "spec.containers[0].ports[0].containerPort in body must be of type integer" \
            in _msg(err)
        err = _refused(_raw, kapi.api, "POST", f"/api/v1/namespaces/{NS}/pods", {
            "metadata": {"name": "no-name"}, "spec": {"containers": [{"image": "i"}]}})
        assert err.status == 422 and "spec.containers[0].name: Required value" in _msg(err)
        run = _run("bad-budget")
        run["spec"]["budget"]["maxTrials"] = "many"
        err = _refused(kapi.custom.create_namespaced_custom_object, *RUNS, run)
        assert err.status == 422 and 'spec.budget.maxTrials: Invalid value: "string": spec.budget.maxTrials in body ' \
            "must be of type integer" in _msg(err)
        del run["spec"]["budget"]
        err = _refused(kapi.custom.create_namespaced_custom_object, *RUNS, run)
        assert err.status == 422 and "spec.budget: Required value" in _msg(err)

    def test_a_tuningrun_is_pruned_and_defaulted_by_its_crd_schema(self, kapi):
        run = _run("pruned")
        run["spec"]["unknownField"] = {"x": 1}
        run["spec"]["budget"]["typo"] = 3
        run["spec"]["recipe"]["inline"]["extra"] = "kept"  # x-kubernetes-preserve-unknown-fields
        run["spec"]["budget"].pop("maxFailedTrials", None)
        made = kapi.custom.create_namespaced_custom_object(*RUNS, run)
        assert "unknownField" not in made["spec"] and "typo" not in made["spec"]["budget"]
        assert made["spec"]["recipe"]["inline"]["extra"] == "kept"
        assert made["spec"]["budget"]["maxFailedTrials"] == 3  # the schema's default
        strict = copy.deepcopy(run)
        strict["metadata"]["name"] = "strict"
        err = _refused(_raw, kapi.api, "POST", f"/apis/attune.dev/v1alpha1/namespaces/{NS}/tuningruns", strict,
                       [("fieldValidation", "Strict")])
        assert err.status == 400 and 'unknown field "spec.unknownField"' in _msg(err)

    def test_the_crds_cel_rules_refuse_an_update(self, kapi):
        kapi.custom.create_namespaced_custom_object(*RUNS, _run("cel"))
        err = _refused(kapi.custom.patch_namespaced_custom_object, *RUNS, "cel", {"spec": {"searchSpace": ["x"]}})
        assert err.status == 422 and _msg(err).startswith('TuningRun.attune.dev "cel" is invalid: spec: Invalid '
                                                          'value: "object": spec.searchSpace is frozen once the run')
        err = _refused(kapi.custom.patch_namespaced_custom_object, *RUNS, "cel",
                       {"spec": {"budget": {"acceleratorHours": 0.001}}})
        assert err.status == 422 and "spec.budget.acceleratorHours may only increase" in _msg(err)
        kapi.custom.patch_namespaced_custom_object(*RUNS, "cel", {"spec": {"budget": {"acceleratorHours": 9.0}}})

    def test_the_status_subresource_splits_status_from_the_rest(self, kapi):
        run = _run("split")
        run["status"] = {"phase": "Succeeded"}
        made = kapi.custom.create_namespaced_custom_object(*RUNS, run)
        assert "status" not in made  # a create cannot set the status
        kapi.custom.patch_namespaced_custom_object_status(*RUNS, "split", {"status": {"phase": "Tuning"},
                                                                          "spec": {"suspend": False}})
        after = kapi.run("split")
        assert after["status"]["phase"] == "Tuning" and after["spec"]["suspend"] is True
        gen = after["metadata"]["generation"]
        kapi.custom.patch_namespaced_custom_object(*RUNS, "split", {"status": {"phase": "Failed"},
                                                                   "spec": {"suspend": False}})
        after = kapi.run("split")
        assert after["status"]["phase"] == "Tuning" and after["spec"]["suspend"] is False
        assert after["metadata"]["generation"] == gen + 1

    def test_a_crd_created_on_the_server_is_served_with_its_schema(self, kapi):
        crd = yaml.safe_load((ROOT / "crds" / "attune.dev_tuningtrials.yaml").read_text())
        crd["metadata"]["name"] = "widgets.example.com"
        crd["spec"].update(group="example.com", names={"kind": "Widget", "listKind": "WidgetList",
                                                       "plural": "widgets", "singular": "widget"})
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
            "type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}
        client.ApiextensionsV1Api(kapi.api).create_custom_resource_definition(crd)
        widgets = ("example.com", "v1alpha1", NS, "widgets")
        made = kapi.custom.create_namespaced_custom_object(*widgets, {
            "apiVersion": "example.com/v1alpha1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 2, "colour": "red"}})
        assert made["spec"] == {"size": 2}
        err = _refused(kapi.custom.create_namespaced_custom_object, *widgets, {
            "apiVersion": "example.com/v1alpha1", "kind": "Widget", "metadata": {"name": "v"}, "spec": {"size": "L"}})
        assert err.status == 422


def test_an_older_crd_file_is_served_instead_of_the_repositorys(tmp_path):
    crd = yaml.safe_load((ROOT / "crds" / "attune.dev_tuningruns.yaml").read_text())
    del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["suspend"]
    old = tmp_path / "old-tuningruns.yaml"
    old.write_text(yaml.safe_dump(crd))
    trials = ROOT / "crds" / "attune.dev_tuningtrials.yaml"
    kube = KubeAPI(tmp_path, crds=(old, trials))
    try:
        made = kube.custom.create_namespaced_custom_object(*RUNS, _run("older"))
        assert "suspend" not in made["spec"]  # release N-1's schema has no such field: pruned
    finally:
        kube.close()


class TestAuthorization:
    """The operator's requests are authorized by the chart's RBAC for the install mode, in the API server's words."""

    def test_an_ungranted_verb_is_forbidden_and_a_granted_one_allowed(self, kapi):
        op = kapi.client_as_operator()
        custom = client.CustomObjectsApi(op)
        kapi.custom.create_namespaced_custom_object(*RUNS, _run(f"authz-{kapi.install}"))
        assert custom.get_namespaced_custom_object(*RUNS, f"authz-{kapi.install}")  # get: granted
        err = _refused(custom.create_namespaced_custom_object, *RUNS, _run("by-operator"))
        assert err.status == 403 and _body(err)["reason"] == "Forbidden"
        assert _body(err)["message"] == (
            f'tuningruns.attune.dev is forbidden: User "{OPERATOR_USER}" cannot create resource "tuningruns" in API '
            f'group "attune.dev" in the namespace "{NS}"')
        err = _refused(custom.delete_namespaced_custom_object, *RUNS, f"authz-{kapi.install}")
        assert err.status == 403 and f'tuningruns.attune.dev "authz-{kapi.install}" is forbidden' in _msg(err)
        core = client.CoreV1Api(op)
        err = _refused(core.list_namespaced_secret, NS)  # secrets: get by name only
        assert err.status == 403 and 'cannot list resource "secrets" in API group "" in the namespace "ml"' in _msg(err)
        assert any(d["verb"] == "create" and d["resource"] == "tuningruns" and not d["allowed"]
                   for d in kapi.decisions())

    def test_the_install_mode_scopes_the_grants(self, kapi):
        custom = client.CustomObjectsApi(kapi.client_as_operator())
        if kapi.install == "cluster":
            custom.list_cluster_custom_object("attune.dev", "v1alpha1", "tuningruns")
            custom.list_namespaced_custom_object("attune.dev", "v1alpha1", "research", "tuningruns")
        else:
            err = _refused(custom.list_cluster_custom_object, "attune.dev", "v1alpha1", "tuningruns")
            assert err.status == 403 and 'cannot list resource "tuningruns" in API group "attune.dev" at the ' \
                'cluster scope' in _msg(err)
            err = _refused(custom.list_namespaced_custom_object, "attune.dev", "v1alpha1", "research", "tuningruns")
            assert err.status == 403 and 'in the namespace "research"' in _msg(err)
        custom.list_namespaced_custom_object(*RUNS)
        if kapi.run(f"authz-{kapi.install}"):  # the status subresource: patch granted, get not (never needed)
            custom.patch_namespaced_custom_object_status(*RUNS, f"authz-{kapi.install}", {"status": {"message": "m"}})
            assert _refused(custom.get_namespaced_custom_object_status, *RUNS, f"authz-{kapi.install}").status == 403
        assert client.VersionApi(kapi.client_as_operator()).get_code()  # /version: every authenticated user

    def test_resource_names_limit_a_rule_to_named_objects(self, kapi):
        rbac_api = client.RbacAuthorizationV1Api(kapi.api)
        name = f"named-{kapi.install}"
        rbac_api.create_namespaced_role(NS, {"metadata": {"name": name}, "rules": [
            {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get"], "resourceNames": ["one"]}]})
        rbac_api.create_namespaced_role_binding(NS, {
            "metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "attune", "namespace": "attune-system"}]})
        core = client.CoreV1Api(kapi.client_as_operator())
        assert _refused(core.read_namespaced_service_account, "one", NS).status == 404  # allowed: not there
        assert _refused(core.read_namespaced_service_account, "two", NS).status == 403
        assert _refused(core.list_namespaced_service_account, NS).status == 403  # a list names no object

    def test_block_owner_deletion_needs_update_on_the_owners_finalizers(self, kapi):
        run = kapi.custom.create_namespaced_custom_object(*RUNS, _run(f"owner-{kapi.install}"))
        core = client.CoreV1Api(kapi.client_as_operator())
        owned = _cm(f"owned-{kapi.install}")
        owned["metadata"]["ownerReferences"] = [{"apiVersion": "attune.dev/v1alpha1", "kind": "TuningRun",
                                                 "name": run["metadata"]["name"], "uid": run["metadata"]["uid"],
                                                 "blockOwnerDeletion": True}]
        core.create_namespaced_config_map(NS, owned)  # the chart grants update on tuningruns/finalizers
        pod_owned = _cm(f"pod-owned-{kapi.install}")
        pod_owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u",
                                                     "blockOwnerDeletion": True}]
        err = _refused(core.create_namespaced_config_map, NS, pod_owned)
        assert err.status == 403 and "cannot set blockOwnerDeletion" in _msg(err) and \
            'cannot update resource "pods/finalizers"' in _msg(err)

    def test_an_unknown_token_is_unauthorized(self, kapi):
        assert httpx.get(f"{kapi.url}/api/v1/namespaces/{NS}/configmaps",
                         headers={"Authorization": "Bearer nope"}).status_code == 401


class TestFaults:
    """Faults injected at run time, answered as a real API server answers (status, reason, headers), or delays."""

    def test_discovery_unavailable(self, kapi):
        op = kapi.client_as_operator()
        kapi.inject(503, path="/apis/kubeflow.org/v1", times=1)
        err = _refused(_raw, op, "GET", "/apis/kubeflow.org/v1")
        assert err.status == 503 and _body(err)["reason"] == "ServiceUnavailable"
        assert _raw(op, "GET", "/apis/kubeflow.org/v1")["groupVersion"] == "kubeflow.org/v1"  # times=1: then served

    def test_throttled_with_retry_after(self, kapi):
        op = kapi.client_as_operator()
        kapi.inject(429, verb="create", resource="configmaps", retry_after=1, times=1)
        client.CoreV1Api(kapi.api).create_namespaced_config_map(NS, _cm(f"admin-{kapi.install}"))  # not the operator
        err = _refused(client.CoreV1Api(op).create_namespaced_config_map, NS, _cm(f"throttled-{kapi.install}"))
        assert err.status == 429 and err.headers["Retry-After"] == "1"
        assert _body(err)["reason"] == "TooManyRequests" and _body(err)["details"]["retryAfterSeconds"] == 1
        assert kapi.faults()[0]["hits"] == 1
        # a GET is retried by the client (urllib3 honours Retry-After on 429), as it would be against a real server
        kapi.inject(429, verb="list", resource="tuningruns", retry_after=1, times=1)
        start = time.monotonic()
        client.CustomObjectsApi(op).list_namespaced_custom_object(*RUNS)
        assert time.monotonic() - start >= 1.0 and kapi.faults()[1]["hits"] == 1

    def test_quota_exceeded_and_internal_error(self, kapi):
        custom = client.CustomObjectsApi(kapi.client_as_operator())
        job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": f"q-{kapi.install}"},
               "spec": {}}
        kapi.quota_exceeded("pytorchjobs", "kubeflow.org")
        err = _refused(custom.create_namespaced_custom_object, "kubeflow.org", "v1", NS, "pytorchjobs", job)
        assert err.status == 403 and "exceeded quota: compute" in _body(err)["message"]
        kapi.clear_faults()
        kapi.inject(500, verb="get", resource="configmaps", user="any")
        err = _refused(client.CoreV1Api(kapi.api).read_namespaced_config_map, "anything", NS)
        assert err.status == 500 and _body(err)["reason"] == "InternalError"
        kapi.clear_faults()
        custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job)

    def test_a_delay(self, kapi):
        kapi.inject(delay=1.0, verb="list", resource="configmaps", user="any", times=1)
        start = time.monotonic()
        client.CoreV1Api(kapi.api).list_namespaced_config_map(NS)
        assert time.monotonic() - start >= 1.0


class _SlowWebhook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(3)
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": {"uid": review["request"]["uid"], "allowed": True}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_a_slow_webhook_times_out_by_its_timeout_and_failure_policy(kapi, policy):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowWebhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    adm = client.AdmissionregistrationV1Api(kapi.api)
    name = f"slow-{policy.lower()}"
    adm.create_validating_webhook_configuration({"metadata": {"name": name}, "webhooks": [{
        "name": "slow.example.com", "failurePolicy": policy, "sideEffects": "None", "timeoutSeconds": 1,
        "admissionReviewVersions": ["v1"], "clientConfig": {"url": f"http://127.0.0.1:{server.server_port}/"},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["secrets"]}]}]})
    try:
        core = client.CoreV1Api(kapi.api)
        start = time.monotonic()
        secret = {"metadata": {"name": f"s-{policy.lower()}"}, "stringData": {"a": "b"}}
        if policy == "Fail":
            err = _refused(core.create_namespaced_secret, NS, secret)
            assert err.status == 500 and 'failed calling webhook "slow.example.com"' in _msg(err) \
                and "context deadline exceeded" in _msg(err)
        else:
            core.create_namespaced_secret(NS, secret)
        assert time.monotonic() - start < 2.5  # its timeoutSeconds, not the webhook's 3 s
    finally:
        adm.delete_validating_webhook_configuration(name)
        server.shutdown()


@pytest.mark.parametrize("install", ["namespaced", "cluster"])
def test_the_operator_runs_a_run_under_the_charts_rbac_in_each_install_mode(tmp_path, install):
    """The real operator, with the chart's RBAC for the mode (cluster-wide: no --namespace), takes a suspended run to
    Suspended without being refused anything; its decisions name the rules that allowed them."""
    from tests.k8s.harness import Operator, wait_for

    kube = KubeAPI(tmp_path, install=install)
    op = Operator(kube, tmp_path)
    try:
        op.start()
        kube.custom.create_namespaced_custom_object(*RUNS, _run("moded"))
        wait_for(lambda: ((kube.run("moded") or {}).get("status") or {}).get("phase") == "Suspended", 30,
                 "the run to be suspended")
        decisions = kube.decisions()
        assert not kube.unexpected_denials(), kube.unexpected_denials()
        watched = [d for d in decisions if d["verb"] == "watch" and d["resource"] == "tuningruns"]
        assert watched and all(d["namespace"] == ("" if install == "cluster" else NS) for d in watched)
        kind = "ClusterRole" if install == "cluster" else "Role"
        assert all(d["rule"].startswith(kind) for d in watched), watched
    finally:
        op.stop()
        kube.close()


def test_what_a_real_api_server_accepts_from_clients_it_accepts_too(kube):
    """kopf's Events (core/v1, generateName, no name) and a Secret's write-only stringData (stored in data)."""
    import base64

    core = client.CoreV1Api(kube.api)
    ev = core.create_namespaced_event(NS, {
        "metadata": {"generateName": "kopf-event-", "namespace": NS}, "type": "Normal", "reason": "Started",
        "message": "m", "involvedObject": {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningRun", "name": "r",
                                           "namespace": NS, "uid": "u"},
        "source": {"component": "kopf"}, "reportingComponent": "kopf", "reportingInstance": "dev",
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"})
    assert ev.metadata.name.startswith("kopf-event-")
    core.create_namespaced_secret(NS, {"metadata": {"name": "s"}, "stringData": {"token": "t0ken"}})
    secret = core.read_namespaced_secret("s", NS)
    assert base64.b64decode(secret.data["token"]).decode() == "t0ken" and not secret.string_data
