"""Which user-supplied URLs the operator may fetch (``spec.metrics.prometheusUrl``, ``spec.agent.endpoint``).

Those URLs are fetched from the operator's pod, with its network position and, for Prometheus, credentials from
the run's namespace: a TuningRun must not turn the operator into a proxy for the cluster's or the cloud's internal
endpoints. Only ``http``/``https`` URLs without user info whose host matches an allowed pattern are fetched. The
default patterns are Services of the run's own namespace and loopback (the agent sidecar in the operator's own
pod, and the tests); ``attune operator run --allow-host PATTERN`` (repeatable) or
``ATTUNE_ALLOWED_HOSTS`` (comma-separated) replaces them. A pattern is a host name with an optional leading
``*.`` wildcard, ``loopback``, ``namespace`` (a Service in the run's own namespace:
``name.<ns>.svc``, ``name.<ns>.svc.cluster.local``), or an IP network in CIDR notation (``10.0.0.0/8``). IP
literals match only a network pattern (or ``loopback``), never a wildcard.

The default is ``namespace`` and ``loopback``: a tenant's run reaches Services of its own namespace only (a run's
endpoint in another tenant's namespace would sidestep that tenant's NetworkPolicies with the operator's network
position); the platform names shared ones (``--allow-host prometheus-operated.monitoring.svc``).

Credentials (a Prometheus bearer token or basic auth) go only over https, or to loopback: a token sent over plain
http to a cluster Service can be read on the way. ``--allow-insecure-credentials`` (the platform's choice) lifts it.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

DEFAULT_PATTERNS: tuple[str, ...] = ("namespace", "loopback")
ENV = "ATTUNE_ALLOWED_HOSTS"

_patterns: tuple[str, ...] | None = None
_insecure_credentials = False


def configure(patterns: list[str] | tuple[str, ...] | None, insecure_credentials: bool = False) -> None:
    """Set the allowed host patterns for this process (``None`` or empty: ``$ATTUNE_ALLOWED_HOSTS`` or the
    defaults), and whether credentials may go over plain http."""
    global _patterns, _insecure_credentials
    _patterns = tuple(p.strip().lower() for p in patterns if p.strip()) if patterns else None
    _insecure_credentials = insecure_credentials


def patterns() -> tuple[str, ...]:
    if _patterns:
        return _patterns
    env = [p.strip().lower() for p in os.environ.get(ENV, "").split(",") if p.strip()]
    return tuple(env) or DEFAULT_PATTERNS


def _host_matches(host: str, pattern: str, namespace: str | None = None) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if pattern == "loopback":
        return (ip is not None and ip.is_loopback) or host == "localhost"
    if pattern == "namespace":  # a Service of the run's namespace (any namespace's where none is given)
        if ip is not None:
            return False
        parts = host.split(".")
        if len(parts) < 2:
            return False  # a bare name resolves in the operator's own namespace, not the run's
        # name.<ns>.svc[.cluster.local]: "name.ns" alone is indistinguishable from a domain (evil.com)
        return len(parts) >= 3 and ".".join(parts[2:]) in ("svc", "svc.cluster.local") and \
            (namespace is None or parts[1] == namespace)
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


def url_problem(url: str | None, what: str, namespace: str | None = None) -> str | None:
    """Why ``url`` may not be fetched for a run in ``namespace`` (``None``: it may)."""
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
    if not any(_host_matches(host, p, namespace) for p in allowed):
        return (f"{what}: host {host} is not one the operator may fetch (allowed: {', '.join(allowed)}; the "
                f"operator's --allow-host or ${ENV} sets them)")
    return None


def credentials_problem(url: str | None, what: str) -> str | None:
    """Why credentials may not be sent to ``url`` (``None``: they may): only over https, or to loopback, unless the
    operator runs with ``--allow-insecure-credentials``."""
    if not url or _insecure_credentials:
        return None
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".").lower()
    except ValueError:
        return None  # url_problem says why
    if parts.scheme == "https" or _host_matches(host, "loopback"):
        return None
    return (f"{what}: credentials are sent only over https (this URL is {parts.scheme}://{host}); use an https "
            "URL, or the platform may allow plain http with the operator's --allow-insecure-credentials")
