"""attune's CRDs on the real API server (``control_plane``: kube-apiserver built at the pinned release), where the
emulator this project once had (CEL in cel-python on raw JSON) could only guess: the README's
``kubectl apply --server-side -f crds/`` and its field ownership, the chart's copy applied by another field manager,
every CEL rule compiled and enforced with the server's own message, what the server does with opaque
(``x-kubernetes-preserve-unknown-fields``) values, and pruning and defaulting of what users and the operator write.

The CRDs are cluster-scoped and shared by every test of the worker: they are applied idempotently (the README's
command) and never deleted; each test's objects live in this module's namespace, deleted at the end."""

from __future__ import annotations

import copy
import enum
import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from pydantic import BaseModel

from attune.operator.crdgen import build_crds, opaque
from attune.operator.resources import (
    API_VERSION,
    GROUP,
    RUN_PLURAL,
    TRIAL_PLURAL,
    VERSION,
    TuningRunSpec,
    TuningRunStatus,
    TuningTrialSpec,
    TuningTrialStatus,
)
from tests.k8s.chart import CHART, ROOT
from tests.k8s.realcluster import ControlPlane

pytestmark = [pytest.mark.k8s]

CRDS = ROOT / "crds"
CRD_NAMES = sorted(d["metadata"]["name"] for d in build_crds().values())
RUN_CRD = f"{RUN_PLURAL}.{GROUP}"


def _file_crd(name: str) -> dict[str, Any]:
    return next(d for p in sorted(CRDS.glob("*.yaml")) if (d := yaml.safe_load(p.read_text()))["metadata"]["name"]
                == name)


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The CRD's schema itself (edits change ``crd``)."""
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _rules(crd: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """Every CEL rule of ``crd``'s schema, with the field path the server reports it at."""
    out: list[tuple[str, dict[str, str]]] = []

    def walk(node: dict[str, Any], path: str) -> None:
        out.extend((path, r) for r in node.get("x-kubernetes-validations") or [])
        for name, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{name}" if path else name)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(_schema(crd), "")
    return out


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The README's install, then both CRDs Established (``kubectl wait`` watches the condition)."""
    control_plane.kubectl("apply", "--server-side", "-f", str(CRDS))
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in CRD_NAMES))
    return control_plane


@pytest.fixture(scope="module")
def ns(crds: ControlPlane) -> Iterator[str]:
    name = crds.namespace("crds")
    yield name
    crds.delete_namespace(name)


def _crd(cp: ControlPlane, name: str) -> dict[str, Any]:
    return dict(json.loads(cp.kubectl("get", "crd", name, "-o", "json", "--show-managed-fields").stdout))


def _managers(crd: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in crd["metadata"].get("managedFields") or []}


# -- 1. the README's install, and the chart's copy --------------------------------------------------------------------

def test_readme_apply_establishes_the_crds_as_written_and_reapplying_is_a_no_op(crds: ControlPlane) -> None:
    for name in CRD_NAMES:
        served = _crd(crds, name)
        conditions = {c["type"]: c for c in served["status"]["conditions"]}
        assert conditions["Established"]["status"] == "True" and conditions["NamesAccepted"]["status"] == "True"
        # the server keeps the schema as written: every CEL rule compiled within its cost budget (a rule that does
        # not is refused with the CRD), nothing dropped or rewritten
        assert _schema(served) == _schema(_file_crd(name))
        owned = _managers(served)[("kubectl", "Apply")]
        assert "f:versions" in owned["f:spec"] and "f:attune.dev/schema-revision" in owned["f:metadata"][
            "f:annotations"]
    before = {n: _crd(crds, n)["metadata"] for n in CRD_NAMES}
    out = crds.kubectl("apply", "--server-side", "-f", str(CRDS)).stdout
    assert out.count("serverside-applied") == len(CRD_NAMES)
    for name in CRD_NAMES:
        after = _crd(crds, name)["metadata"]
        assert (after["resourceVersion"], after["generation"]) == (before[name]["resourceVersion"],
                                                                   before[name]["generation"]), "a write"
        assert after["managedFields"] == before[name]["managedFields"]


