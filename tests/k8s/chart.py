"""The Helm chart under test and the Kubernetes versions its manifests are validated against."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "attune"
#: Kubernetes versions the chart and CRDs support (kubeVersion >= 1.27)
VERSIONS = ("1.27.0", "1.30.0", "1.33.0", "1.37.0")
#: the oldest and newest of them: the chart is rendered (helm --kube-version) at both
OLDEST, NEWEST = VERSIONS[0], VERSIONS[-1]
#: API groups of CRD-defined kinds, which kubernetes-validate has no schema for
CRD_DEFINED = ("cert-manager.io", "monitoring.coreos.com", "kopf.dev")
