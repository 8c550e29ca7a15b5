"""Who the operator is to the API server: the user its requests are made as, so that its admission webhook can tell
its own writes of TuningTrials from anybody else's (a trial's record is the run's journal: only the operator may
write it)."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

#: where a pod's service-account token is mounted
TOKEN_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def token_subject(token: str) -> str | None:
    """The ``sub`` claim of a service-account token (a JWT; read, not verified: it is our own), e.g.
    ``system:serviceaccount:attune-system:attune``; ``None`` if it is not a JWT with one."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, TypeError):
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return sub if isinstance(sub, str) and sub else None


def own_users(configured: tuple[str, ...] = (), token_path: Path = TOKEN_PATH) -> tuple[str, ...]:
    """The users whose writes of TuningTrials the webhook admits: ``configured`` (``--trial-writer``), else the
    operator's own service account read from its mounted token; empty (no check, with a warning) when neither."""
    if configured:
        return configured
    try:
        sub = token_subject(token_path.read_text())
    except OSError:
        sub = None
    if sub is None:
        log.warning("the operator's own user is unknown (no service-account token, no --trial-writer): the webhook "
                    "cannot refuse TuningTrial writes by other users")
        return ()
    return (sub,)
