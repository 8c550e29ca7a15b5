"""``attune report``, ``attune runs``, ``attune card`` and ``attune leaderboard`` (mounted by
:func:`attune.commands.mount`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from attune.errors import AttuneError


class _DefaultToMake(TyperGroup):
    """``attune card DIR`` means ``attune card make DIR`` (a run directory is never a sub-command's name)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["make", *args]
        return list(super().parse_args(ctx, args))


card_app = typer.Typer(cls=_DefaultToMake, no_args_is_help=True, add_completion=False,
                       help="Recipe cards: `attune card RUN_DIR` makes one from a finished run; `attune card verify "
                            "CARD` re-runs its claim.")
leaderboard_app = typer.Typer(no_args_is_help=True, add_completion=False,
                              help="The static leaderboard site of recipe cards.")


def _fail(err: AttuneError, code: int = 2) -> None:
    from attune.commands import fail

    fail(err, code)


def report(
    run_dir: Annotated[Path, typer.Argument(help="a run directory made by `attune tune`")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="write the page here (default DIR/report.html)")]
        = None,
    png: Annotated[bool, typer.Option("--png/--no-png", help="also redraw DIR/throughput.png")] = True,
) -> None:
    """Write the run's self-contained HTML report (charts, trials, diff, loss curves, lessons; opens offline)."""
    from attune.commands import console
    from attune.report.html import write_report
    from attune.report.run import load_run

    try:
        view = load_run(run_dir)
        path = write_report(view, out)
        if png:
            from attune.report.plots import throughput_plot
            from attune.report.result import build_result

            throughput_plot(build_result(view.state), run_dir / "throughput.png")
    except AttuneError as err:
        _fail(err)
    console.print(f"report: [bold]{path}[/]  (open it in a browser: file://{path.resolve()})")


def runs(
    directory: Annotated[Path, typer.Argument(help="where runs live (searched three levels deep)")] = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """List past tuning runs with their status, best speedup and accelerator-hours."""
    from attune.commands import console, print_listing
    from attune.report.environment import iso
    from attune.report.result import build_result
    from attune.report.run import find_runs, load_run

    rows: list[dict[str, Any]] = []
    for d in find_runs(directory):
        try:
            view = load_run(d)
        except (AttuneError, ValueError, KeyError) as err:
            rows.append({"run": str(d), "status": "unreadable", "error": str(err).splitlines()[0]})
            continue
        res = build_result(view.state)
        if view.state.finished and (d / "result.json").exists():  # what the run itself reported
            try:
                res = {**res, **json.loads((d / "result.json").read_text())}
            except (OSError, ValueError):
                pass
        rows.append({"run": str(d), "recipe": res["recipe"], "framework": res["framework"], "backend": view.backend,
                     "policy": view.policy, "status": view.status, "stop_reason": res["stop_reason"],
                     "started": iso(view.started_at), "trials": res["trials_launched"],
                     "failed": res["trials_failed"], "refused": res["trials_refused"], "speedup": res["speedup"],
                     "best_changes": res["best_changes"], "hours": res["budget_used_hours"],
                     "budget_hours": res["budget_hours"],
                     "report": str(d / "report.html") if (d / "report.html").exists() else None})
    rows.sort(key=lambda r: r.get("started") or "", reverse=True)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, default=str) + "\n")
        return
    if not rows:
        console.print(f"no runs under {directory}")
        return
    listing: list[tuple[str, ...]] = []
    for r in rows:
        try:
            name = str(Path(r["run"]).relative_to(directory)) or r["run"]
        except ValueError:
            name = r["run"]
        if "error" in r:
            listing.append((name, "—", r["status"], "—", "—", "—", "—", r["error"]))
            continue
        sp = f"{r['speedup']:.3f}×" if r["speedup"] else "—"
        started = (r["started"] or "—").replace("T", " ")[:16] if r["started"] else "—"
        listing.append((name, str(r["backend"]), r["status"],
                        f"{r['trials']}" + (f" ({r['failed']} failed)" if r["failed"] else ""), sp,
                        f"{_hours(r['hours'])}/{_hours(r['budget_hours'])}", started, str(r["stop_reason"] or "")))
    print_listing(f"tuning runs under {directory}", ("run", "backend", "status", "trials", "speedup",
                                                     "accel-hours", "started", "stop reason"), listing)