def _chart_crds(helm: Path) -> str:
    import subprocess

    return subprocess.run([str(helm), "template", "rel", str(CHART), "--namespace", "attune-system", "--show-only",
                           "templates/crds.yaml"], check=True, capture_output=True, text=True).stdout


def test_the_charts_crds_applied_by_another_manager_co_own_and_a_different_schema_conflicts(
        crds: ControlPlane, helm: Path) -> None:
    """Helm 4 applies its manifests server-side under its own field manager. Over CRDs installed with the README's
    command, the chart's copy (the same generated spec, plus the chart's labels and keep annotation) applies cleanly:
    server-side apply only refuses to change a value another manager owns, and an equal value makes the second
    manager a co-owner. A chart whose schema differs (another attune release) conflicts on ``spec.versions`` (an
    atomic list: owned whole) with ``kubectl``, until forced (``--force-conflicts``); releasing the chart's fields
    removes what only it owned and keeps what kubectl still owns."""
    rendered = _chart_crds(helm)
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert sorted(d["metadata"]["name"] for d in docs) == CRD_NAMES
    out = crds.kubectl("apply", "--server-side", "--field-manager=helm", "-f", "-", stdin=rendered).stdout
    assert out.count("serverside-applied") == len(CRD_NAMES)
    for name in CRD_NAMES:
        served = _crd(crds, name)
        managers = _managers(served)
        helm_owns, kubectl_owns = managers[("helm", "Apply")], managers[("kubectl", "Apply")]
        assert "f:versions" in helm_owns["f:spec"] and "f:versions" in kubectl_owns["f:spec"]  # co-owned
        assert served["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert served["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert _schema(served) == _schema(_file_crd(name))

    other = copy.deepcopy(docs[0])
    other["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "another attune release"
    refused = crds.kubectl("apply", "--server-side", "--field-manager=helm", "-f", "-", stdin=json.dumps(other),
                           check=False)
    assert refused.returncode != 0
    assert 'conflict with "kubectl"' in refused.stderr and ".spec.versions" in refused.stderr, refused.stderr
    forced = crds.kubectl("apply", "--server-side", "--field-manager=helm", "--force-conflicts", "--dry-run=server",
                          "-f", "-", stdin=json.dumps(other))  # taken over when forced (a dry run: unchanged)
    assert "serverside-applied (server dry run)" in forced.stdout
    assert "description" not in _schema(_crd(crds, other["metadata"]["name"]))

    # the chart lets go: its labels and keep annotation go, the schema kubectl owns stays
    bare = "\n---\n".join(json.dumps({"apiVersion": d["apiVersion"], "kind": d["kind"],
                                         "metadata": {"name": d["metadata"]["name"]}}) for d in docs)
    crds.kubectl("apply", "--server-side", "--field-manager=helm", "-f", "-", stdin=bare)
    for name in CRD_NAMES:
        served = _crd(crds, name)
        assert ("helm", "Apply") not in _managers(served)
        assert "labels" not in served["metadata"] and "helm.sh/resource-policy" not in served["metadata"][
            "annotations"]
        assert _schema(served) == _schema(_file_crd(name))


def test_the_preflights_fix_upgrades_crds_another_manager_applied(crds: ControlPlane) -> None:
    """An operator newer than the served CRDs names the fix (preflight.CRD_FIX). Where an older chart applied them
    (Helm 4: server-side, its own field manager, here with an older schema and revision), the README's plain
    ``kubectl apply --server-side -f crds/`` conflicts with it on the schema; the command the fix names upgrades
    them."""
    import re
    import shlex

    from attune.operator.crdgen import REVISION_ANNOTATION
    from attune.operator.preflight import CRD_FIX

    older = []
    for name in CRD_NAMES:
        doc = _file_crd(name)
        doc["metadata"]["annotations"][REVISION_ANNOTATION] = "1"
        _schema(doc)["description"] = "an older release"
        older.append(doc)
    fix = shlex.split(re.findall(r"`(kubectl apply [^`]*)`", CRD_FIX)[0])
    try:
        crds.kubectl("apply", "--server-side", "--field-manager=helm", "--force-conflicts", "-f", "-",
                     stdin="\n---\n".join(json.dumps(d) for d in older))
        assert _schema(_crd(crds, CRD_NAMES[0]))["description"] == "an older release"
        plain = crds.kubectl("apply", "--server-side", "-f", str(CRDS), check=False)
        assert plain.returncode != 0 and 'conflicts with "helm"' in plain.stderr, plain.stderr
        assert ".spec.versions" in plain.stderr and f".metadata.annotations.{REVISION_ANNOTATION}" in plain.stderr
        crds.kubectl(*[str(CRDS) if a == "crds/" else a for a in fix[1:]])
        for name in CRD_NAMES:
            served = _crd(crds, name)
            assert _schema(served) == _schema(_file_crd(name))
            assert served["metadata"]["annotations"] == _file_crd(name)["metadata"]["annotations"]
    finally:  # the worker's other tests find the CRDs as written, owned by kubectl alone
        crds.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
        crds.kubectl("apply", "--server-side", "--field-manager=helm", "-f", "-", stdin="\n---\n".join(
            json.dumps({"apiVersion": d["apiVersion"], "kind": d["kind"], "metadata": {"name": d["metadata"]["name"]}})
            for d in older))
    for name in CRD_NAMES:
        assert [m for m, _ in _managers(_crd(crds, name))] == ["kubectl", "kube-apiserver"]


# -- 2. the CEL rules, enforced by the server ------------------------------------------------------------------------

def _example(name: str, path: str = "examples/tuningrun-good.yaml") -> dict[str, Any]:
    run = yaml.safe_load((ROOT / path).read_text())
    run["metadata"] = {"name": name}
    return dict(run)


def _create(cp: ControlPlane, ns: str, run: dict[str, Any], plural: str = RUN_PLURAL, **kw: Any) -> dict[str, Any]:
    return dict(cp.custom.create_namespaced_custom_object(GROUP, VERSION, ns, plural, run, **kw))


def _get(cp: ControlPlane, ns: str, name: str, plural: str = RUN_PLURAL) -> dict[str, Any]:
    return dict(cp.custom.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name))


def _patch(cp: ControlPlane, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return dict(cp.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, RUN_PLURAL, name, body))


def _refusal(call: Any) -> dict[str, Any]:
    with pytest.raises(client.exceptions.ApiException) as err:
        call()
    return dict(json.loads(err.value.body))


def _inline_seed(spec: dict[str, Any]) -> None:
    spec["recipe"]["inline"]["training"]["seed"] = 7


def _template_image(spec: dict[str, Any]) -> None:
    spec["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"] = "x:1"


#: an edit of a created run that trips each rule (by the field its message names); a rule without one fails
#: test_every_cel_rule_has_an_edit_that_trips_it
VIOLATIONS: list[tuple[str, str, Any]] = [
    ("spec.recipe", "inside the opaque inline recipe", _inline_seed),
    ("spec.recipe", "inline swapped for a ConfigMap", lambda s: s.update(recipe={"configMapRef": {"name": "r"}})),
    ("spec.trialTemplate", "the opaque template's image", _template_image),
    ("spec.trialTemplate", "a field added deep inside", lambda s: s["trialTemplate"]["spec"].update(runPolicy={})),
    ("spec.containerName", "renamed", lambda s: s.update(containerName="trainer")),
    ("spec.searchSpace", "changed", lambda s: s.update(searchSpace=["micro_batch_size"])),
    ("spec.searchSpace", "removed", lambda s: s.pop("searchSpace")),
    ("spec.objective", "minGain", lambda s: s["objective"].update(minGain=0.5)),
    ("spec.metrics", "measureSteps", lambda s: s["metrics"].update(measureSteps=30)),
    ("spec.agent", "endpoint", lambda s: s["agent"].update(endpoint="http://agent.ml.svc:8081")),
    ("spec.output", "deleteWithRun", lambda s: s.update(output={"deleteWithRun": True})),
    ("spec.budget.acceleratorHours", "decreased", lambda s: s["budget"].update(acceleratorHours=0.01)),
    ("spec.budget.maxTrials", "decreased", lambda s: s["budget"].update(maxTrials=2)),
    ("spec.budget.maxFailedTrials", "decreased", lambda s: s["budget"].update(maxFailedTrials=1)),
    ("spec.budget.trialDeadlineSeconds", "changed", lambda s: s["budget"].update(trialDeadlineSeconds=600)),
    ("spec.budget.pendingDeadlineSeconds", "set", lambda s: s["budget"].update(pendingDeadlineSeconds=600)),
]
#: edits the rules allow (the edit policy: spec.suspend free, three budget limits may increase, no limit the largest)
ALLOWED: list[tuple[str, Any]] = [
    ("suspend", lambda s: s.update(suspend=True)),
    ("budget increases", lambda s: s["budget"].update(acceleratorHours=1.0, maxTrials=60, maxFailedTrials=5)),
    ("maxTrials removed", lambda s: s["budget"].pop("maxTrials")),
]


def _run_rules() -> dict[str, tuple[str, str]]:
    """Field its message names → (the field the server reports, the message), for each TuningRun rule."""
    return {r["message"].split()[0]: (path, r["message"]) for path, r in _rules(_file_crd(RUN_CRD))}


def test_every_cel_rule_has_an_edit_that_trips_it() -> None:
    assert {field for field, _, _ in VIOLATIONS} == set(_run_rules())
    assert not _rules(_file_crd(f"{TRIAL_PLURAL}.{GROUP}"))  # a TuningTrial rule would need cases here too


@pytest.mark.parametrize(("field", "edit"), [(f, e) for f, _, e in VIOLATIONS],
                         ids=[f"{f}-{what}".replace(" ", "-") for f, what, _ in VIOLATIONS])
def test_the_server_refuses_each_frozen_or_shrinking_edit_with_the_rules_message(crds: ControlPlane, ns: str,
                                                                                  field: str, edit: Any) -> None:
    name = f"frozen-{[e for _, _, e in VIOLATIONS].index(edit)}"
    created = _create(crds, ns, _example(name))
    spec = copy.deepcopy(created["spec"])
    edit(spec)
    replaced = {**created, "spec": spec}  # a PUT of the edited object, as kubectl edit and replace send it
    body = _refusal(lambda: crds.custom.replace_namespaced_custom_object(GROUP, VERSION, ns, RUN_PLURAL, name,
                                                                         replaced))
    where, message = _run_rules()[field]
    assert (body["code"], body["reason"]) == (422, "Invalid"), body
    assert body["details"]["causes"] == [{"reason": "FieldValueInvalid", "message": f"Invalid value: {message}",
                                          "field": where}], body
    assert f'TuningRun.attune.dev "{name}" is invalid: {where}: Invalid value: {message}' == body["message"]
    assert _get(crds, ns, name)["spec"] == created["spec"]  # nothing was written


@pytest.mark.parametrize(("edit",), [(e,) for _, e in ALLOWED], ids=[w.replace(" ", "-") for w, _ in ALLOWED])
def test_the_server_accepts_the_edits_the_policy_allows(crds: ControlPlane, ns: str, edit: Any) -> None:
    name = f"allowed-{[e for _, e in ALLOWED].index(edit)}"
    created = _create(crds, ns, _example(name))
    spec = copy.deepcopy(created["spec"])
    edit(spec)
    stored = crds.custom.replace_namespaced_custom_object(GROUP, VERSION, ns, RUN_PLURAL, name,
                                                          {**created, "spec": spec})
    assert stored["spec"] == spec and stored["metadata"]["generation"] == 2


def test_a_merge_patch_is_judged_like_a_replace_and_every_tripped_rule_is_reported(crds: ControlPlane,
                                                                                     ns: str) -> None:
    _create(crds, ns, _example("patched"))
    body = _refusal(lambda: _patch(crds, ns, "patched", {"spec": {"searchSpace": ["x"], "budget": {
        "acceleratorHours": 0.01}}}))
    rules = _run_rules()
    assert sorted((c["field"], c["message"]) for c in body["details"]["causes"]) == [
        (rules[f][0], f"Invalid value: {rules[f][1]}") for f in ("spec.searchSpace", "spec.budget.acceleratorHours")]
    # null is absent to the rules: a run created without a trial limit cannot gain one, one with a limit may drop it
    unlimited = _example("unlimited")
    unlimited["spec"]["budget"]["maxTrials"] = None
    _create(crds, ns, unlimited)
    _patch(crds, ns, "unlimited", {"spec": {"suspend": True}})  # the budget rules pass with the null limit
    body = _refusal(lambda: _patch(crds, ns, "unlimited", {"spec": {"budget": {"maxTrials": 100}}}))
    assert body["details"]["causes"][0]["message"] == f"Invalid value: {rules['spec.budget.maxTrials'][1]}"
    assert _patch(crds, ns, "patched", {"spec": {"budget": {"maxTrials": None}}})["spec"]["budget"].get(
        "maxTrials") is None


def test_the_rules_stay_within_the_runtime_cost_budget_on_the_largest_spec(crds: ControlPlane, ns: str) -> None:
    """The longest search space the schema admits (256 names of 253 characters) and a 300 kB inline recipe: the
    rules compare them on every update within the server's per-call CEL budget (its refusal would say so)."""
    run = _example("large")
    run["spec"]["searchSpace"] = [f"{i:03d}" + "k" * 250 for i in range(256)]
    run["spec"]["recipe"]["inline"]["notes"] = [{"line": i, "text": "x" * 280} for i in range(1000)]
    created = _create(crds, ns, run)
    assert _patch(crds, ns, "large", {"spec": {"suspend": True}})["spec"]["suspend"] is True
    last = copy.deepcopy(created["spec"]["searchSpace"])
    last[-1] = last[-1][:-1] + "j"
    body = _refusal(lambda: _patch(crds, ns, "large", {"spec": {"searchSpace": last}}))
    assert [c["message"] for c in body["details"]["causes"]] == [
        f"Invalid value: {_run_rules()['spec.searchSpace'][1]}"]


# -- opaque values ---------------------------------------------------------------------------------------------------

def test_rules_cannot_reach_inside_an_opaque_value_but_compare_it_whole(crds: ControlPlane, ns: str) -> None:
    """``x-kubernetes-preserve-unknown-fields`` without properties gives CEL an object with no fields: a rule that
    selects a field inside one does not compile, and the server refuses the CRD (the emulator's cel-python on raw
    JSON would have run it). None of attune's rules does (the CRDs were accepted). Equality of the whole value does
    see its contents: the rules of spec.recipe (whose ``inline`` is opaque) and spec.trialTemplate freeze them
    (VIOLATIONS), and an update that sends them back unchanged passes."""
    spec = _schema(_file_crd(RUN_CRD))["properties"]["spec"]
    assert opaque(spec["properties"]["trialTemplate"]) and opaque(spec["properties"]["recipe"]["properties"]["inline"])
    reaching = _file_crd(RUN_CRD)
    _schema(reaching)["properties"]["spec"]["x-kubernetes-validations"].append(
        {"rule": "self.recipe.inline.name == oldSelf.recipe.inline.name", "message": "reaches inside"})
    refused = crds.kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-",
                           stdin=json.dumps(reaching), check=False)  # a dry run: the served CRD stays
    assert refused.returncode != 0 and "compilation failed" in refused.stderr
    assert "undefined field 'name'" in refused.stderr, refused.stderr

    created = _create(crds, ns, _example("opaque"))
    again = {**created, "spec": {**json.loads(json.dumps(created["spec"], sort_keys=True)), "suspend": True}}
    stored = crds.custom.replace_namespaced_custom_object(GROUP, VERSION, ns, RUN_PLURAL, "opaque", again)
    assert stored["spec"]["trialTemplate"] == created["spec"]["trialTemplate"] and stored["spec"]["suspend"] is True


