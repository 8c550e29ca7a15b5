"""The frameworks: one package per framework under ``attune/frameworks/<name>/``, behind one seam
(:class:`~attune.frameworks.base.Framework`) and one registry (:mod:`attune.registry`, re-exported here).

Recipe validation, the local backend, the operator's trial manifests, the gate's contract, the playbook's rules,
diagnosis, CLI help and the CRD's enum all read the registry. Adding a framework is one new package (plus its tests)
and one line in ``attune.registry.BUILTIN``.
"""

from __future__ import annotations

from attune.frameworks.base import (
    ContractField,
    Framework,
    Launch,
    LogParser,
    Observation,
    Rule,
    Signature,
    Tier,
    TrialLaunch,
)
from attune.registry import BUILTIN, get, names, register, unknown_message, unregister

__all__ = [
    "BUILTIN",
    "ContractField",
    "Framework",
    "Launch",
    "LogParser",
    "Observation",
    "Rule",
    "Signature",
    "Tier",
    "TrialLaunch",
    "get",
    "names",
    "register",
    "unknown_message",
    "unregister",
]
