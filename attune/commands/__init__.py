"""attune's sub-commands, one module each, mounted on the main ``attune`` app (:mod:`attune.cli`) by :func:`mount`:
``gate``, ``lessons``, ``agent``, ``operator`` (typer apps of their own), and ``sim``/``bench`` and the report,
card and leaderboard commands (registered on the main app). A command module may be absent from a build (its
subsystem's dependencies not installed): it is skipped. The consoles and :func:`fail` are shared with the main app.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
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


#: the narrowest terminal a table of long descriptions still reads in; narrower ones get one block per row
WIDE_LISTING = 120


def print_listing(title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """A listing whose last column is prose, in the form its reader can use: piped (not a terminal), one
    tab-separated line per row under a header, nothing wrapped (for grep, cut and awk); on a terminal of at least
    :data:`WIDE_LISTING` columns, a table whose prose column takes the room; on a narrower one (80 columns), one
    block per row: its first column in bold with the short fields beside it, the prose wrapped below."""
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    if not console.is_terminal:
        sys.stdout.write("\t".join(columns) + "\n")
        for row in rows:
            sys.stdout.write("\t".join(" ".join(str(v).split()) for v in row) + "\n")
        return
    if console.width >= WIDE_LISTING:
        table = Table(title=title)
        for col in columns[:-1]:
            table.add_column(col, overflow="fold", max_width=28)
        table.add_column(columns[-1], ratio=1)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    console.print(Text(title, style="bold"))
    for row in rows:
        head = Text()
        head.append(row[0], style="bold cyan")
        for col, value in zip(columns[1:-1], row[1:-1], strict=True):
            head.append(f"  {col}: ", style="dim").append(value)
        console.print(head)
        console.print(Padding(Text(row[-1]), (0, 0, 1, 4)))
