"""The Prometheus organisation of each tenant namespace: the ``X-Scope-OrgID`` header multi-tenant Prometheus
servers (Cortex, Mimir, Thanos Receive) read to pick whose series a query sees. It is the platform's to set, never a
run's: behind an allowed Mimir host, a run naming its own organisation could read any tenant's series.

The operator is told the mapping (``--prometheus-org NAMESPACE=ORG``, repeatable, ``*=ORG`` for every namespace not
named; the chart's ``operator.prometheusOrgs``) and sends the organisation of the run's namespace, or no header.
A run's ``spec.metrics.prometheus.tenant`` (an earlier version's field) is admitted only when it names that same
organisation, and is never what the operator sends.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: a namespace (DNS-1123 label) or ``*``; an organisation as Mimir and Cortex accept it (the field's own pattern)
_NAMESPACE = re.compile(r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$")
_ORG = re.compile(r"^[A-Za-z0-9_.|-]{1,150}$")

_orgs: dict[str, str] = {}


def parse(items: Iterable[str]) -> dict[str, str]:
    """``NAMESPACE=ORG`` items as a mapping; :class:`ValueError` naming the first bad item and the form."""
    out: dict[str, str] = {}
    for item in items:
        ns, sep, org = item.partition("=")
        ns, org = ns.strip(), org.strip()
        if not sep or not _NAMESPACE.match(ns) or not _ORG.match(org):
            raise ValueError(f"--prometheus-org {item!r}: expected NAMESPACE=ORG (a namespace or *, then an "
                             f"organisation of letters, digits and _.|-)")
        if ns in out and out[ns] != org:
            raise ValueError(f"--prometheus-org: namespace {ns} is mapped twice ({out[ns]}, {org})")
        out[ns] = org
    return out


def configure(items: Iterable[str]) -> None:
    """Set this process's mapping (the operator's start-up)."""
    global _orgs
    _orgs = parse(items)


def org_for(namespace: str) -> str | None:
    """The organisation the operator sends for a run of ``namespace`` (``None``: no header)."""
    return _orgs.get(namespace) or _orgs.get("*")


def run_org_problem(namespace: str, requested: str | None) -> str | None:
    """Why a run's ``spec.metrics.prometheus.tenant`` must be refused (``None``: unset, or the platform's own)."""
    if requested is None:
        return None
    platform = org_for(namespace)
    if platform == requested:
        return None
    said = f"maps namespace {namespace} to {platform}" if platform else f"maps namespace {namespace} to none"
    return (f"spec.metrics.prometheus.tenant: the Prometheus organisation (X-Scope-OrgID) is the platform's to set, "
            f"not a run's; the operator {said} (its --prometheus-org, the chart's operator.prometheusOrgs): remove "
            f"the field")
