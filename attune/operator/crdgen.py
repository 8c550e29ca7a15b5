"""The CRD generator: pydantic models → structural ``apiextensions.k8s.io/v1`` CRDs (no ``$ref``, no null unions),
with the TuningRun spec's edit policy (:data:`attune.operator.resources.EDIT_POLICY`) as CEL transition rules.

``attune operator crds`` (and ``make crds``) writes ``crds/*.yaml`` and the chart's template
(``charts/attune/templates/crds.yaml``: Helm upgrades templates, never a chart's ``crds/``); a test fails when the
committed files drift from the models. Every CRD carries :data:`REVISION_ANNOTATION` = :data:`SCHEMA_REVISION`, which
the operator's start-up check (:mod:`attune.operator.preflight`) compares with the served CRDs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from attune.operator.resources import (
    EDIT_POLICY,
    EDIT_RULE_MESSAGE,
    GROUP,
    RUN_PLURAL,
    TRIAL_PLURAL,
    VERSION,
    TuningRunSpec,
    TuningRunStatus,
    TuningTrialSpec,
    TuningTrialStatus,
)

_DROP = ("title", "$defs")

#: the CRDs' schema revision: bump it whenever the generated CRDs change in a way the operator relies on (a new field
#: it writes or reads, a new printer column, a new rule), so an operator refuses to run against an older served CRD.
#: Revision 1 is every CRD without the annotation (charts up to 0.1.0).
SCHEMA_REVISION = 7  # 3: spec.ttlSecondsAfterFinished, spec.metrics.dcgm; 4: status.outcome;
# 5: TuningTrial status.runningPods; 6: spec.metrics.adaptiveWindow; 7: TuningTrial status.decisionRecord and
# spec.kind certify (a certification trial was refused by the API server's enum)
REVISION_ANNOTATION = f"{GROUP}/schema-revision"
#: the chart's template of the CRDs, next to the canonical ``crds/`` directory
CHART_TEMPLATE = Path("charts/attune/templates/crds.yaml")


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref``s, turn ``X | None`` into ``nullable``, and mark free-form mappings as preserved."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **extra}, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) != 1:
            raise ValueError(f"a union of several types cannot be expressed structurally: {node['anyOf']}")
        merged = {**{k: v for k, v in node.items() if k not in ("anyOf", "default")}, **options[0]}
        if node.get("default") is not None:
            merged["default"] = node["default"]
        ref = _resolve(merged, defs)
        if nullable:
            ref["nullable"] = True
        return ref
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _resolve(v, defs) for name, v in value.items()}
        else:
            out[key] = _resolve(value, defs)
    if out.get("type") == "object" and out.get("additionalProperties") in (True, {}) and "properties" not in out:
        out.pop("additionalProperties")
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("additionalProperties") is False:
        out.pop("additionalProperties")  # structural schemas prune unknown fields instead
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), (int, float)) and not isinstance(out.get(bound), bool):
            out[plain] = out[bound]  # OpenAPI v3.0: the bound is a flag on minimum/maximum
            out[bound] = True
    if "const" in out:
        out["enum"] = [out.pop("const")]
    return out


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as a Kubernetes structural schema."""
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    return _resolve(raw, raw.get("$defs", {}))


def opaque(node: dict[str, Any]) -> bool:
    """True for a free-form mapping, whose contents CEL cannot see."""
    return bool(node.get("x-kubernetes-preserve-unknown-fields")) and "properties" not in node


