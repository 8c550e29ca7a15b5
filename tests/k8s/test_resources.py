"""CRDs generated from the models: drift, structure, printer columns, and the examples against the schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from attune.operator.crdgen import build_crds, render
from attune.operator.resources import TuningRunSpec
from tests.k8s.schema import validator, walk

pytestmark = pytest.mark.k8s
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("directory", ["crds"])  # the chart's template: tests/k8s/test_chart_crds.py
def test_committed_crds_match_the_models(directory):
    for name, doc in build_crds().items():
        path = ROOT / directory / name
        assert path.exists(), f"{path} is missing: run `make crds`"
        assert path.read_text() == render(doc), f"{path} drifted from attune/operator/resources.py: run `make crds`"


def test_crds_are_structural():
    for doc in build_crds().values():
        schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in walk(schema):
            assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
            assert not isinstance(node.get("exclusiveMinimum"), (int, float)) or \
                isinstance(node["exclusiveMinimum"], bool), path
        # every declared property has a type (structural schemas require it)
        for path, node in walk(schema):
            if path.rsplit(".", 2)[-2:-1] == ["properties"]:
                assert "type" in node, path


def test_tuningrun_printer_columns():
    cols = {c["name"]: c["jsonPath"] for c in build_crds()["attune.dev_tuningruns.yaml"]["spec"]["versions"][0]
            ["additionalPrinterColumns"]}
    assert cols == {"Phase": ".status.phase", "Trials": ".status.trials.total", "Best-Speedup": ".status.best.speedup",
                    "Outcome": ".status.outcome", "Hours": ".status.budget.hoursUsed", "Age": ".metadata.creationTimestamp"}


def test_good_and_bad_examples_fit_the_schema():
    v = validator()
    for name in ("tuningrun-good.yaml", "tuningrun-bad.yaml"):
        doc = yaml.safe_load((ROOT / "examples" / name).read_text())
        errors = [e.message for e in v.iter_errors(doc)]
        assert not errors, (name, errors)
        TuningRunSpec.model_validate(doc["spec"])


def test_illegal_example_is_refused_by_the_schema():
    doc = yaml.safe_load((ROOT / "examples" / "tuningrun-illegal.yaml").read_text())
    messages = " ".join(e.message for e in validator().iter_errors(doc))
    assert "trialTemplate" in messages  # required field missing (it is misspelt)
    assert "-1" in messages  # budget below its minimum
