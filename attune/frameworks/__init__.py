"""The framework registry: one package per framework under ``attune/frameworks/<name>/``, one registry for all.

Recipe validation, the local backend, the operator's trial manifests, the gate's contract, the playbook's rules,
diagnosis, CLI help and the CRD's enum all read this registry. A framework package registers itself on import
with :func:`register`; the built-in ones are imported lazily on first use, so importing attune stays cheap.
Adding a framework is one new package (plus its tests) and one line in ``_BUILTIN``.
"""

from __future__ import annotations

import importlib

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

#: built-in frameworks: name → module that registers it
_BUILTIN = {"torch": "attune.frameworks.torch", "megatron": "attune.frameworks.megatron", "hf": "attune.frameworks.hf",
            "deepspeed": "attune.frameworks.deepspeed", "torchtitan": "attune.frameworks.torchtitan"}
_REGISTRY: dict[str, Framework] = {}
_loaded = False


def register(framework: Framework) -> Framework:
    """Make ``framework`` available by its name (called by each framework package on import)."""
    _REGISTRY[framework.name] = framework
    return framework


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN.values():
        importlib.import_module(module)


def names() -> list[str]:
    """Every registered framework name, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def get(name: str) -> Framework:
    """The framework called ``name``; :class:`KeyError` with the known names otherwise."""
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown framework {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def unknown_message(name: object) -> str:
    return f"unknown framework {name!r}; choose one of: {', '.join(names())}"


__all__ = ["ContractField", "Framework", "Launch", "LogParser", "Observation", "Rule", "Signature", "Tier",
           "TrialLaunch", "get", "names", "register", "unknown_message"]