def _rule(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


def _frozen_rule(field: str, path: str) -> str:
    return f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"


def _increase_rule(field: str) -> str:
    if field == "maxTrials":  # absent: no limit
        return f"!has(self.{field}) || (has(oldSelf.{field}) && self.{field} >= oldSelf.{field})"
    return f"!has(self.{field}) || !has(oldSelf.{field}) || self.{field} >= oldSelf.{field}"


def edit_rules(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (the TuningRun spec's structural schema) with :data:`EDIT_POLICY` as CEL transition rules: every
    field frozen but the free ones, budget limits that may only increase. An opaque field (``trialTemplate``, and
    ``recipe.inline`` inside ``recipe``: ``x-kubernetes-preserve-unknown-fields``) is frozen whole: the API server
    gives CEL no field inside one (a rule selecting one does not compile) but compares two of them by their whole
    contents (tests/k8s/test_real_crds.py shows both on kube-apiserver)."""
    out = copy.deepcopy(spec)
    props = out["properties"]
    rules: list[dict[str, str]] = []
    for name, node in props.items():
        how = EDIT_POLICY.get(name)
        if how == "free":
            continue
        if name == "budget":
            brules = []
            for sub in node["properties"]:
                policy = EDIT_POLICY.get(f"budget.{sub}")
                if policy == "increase":
                    brules.append(_rule(_increase_rule(sub), f"spec.budget.{sub} may only increase once the run "
                                                             "exists"))
                else:
                    brules.append(_rule(_frozen_rule(sub, f"budget.{sub}"), f"spec.budget.{sub} is frozen once the "
                                                                            "run exists"))
            node["x-kubernetes-validations"] = brules
            continue
        rules.append(_rule(_frozen_rule(name, name), f"spec.{name} is frozen once the run exists; "
                                                     f"{EDIT_RULE_MESSAGE.split(': ', 1)[1]}"))
    out["x-kubernetes-validations"] = rules
    return out


def _crd(kind: str, plural: str, short: list[str], spec: type[BaseModel], status: type[BaseModel],
         columns: list[dict[str, Any]]) -> dict[str, Any]:
    spec_schema = structural_schema(spec)
    if spec is TuningRunSpec:
        spec_schema = edit_rules(spec_schema)
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": structural_schema(status),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "annotations": {REVISION_ANNOTATION: str(SCHEMA_REVISION)}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower(),
                      "shortNames": short, "categories": ["attune"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": schema},
            }],
        },
    }


def build_crds() -> dict[str, dict[str, Any]]:
    """File name → CRD document, for both kinds."""
    run = _crd("TuningRun", RUN_PLURAL, ["trun"], TuningRunSpec, TuningRunStatus, [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Trials", "type": "integer", "jsonPath": ".status.trials.total"},
        {"name": "Best-Speedup", "type": "number", "jsonPath": ".status.best.speedup"},
        {"name": "Outcome", "type": "string", "jsonPath": ".status.outcome"},
        {"name": "Hours", "type": "number", "jsonPath": ".status.budget.hoursUsed"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ])
    trial = _crd("TuningTrial", TRIAL_PLURAL, ["ttrial"], TuningTrialSpec, TuningTrialStatus, [
        {"name": "Run", "type": "string", "jsonPath": ".spec.runRef"},
        {"name": "Kind", "type": "string", "jsonPath": ".spec.kind"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Outcome", "type": "string", "jsonPath": ".status.outcome"},
        {"name": "Decision", "type": "string", "jsonPath": ".status.decision", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ])
    return {f"{GROUP}_{RUN_PLURAL}.yaml": run, f"{GROUP}_{TRIAL_PLURAL}.yaml": trial}


_HEADER = "# Generated by `attune operator crds` from attune/operator/resources.py; do not edit.\n"


def render(doc: dict[str, Any]) -> str:
    """The YAML text of one CRD, as committed."""
    return _HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


def render_chart_template(docs: dict[str, dict[str, Any]] | None = None) -> str:
    """The chart's ``templates/crds.yaml``: every CRD behind ``crds.install``, with the chart's labels and
    ``helm.sh/resource-policy: keep`` (uninstalling the chart never deletes the CRDs, and with them every run)."""
    parts = []
    for doc in (docs or build_crds()).values():
        d = copy.deepcopy(doc)
        d["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep", **d["metadata"]["annotations"]}
        text = yaml.safe_dump(d, sort_keys=False, width=120)
        if "{{" in text or "}}" in text:
            raise ValueError(f"{d['metadata']['name']}: template delimiters in a generated CRD")
        name_line = f"  name: {d['metadata']['name']}\n"
        text = text.replace(name_line, name_line + '  labels: {{- include "attune.labels" . | nindent 4 }}\n', 1)
        parts.append(text)
    return (_HEADER.replace("#", "{{- /*", 1).rstrip("\n") + " */}}\n"
            "{{- if .Values.crds.install }}\n" + "---\n".join(parts) + "{{- end }}\n")


def write_crds(out: Path, chart_template: Path | None = None) -> list[Path]:
    """Write every CRD into ``out`` and, if given, the chart's template; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    docs = build_crds()
    for name, doc in docs.items():
        path = out / name
        path.write_text(render(doc))
        written.append(path)
    if chart_template is not None:
        chart_template.parent.mkdir(parents=True, exist_ok=True)
        chart_template.write_text(render_chart_template(docs))
        written.append(chart_template)
    return written
