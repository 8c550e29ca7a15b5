"""``attune gate``: ask the correctness gate about a proposed change from the command line.

``attune gate check RECIPE --set PATH=VALUE [--set ...] [--json]`` applies the assignments to the recipe
and prints the verdict. Exit codes: 0 admitted, 1 refused, 2 bad usage (unreadable recipe, malformed
``--set``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attune.errors import AttuneError
from attune.gate.rules import evaluate
from attune.gate.sets import apply_sets
from attune.recipe.io import load_recipe

app = typer.Typer(name="gate", help="The correctness gate: would a change still train the same model?",
                  no_args_is_help=True, add_completion=False)

EXIT_ADMITTED, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


@app.callback()
def _gate() -> None:
    """The correctness gate: would a change still train the same model?"""


@app.command()
def check(
    recipe: Path = typer.Argument(..., help="the baseline recipe YAML (the training contract reference)"),
    set_: Optional[list[str]] = typer.Option(
        None, "--set", "-s", metavar="PATH=VALUE",
        help="a change to check, e.g. knobs.micro_batch_size=4, compile_mode=default, training.optimizer.lr=1e-3; "
             "repeat for several"),
    as_json: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
) -> None:
    """Check RECIPE with the --set changes applied; exit 0 if admitted, 1 if refused, 2 on bad usage."""
    try:
        baseline = load_recipe(recipe)
        candidate = apply_sets(baseline.model_dump(mode="python"), set_ or [])
    except AttuneError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    verdict = evaluate(baseline, candidate)
    typer.echo(verdict.to_json() if as_json else verdict.render())
    raise typer.Exit(EXIT_ADMITTED if verdict.admitted else EXIT_REFUSED)