# -- 3. pruning and defaulting ---------------------------------------------------------------------------------------

def test_unknown_fields_are_pruned_or_refused_under_strict_validation_and_kept_inside_opaque_values(
        crds: ControlPlane, ns: str) -> None:
    run = _example("unknown")
    run["spec"]["bogus"] = 1
    run["spec"]["budget"]["maxTrails"] = 3  # misspelt
    run["spec"]["trialTemplate"]["spec"]["runPolicy"] = {"cleanPodPolicy": "None"}
    run["spec"]["recipe"]["inline"]["comment"] = None
    body = _refusal(lambda: _create(crds, ns, run, field_validation="Strict"))
    assert (body["code"], body["reason"]) == (400, "BadRequest")
    assert body["message"] == ('TuningRun in version "v1alpha1" cannot be handled as a TuningRun: strict decoding '
                               'error: unknown field "spec.bogus", unknown field "spec.budget.maxTrails"')
    stored = _create(crds, ns, run)  # the client's default: the server's (Warn): pruned
    assert "bogus" not in stored["spec"] and "maxTrails" not in stored["spec"]["budget"]
    assert stored["spec"]["trialTemplate"]["spec"]["runPolicy"] == {"cleanPodPolicy": "None"}
    assert "comment" in stored["spec"]["recipe"]["inline"] and stored["spec"]["recipe"]["inline"]["comment"] is None


