"""``attune gate``: ask the correctness gate about a proposed change from the command line.

``attune gate check RECIPE --set PATH=VALUE [--set ...] [--json]`` applies the assignments to the recipe
and prints the verdict. Exit codes: 0 admitted, 1 refused, 2 bad usage (unreadable recipe, malformed
``--set``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from attune.errors import AttuneError
from attune.gate.rules import evaluate
from attune.gate.sets import apply_sets
from attune.recipe.io import load_recipe
from attune.recipe.model import Recipe

app = typer.Typer(name="gate", help="The correctness gate: would a change still train the same model?",
                  no_args_is_help=True, add_completion=False)

EXIT_ADMITTED, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


@app.callback()
def _gate() -> None:
    """The correctness gate: would a change still train the same model?"""


def _load(recipe: Path, sets: list[str] | None) -> tuple[Recipe, dict[str, Any]]:
    """The baseline recipe and the candidate mapping with the --set changes; exit 2 on bad usage."""
    try:
        baseline = load_recipe(recipe)
        return baseline, apply_sets(baseline.model_dump(mode="python"), sets or [])
    except AttuneError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(EXIT_USAGE) from None


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
    baseline, candidate = _load(recipe, set_)
    verdict = evaluate(baseline, candidate)
    typer.echo(verdict.to_json() if as_json else verdict.render())
    raise typer.Exit(EXIT_ADMITTED if verdict.admitted else EXIT_REFUSED)


@app.command()
def verify(
    recipe: Path = typer.Argument(..., help="the baseline recipe YAML"),
    set_: Optional[list[str]] = typer.Option(None, "--set", "-s", metavar="PATH=VALUE", help="the change to verify"),
    steps: int = typer.Option(12, "--steps", min=2, help="optimizer steps each run trains"),
    out: Optional[Path] = typer.Option(None, "--out", help="directory for the three runs (default: a temp dir)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Train baseline, an equivalent layout and the candidate on this machine and compare their losses."""
    import tempfile

    from attune.backends.local import LocalBackend
    from attune.gate.verify import verify as run_verify

    baseline, candidate = _load(recipe, set_)
    run_dir = out or Path(tempfile.mkdtemp(prefix="attune-verify-"))
    result = run_verify(baseline, candidate, backend=LocalBackend(), steps=steps, run_dir=run_dir)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        typer.echo(("PASSED" if result.passed else "FAILED") + f": {result.reason}")
        if result.tolerance_max is not None:
            eq = result.equivalence
            typer.echo(f"drift reference: {result.drift_change}; tolerance up to {result.tolerance_max:.2e}; "
                       f"max |Δloss| {eq.max_abs_diff if eq else float('nan'):.2e}; runs in {run_dir}")
    raise typer.Exit(EXIT_ADMITTED if result.passed else EXIT_REFUSED)