def _hours(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


@card_app.command("make")
def card_make(
    run_dir: Annotated[Path, typer.Argument(help="a finished run directory")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="directory for the card (default: the run's)")]
        = None,
    card_id: Annotated[Optional[str], typer.Option(
        "--id", help="card id / file name (default RECIPE--KIND-POLICY-sSEED)")]
        = None,
    recipe_path: Annotated[Optional[str], typer.Option(
        "--recipe-path", help="the baseline recipe file the reproduce command should name")] = None,
) -> None:
    """Make a recipe card (`ID.yaml`, beside a copy of the run's result.json) from a finished run."""
    from attune.cards.build import make_card
    from attune.commands import console

    try:
        files = make_card(run_dir, out, cid=card_id, recipe_path=recipe_path)
    except AttuneError as err:
        _fail(err)
    c = files.card
    console.print(f"card: [bold]{files.card_path}[/]  ({c.summary})")


@card_app.command("check")
def card_check(
    cards: Annotated[list[Path], typer.Argument(help="card files or directories of cards")],
) -> None:
    """Check cards: schema, the digest of their run's result.json, and every headline number against it."""
    from attune.cards.io import check_card, find_cards
    from attune.commands import console

    bad = 0
    n = 0
    try:
        paths = [p for c in cards for p in find_cards(c)]
    except AttuneError as err:
        _fail(err)
    for p in paths:
        n += 1
        problems = check_card(p)
        if problems:
            bad += 1
            console.print(f"[red]✗[/] {p}")
            for pr in problems:
                console.print(f"    {pr}")
    console.print(f"{n - bad} of {n} cards agree with their runs")
    raise typer.Exit(1 if bad else 0)


@card_app.command("verify")
def card_verify(
    card: Annotated[Path, typer.Argument(help="a card file")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="keep the reproduced run here")] = None,
    timeout: Annotated[float, typer.Option(help="seconds the reproduce command may take")] = 3600.0,
) -> None:
    """Re-run the card's reproduce command and say whether its claim still holds.
    Exit 0: it holds; 1: it does not; 3: the card's backend is not available here; 2: bad usage."""
    from rich.table import Table

    from attune.cards.verify import verify
    from attune.commands import console

    try:
        v = verify(card, out=out, timeout_s=timeout)
    except AttuneError as err:
        _fail(err)
    table = Table(title=f"verify {v.card.id}", show_header=False)
    table.add_row("claim", v.card.summary)
    table.add_row("command", v.card.reproduce.command)
    for what, ok, detail in v.checks:
        mark = "[green]✓[/]" if ok else "[red]✗[/]" if ok is False else "·"
        table.add_row(what, f"{mark} {detail}")
    if v.run_dir:
        table.add_row("reproduced run", str(v.run_dir))
    console.print(table)
    colour = "green" if v.holds else "yellow" if v.code == 3 else "red"
    console.print(f"[bold {colour}]{v.summary}[/] ({v.wall_s:.1f} s)")
    raise typer.Exit(v.code)


@card_app.command("schema")
def card_schema(
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="write the JSON Schema here")] = None,
) -> None:
    """Print (or write) the JSON Schema of recipe cards."""
    from attune.cards.model import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out is None:
        sys.stdout.write(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


@leaderboard_app.command("build")
def leaderboard_build(
    cards_dir: Annotated[Path, typer.Argument(help="directory of recipe cards (e.g. openrecipes/cards)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="site directory to write")] = Path("runs/leaderboard"),
) -> None:
    """Render the static leaderboard: ranked recipes, filters, a page per card, index.json (opens from file://)."""
    from attune.commands import console
    from attune.leaderboard.site import build_site

    try:
        site = build_site(cards_dir, out)
    except AttuneError as err:
        _fail(err, 1)
    console.print(f"leaderboard: [bold]{site.index}[/] ({len(site.entries)} cards in {len(site.groups)} groups)")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("runs")(runs)
    app.add_typer(card_app, name="card")
    app.add_typer(leaderboard_app, name="leaderboard")
