"""``attune lessons``: list, show and forget the lessons the agent has learned (a JSON file you control)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from attune.agent.lessons import LessonStore

log = logging.getLogger(__name__)
app = typer.Typer(help="Lessons the tuning agent distilled from past runs (ATTUNE_LESSONS or the user data dir).",
                  no_args_is_help=True)
console = Console()

StoreOpt = Annotated[Path | None, typer.Option("--store", help="lessons file (default: $ATTUNE_LESSONS or user data dir)")]


@app.command("list")
def list_(store: StoreOpt = None, as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """List every lesson with its scope, action, measured effect and status."""
    s = LessonStore(store)
    lessons = s.all()
    if as_json:
        console.print_json(json.dumps([lz.model_dump(mode="json") for lz in lessons]))
        return
    if not lessons:
        console.print(f"no lessons in {s.path}")
        return
    table = Table(title=f"lessons ({s.path})")
    for col in ("id", "scope", "when", "action", "effect", "n", "status"):
        table.add_column(col, overflow="fold")
    for lz in lessons:
        table.add_row(lz.id, lz.scope.key(), lz.condition.bottleneck,
                      f"{lz.action.knob} {lz.action.direction} → {lz.action.value}", f"{lz.mean_effect:+.1%}",
                      str(len(lz.effects)), lz.status + (f" (demoted {lz.demotions}×)" if lz.demotions else "")
                      + (f", infeasible ({', '.join(lz.failures)})" if lz.is_infeasible else ""))
    console.print(table)
    noise = s.noise_records()
    if noise:
        clusters = {(n.scope.framework, n.scope.backend, n.scope.accelerator, n.scope.scale) for n in noise}
        console.print(f"run-to-run noise recorded by {len(noise)} run(s) on {len(clusters)} cluster(s) "
                      "(a later run there starts with it as a noise prior)")


@app.command("show")
def show(lesson_id: Annotated[str, typer.Argument(help="lesson id (or a unique prefix)")], store: StoreOpt = None) -> None:
    """Show one lesson in full."""
    lesson = LessonStore(store).get(lesson_id)
    if lesson is None:
        console.print(f"no lesson '{lesson_id}'")
        raise typer.Exit(code=1)
    console.print(lesson.summary())
    console.print_json(lesson.model_dump_json())


@app.command("forget")
def forget(lesson_id: Annotated[str, typer.Argument(help="lesson id (or a unique prefix)")], store: StoreOpt = None) -> None:
    """Delete one lesson from the store."""
    if not LessonStore(store).forget(lesson_id):
        console.print(f"no lesson '{lesson_id}'")
        raise typer.Exit(code=1)
    console.print(f"forgot lesson {lesson_id}")