def test_the_illegal_example_is_refused_by_the_server_for_each_of_its_faults(crds: ControlPlane, ns: str) -> None:
    """examples/tuningrun-illegal.yaml says the schema refuses it (a misspelt trialTemplate, a negative budget): each
    way kubectl sends it, the server names the fault it meets first."""
    illegal = _in_namespace(ROOT / "examples" / "tuningrun-illegal.yaml", ns)
    ssa = crds.kubectl("apply", "--server-side", "-f", "-", stdin=illegal, check=False)
    assert ssa.returncode != 0 and ".spec.trialTemplte: field not declared in schema" in ssa.stderr, ssa.stderr
    strict = crds.kubectl("create", "-f", "-", stdin=illegal, check=False)  # kubectl's default: strict validation
    assert strict.returncode != 0
    assert 'strict decoding error: unknown field "spec.trialTemplte"' in strict.stderr, strict.stderr
    pruned = crds.kubectl("create", "--validate=false", "-f", "-", stdin=illegal, check=False)  # pruned, then judged
    assert pruned.returncode != 0
    assert ("spec.budget.acceleratorHours: Invalid value: -1: spec.budget.acceleratorHours in body should be greater "
            "than 0") in pruned.stderr and "spec.trialTemplate: Required value" in pruned.stderr, pruned.stderr


