"""attune's CRDs in the chart: a template (Helm upgrades templates, never a chart's crds/), generated from the models
like crds/, behind crds.install, kept on uninstall, and carrying the schema revision the operator checks."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from attune.operator.crdgen import (
    CHART_TEMPLATE,
    REVISION_ANNOTATION,
    SCHEMA_REVISION,
    build_crds,
    render_chart_template,
)
from tests.k8s.chart import CHART, ROOT

pytestmark = pytest.mark.k8s


def test_committed_chart_template_matches_the_models():
    path = ROOT / CHART_TEMPLATE
    assert path.read_text() == render_chart_template(), f"{path} drifted from the models: run `make crds`"
    assert not (CHART / "crds").exists()  # Helm would install those once and never upgrade them


def render(helm, *sets):
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([str(helm), "template", "rel", str(CHART), "-n", "attune-system", *args],
                         check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] == "CustomResourceDefinition"
            and d["spec"]["group"] == "attune.dev"]  # (kopf's peering CRDs: test_chart_modes)


def test_crds_render_from_templates_with_keep_and_revision(helm):
    crds = {d["metadata"]["name"]: d for d in render(helm)}
    assert set(crds) == {d["metadata"]["name"] for d in build_crds().values()}
    for name, crd in crds.items():
        ann = crd["metadata"]["annotations"]
        assert ann["helm.sh/resource-policy"] == "keep"  # helm uninstall never deletes every TuningRun
        assert ann[REVISION_ANNOTATION] == str(SCHEMA_REVISION)
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        generated = next(d for d in build_crds().values() if d["metadata"]["name"] == name)
        assert crd["spec"] == generated["spec"]
    assert render(helm, "crds.install=false") == []


def test_canonical_crds_carry_the_revision():
    for path in (ROOT / "crds").glob("attune.dev_*.yaml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["metadata"]["annotations"][REVISION_ANNOTATION] == str(SCHEMA_REVISION), path
