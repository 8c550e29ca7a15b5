"""The TuningRun CRD schema as jsonschema sees it: walking a schema, and a validator that refuses unknown fields."""

from __future__ import annotations

import copy

import jsonschema

from attune.operator.crdgen import build_crds


def walk(node, path=""):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")


def strict(schema):
    """The CRD schema for jsonschema (draft 4: boolean exclusive bounds), unknown fields refused like pruning would."""
    s = copy.deepcopy(schema)
    for _, node in walk(s):
        if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
    return s


def validator():
    schema = build_crds()["attune.dev_tuningruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(strict(schema))