def _in_namespace(path: Path, ns: str) -> str:
    """The manifest at ``path`` in namespace ``ns``, as JSON (kubectl reads it as sent, with no YAML resolution)."""
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = ns
    return json.dumps(doc)


def _contains(sent: Any, got: Any, path: str = "") -> list[str]:
    """Where ``got`` lost or changed what ``sent`` holds (extra entries in ``got`` are the server's defaults)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [f"{path}: {got!r}"]
        return [p for k, v in sent.items() for p in
                ([f"{path}.{k}: dropped"] if k not in got else _contains(v, got[k], f"{path}.{k}"))]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [f"{path}: {got!r}"]
        return [p for i, (s, g) in enumerate(zip(sent, got, strict=True)) for p in _contains(s, g, f"{path}[{i}]")]
    return [] if (sent == got and type(sent) is type(got)) or (
        isinstance(sent, float) and isinstance(got, int) and sent == got) else [f"{path}: {sent!r} → {got!r}"]


@pytest.mark.parametrize("example", ["tuningrun-good.yaml", "tuningrun-hf.yaml", "tuningrun-bad.yaml"])
def test_an_example_run_comes_back_as_sent_plus_the_models_defaults(crds: ControlPlane, ns: str,
                                                                     example: str) -> None:
    """``kubectl apply`` (strict field validation: an unknown field would be refused) of each schema-valid example:
    nothing sent is dropped or changed, and what the server adds are the defaults the operator's model would fill
    in itself (it parses the same spec either way)."""
    path = ROOT / "examples" / example
    sent = yaml.safe_load(path.read_text())
    crds.kubectl("apply", "--server-side", "-f", "-", stdin=_in_namespace(path, ns))
    got = _get(crds, ns, sent["metadata"]["name"])
    assert got["apiVersion"] == API_VERSION and got["kind"] == sent["kind"]
    assert _contains(sent["spec"], got["spec"]) == []
    assert TuningRunSpec.model_validate(got["spec"]) == TuningRunSpec.model_validate(sent["spec"])
    assert got["spec"] != sent["spec"]  # the server does default (the example leaves fields out)


# -- everything the models can hold, spec and status ----------------------------------------------------------------

def full(model: type[BaseModel]) -> dict[str, Any]:
    """A wire mapping of ``model`` with every field set (none left to a default), within the field's bounds."""
    values = {name: _value(f.annotation, f.metadata, f.json_schema_extra) for name, f in model.model_fields.items()}
    return model.model_validate(values).model_dump(mode="json", by_alias=True)


