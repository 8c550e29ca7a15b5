"""The framework registry, below everything that looks a framework up by name (a recipe validating its knobs, the
backends, the gate, the operator, the CLI): names → :class:`~attune.frameworks.base.Framework` objects.

Each framework package registers itself on import with :func:`register`; the built-in ones are imported on first
use (their modules named in ``BUILTIN``), so importing attune stays cheap and nothing below the frameworks imports
one. Adding a framework is one new package under ``attune/frameworks/`` and one line in ``BUILTIN``; a package
outside attune (a plug-in, a test's toy framework) calls :func:`register` itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attune.frameworks.base import Framework

#: built-in frameworks: name → module that registers it
BUILTIN = {"torch": "attune.frameworks.torch", "megatron": "attune.frameworks.megatron", "hf": "attune.frameworks.hf",
           "deepspeed": "attune.frameworks.deepspeed", "torchtitan": "attune.frameworks.torchtitan",
           "command": "attune.frameworks.command",
           "llamafactory": "attune.frameworks.llamafactory",
           "axolotl": "attune.frameworks.axolotl",
           "lightning": "attune.frameworks.lightning"}
_REGISTRY: dict[str, Framework] = {}
_loaded = False


def register(framework: Framework) -> Framework:
    """Make ``framework`` available by its name (called by each framework package on import)."""
    _REGISTRY[framework.name] = framework
    return framework


def unregister(name: str) -> None:
    """Forget the framework called ``name`` (a plug-in or test that registered one and is done with it)."""
    _REGISTRY.pop(name, None)


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN.values():
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


__all__ = ["BUILTIN", "get", "names", "register", "unknown_message", "unregister"]
