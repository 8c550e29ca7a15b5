"""attune's sub-commands, one module each, mounted on the main ``attune`` app (:mod:`attune.cli`) by :func:`mount`:
``gate``, ``lessons``, ``agent``, ``operator`` (typer apps of their own), and ``sim``/``bench`` and the report,
card and leaderboard commands (registered on the main app). A command module may be absent from a build (its
subsystem's dependencies not installed): it is skipped. The consoles and :func:`fail` are shared with the main app.
"""

from __future__ import annotations

import importlib
from typing import NoReturn

import typer
from rich.console import Console

from attune.errors import AttuneError

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)

#: sub-applications: module → the name of its command group
GROUPS = (("attune.commands.gate", "gate"), ("attune.commands.lessons", "lessons"),
          ("attune.commands.agent", "agent"), ("attune.commands.operator", "operator"))
#: modules that register commands on the main app itself (``register(app)``)
REGISTERING = ("attune.commands.sim", "attune.commands.report")


def fail(err: AttuneError, code: int = 2) -> NoReturn:
    """Say what went wrong (no traceback) and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {err}")
    raise typer.Exit(code)


def mount(app: typer.Typer) -> None:
    """Add every sub-command this build has to ``app``."""
    for module, name in GROUPS:
        try:
            sub = importlib.import_module(module)
        except ImportError:
            continue
        app.add_typer(sub.app, name=name)
    for module in REGISTERING:
        try:
            importlib.import_module(module).register(app)
        except ImportError:
            continue


__all__ = ["GROUPS", "REGISTERING", "console", "err_console", "fail", "mount"]