#: an opaque value: nested mappings and lists, a null, numbers of both kinds
OPAQUE = {"a": {"b": [1, "two", 3.5, True, None]}, "c": None}


def _value(tp: Any, metadata: list[Any], extra: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _value(args[0], [*metadata, *args[1:]], extra)
    if origin in (typing.Union, types.UnionType):
        return _value(next(a for a in args if a is not type(None)), metadata, extra)
    if origin is typing.Literal:
        return args[-1]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return full(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return list(tp)[-1].value
    if origin is dict or tp is dict:
        return copy.deepcopy(OPAQUE)
    if origin is list:
        return [_value(args[0], [], None), _value(args[0], [], None)]
    if isinstance(extra, dict) and extra.get("enum"):
        return extra["enum"][-1]
    bound = {k: getattr(m, k) for m in metadata for k in ("ge", "gt", "le", "lt") if getattr(m, k, None) is not None}
    if tp is bool:
        return True
    if tp is int:
        low = bound.get("ge", bound.get("gt", 0) + 1)
        return min(low + 3, bound.get("le", low + 3))
    if tp is float:
        low = float(bound.get("ge", bound.get("gt", 0.0)))
        high = float(bound.get("le", bound.get("lt", low + 10)))
        return round(low + (high - low) * 0.375, 6)
    if tp is str:
        return "sample"
    raise TypeError(f"no sample value for {tp!r}")


def _status(cp: ControlPlane, ns: str, plural: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    obj = _get(cp, ns, name, plural)
    return dict(cp.custom.replace_namespaced_custom_object_status(GROUP, VERSION, ns, plural, name,
                                                                  {**obj, "status": status}))


@pytest.mark.parametrize(("kind", "plural", "spec_model", "status_model"), [
    ("TuningRun", RUN_PLURAL, TuningRunSpec, TuningRunStatus),
    ("TuningTrial", TRIAL_PLURAL, TuningTrialSpec, TuningTrialStatus)])
def test_every_field_the_models_hold_survives_the_server(crds: ControlPlane, ns: str, kind: str, plural: str,
                                                         spec_model: type[BaseModel],
                                                         status_model: type[BaseModel]) -> None:
    """A spec and a status with every field of attune's models set (what users and the operator may write) come
    back exactly: the schema prunes none of them and defaults nothing over them, nulls inside opaque values stay."""
    spec, status = full(spec_model), full(status_model)
    name = f"full-{kind.lower()}"
    created = _create(crds, ns, {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec},
                      plural, field_validation="Strict")
    assert _contains(spec, created["spec"]) == [] and created["spec"] == spec
    stored = _status(crds, ns, plural, name, status)
    assert _contains(status, stored["status"]) == [] and stored["status"] == status
    assert stored["spec"] == spec  # the status subresource leaves the spec alone


def test_printer_columns_names_and_generation_as_the_operator_reads_them(crds: ControlPlane, ns: str) -> None:
    """``kubectl get`` shows the CRDs' columns from a status the operator writes (the server evaluates their
    JSONPaths), the short names and the ``attune`` category list both kinds, and ``metadata.generation`` moves with
    the spec alone: the operator's observedGeneration (SpecAccepted) compares with it, while kopf writes
    annotations and the operator the status."""
    run = _create(crds, ns, _example("columns"))
    assert run["metadata"]["generation"] == 1
    status = TuningRunStatus.model_validate({"phase": "Tuning", "trials": {"total": 7}, "best": {"speedup": 1.25},
                                             "budget": {"hoursUsed": 0.5, "hoursLimit": 2},
                                             "outcome": "GainCertified"}).wire()
    assert _status(crds, ns, RUN_PLURAL, "columns", status)["metadata"]["generation"] == 1
    assert _patch(crds, ns, "columns", {"metadata": {"annotations": {"kopf.zalando.org/x": "y"}}})["metadata"][
        "generation"] == 1
    assert _patch(crds, ns, "columns", {"spec": {"suspend": True}})["metadata"]["generation"] == 2
    table = crds.kubectl("get", "trun", "columns", "-n", ns).stdout.split("\n")
    assert table[0].split() == ["NAME", "PHASE", "TRIALS", "BEST-SPEEDUP", "OUTCOME", "HOURS", "AGE"]
    assert table[1].split()[:6] == ["columns", "Tuning", "7", "1.25", "GainCertified", "0.5"]
    trial = {"apiVersion": API_VERSION, "kind": "TuningTrial", "metadata": {"name": "columns-t001"},
             "spec": TuningTrialSpec(run_ref="columns", index=1, kind="baseline").wire()}
    _create(crds, ns, trial, TRIAL_PLURAL)
    _status(crds, ns, TRIAL_PLURAL, "columns-t001", {"phase": "Succeeded", "outcome": "succeeded", "decision": "kept"})
    wide = crds.kubectl("get", "ttrial", "columns-t001", "-n", ns, "-o", "wide").stdout.split("\n")
    assert wide[0].split() == ["NAME", "RUN", "KIND", "PHASE", "OUTCOME", "DECISION", "AGE"]
    assert wide[1].split()[:6] == ["columns-t001", "columns", "baseline", "Succeeded", "succeeded", "kept"]
    listed = crds.kubectl("get", "attune", "-n", ns, "-o", "name").stdout.split()
    assert {"tuningrun.attune.dev/columns", "tuningtrial.attune.dev/columns-t001"} <= set(listed)


# -- YAML attune writes for kubectl ------------------------------------------------------------------------------------

def test_the_tuned_manifest_attune_writes_reads_back_through_kubectl_with_its_string_arguments(
        crds: ControlPlane, ns: str) -> None:
    """Found here: examples/tuningrun-hf.yaml's trainer arguments (``--learning_rate "1e-3"``) written with PyYAML's
    safe_dump come back from kubectl as a number, which the API server refuses. attune's tuned manifest (the
    ``<run>-tuned`` ConfigMap, for ``kubectl apply``) is written with attune.operator.kubeyaml, which quotes them.
    The PyTorchJob CRD is not installed here: its Master pod, written the same way, goes through kubectl instead."""
    from attune.operator import kubeyaml, results
    from attune.operator.reconcile import recipe_from_template

    run = yaml.safe_load((ROOT / "examples" / "tuningrun-hf.yaml").read_text())
    run["metadata"] = {"name": "hf", "namespace": ns, "uid": "uid-hf"}
    base = recipe_from_template(TuningRunSpec.model_validate(run["spec"]), "hf")
    cm = results.tuned_configmap(run, base.with_knobs(per_device_train_batch_size=2), base, {})
    text = cm["data"][results.manifest_key("PyTorchJob")]
    assert "'1e-3'" in text
    tuned = yaml.safe_load(text)
    master = tuned["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    args = master["spec"]["containers"][0]["args"]
    assert "1e-3" in args and all(isinstance(a, str) for a in args)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tuned-master", "namespace": ns},
           "spec": master["spec"]}
    out = crds.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=kubeyaml.dump(pod))
    assert json.loads(out.stdout)["spec"]["containers"][0]["args"] == args
    plain = crds.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod), check=False)
    assert plain.returncode != 0 and "cannot unmarshal number" in plain.stderr, plain.stderr  # the defect


@pytest.mark.parametrize("text", ["1e-3", "5e5", "1E+3", "1_000", "0o17", "0x1F", "0b101", "+1", "-2.5", ".5", ".inf",
                                  "-.NaN", "y", "N", "yes", "Off", "null", "~", "2006-1-2"])
def test_kube_yaml_quotes_each_string_gos_yaml_would_read_as_another_type(text: str) -> None:
    from attune.operator import kubeyaml

    assert kubeyaml.go_reads_as_non_string(text)
    written = kubeyaml.dump({"args": [text]})
    assert written == f"args:\n- '{text}'\n" and yaml.safe_load(written) == {"args": [text]}


@pytest.mark.parametrize("text", ["--learning_rate", "-c", "train.py", "2Gi", "100m", "0.1.0", "10.0.0.1", "v1", "."])
def test_kube_yaml_leaves_other_strings_as_pyyaml_writes_them(text: str) -> None:
    from attune.operator import kubeyaml

    assert not kubeyaml.go_reads_as_non_string(text)
    assert kubeyaml.dump({"args": [text]}) == yaml.safe_dump({"args": [text]})
