"""Which user-supplied URLs the operator may fetch (``spec.metrics.prometheusUrl``, ``spec.agent.endpoint``).

Those URLs are fetched from the operator's pod, with its network position and, for Prometheus, credentials from
the run's namespace: a TuningRun must not turn the operator into a proxy for the cluster's or the cloud's internal
endpoints. Only ``http``/``https`` URLs without user info whose host matches an allowed pattern are fetched. The
default patterns are cluster-local service names (``*.svc``, ``*.svc.cluster.local``) and loopback (the agent
sidecar in the operator's own pod, and the tests); ``attune operator run --allow-host PATTERN`` (repeatable) or
``ATTUNE_ALLOWED_HOSTS`` (comma-separated) replaces them. A pattern is a host name with an optional leading
``*.`` wildcard, ``loopback``, or an IP network in CIDR notation (``10.0.0.0/8``). IP literals match only a
network pattern (or ``loopback``), never a wildcard.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

DEFAULT_PATTERNS: tuple[str, ...] = ("*.svc", "*.svc.cluster.local", "loopback")
ENV = "ATTUNE_ALLOWED_HOSTS"

_patterns: tuple[str, ...] | None = None


def configure(patterns: list[str] | tuple[str, ...] | None) -> None:
    """Set the allowed host patterns for this process (``None`` or empty: ``$ATTUNE_ALLOWED_HOSTS`` or the
    defaults)."""
    global _patterns
    _patterns = tuple(p.strip().lower() for p in patterns if p.strip()) if patterns else None


def patterns() -> tuple[str, ...]:
    if _patterns:
        return _patterns
    env = [p.strip().lower() for p in os.environ.get(ENV, "").split(",") if p.strip()]
    return tuple(env) or DEFAULT_PATTERNS


def _host_matches(host: str, pattern: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if pattern == "loopback":
        return (ip is not None and ip.is_loopback) or host == "localhost"
    if "/" in pattern:
        try:
            return ip is not None and ip in ipaddress.ip_network(pattern, strict=False)
        except ValueError:
            return False
    if ip is not None:
        return False
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def url_problem(url: str | None, what: str) -> str | None:
    """Why ``url`` may not be fetched (``None``: it may)."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".").lower()
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return f"{what}: not a valid URL"
    if parts.scheme not in ("http", "https"):
        return f"{what}: only http and https URLs are fetched, not {parts.scheme or 'a scheme-less URL'}"
    if parts.username is not None or parts.password is not None:
        return f"{what}: credentials in the URL are not allowed (give them through a Secret)"
    if not host:
        return f"{what}: the URL names no host"
    allowed = patterns()
    if not any(_host_matches(host, p) for p in allowed):
        return (f"{what}: host {host} is not one the operator may fetch (allowed: {', '.join(allowed)}; the "
                f"operator's --allow-host or ${ENV} sets them)")
    return None
