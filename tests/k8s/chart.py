"""The Helm chart under test and the Kubernetes versions its manifests are validated against."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "attune"
#: Kubernetes versions the chart and CRDs support (kubeVersion >= 1.27)
VERSIONS = ("1.27.0", "1.30.0", "1.33.0", "1.37.0")
#: the oldest and newest of them: the chart is rendered (helm --kube-version) at both
OLDEST, NEWEST = VERSIONS[0], VERSIONS[-1]
#: API groups of CRD-defined kinds, which kubernetes-validate has no schema for
CRD_DEFINED = ("cert-manager.io", "monitoring.coreos.com", "kopf.dev")


def render_text(helm_bin, *sets: str, kube_version: str = NEWEST, extra: tuple[str, ...] = ()) -> str:
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run([str(helm_bin), "template", "rel", str(CHART), "--namespace", "attune-system",
                           "--kube-version", kube_version, *extra, *args],
                          check=True, capture_output=True, text=True).stdout


def render(helm_bin, *sets: str, kube_version: str = NEWEST, extra: tuple[str, ...] = ()) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_text(helm_bin, *sets, kube_version=kube_version, extra=extra)) if d]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def named(docs, kind, name, namespace=None):
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name and
             (namespace is None or d["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, (kind, name, namespace, [d["metadata"] for d in by_kind(docs, kind)])
    return found[0]
