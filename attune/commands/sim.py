"""The ``attune sim`` and ``attune bench`` commands (mounted by :func:`attune.commands.mount`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer


def _recipe_with_sets(path: Path, sets: list[str]) -> Any:
    import yaml

    from attune.gate.sets import apply_sets
    from attune.recipe.io import load_recipe, parse_recipe

    if not sets:
        return load_recipe(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        from attune.errors import RecipeError

        raise RecipeError(f"cannot read recipe {path}: {err.strerror}") from None
    return parse_recipe(apply_sets(data, sets), f"{path} with --set {' '.join(sets)}")


def sim(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML (framework: megatron)")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="PATH=VALUE edit, e.g. micro_batch_size=2")] = None,
    seed: Annotated[Optional[int], typer.Option(help="add run-to-run noise with this seed (default: noiseless)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Predict one training step of RECIPE on its cluster: step time and breakdown, throughput, memory, signals."""
    from attune.commands import console
    from attune.commands import fail as _fail
    from attune.errors import AttuneError
    from attune.sim import simulate

    try:
        r = _recipe_with_sets(recipe, list(set_ or []))
        res = simulate(r, seed=seed)
    except AttuneError as err:
        _fail(err)
    except ValueError as err:
        _fail(AttuneError(str(err)))
    doc = {"recipe": r.name, "devices": r.resources.devices, "accelerator": r.resources.accelerator,
           "outcome": res.outcome, "step_time_s": res.step_time_s,
           "tokens_per_s_per_device": res.tokens_per_s_per_device, "mfu": res.mfu,
           "peak_memory_gb": res.peak_memory_gb, "breakdown_s": res.breakdown, "memory_gb": res.memory_gb,
           "signals": res.signals, "message": res.message}
    if as_json:
        console.print_json(json.dumps(doc, default=str))
        return
    from rich.table import Table

    table = Table(title=f"simulated: {r.name} ({r.resources.devices} × {r.resources.accelerator})", show_header=False)
    if res.outcome != "succeeded":
        table.add_row("outcome", f"[red]{res.outcome}[/]: {res.message}")
    else:
        table.add_row("step time", f"{res.step_time_s:.3f} s")
        table.add_row("throughput", f"{res.tokens_per_s_per_device:,.0f} tokens/s per device (MFU {res.mfu:.1%})")
    table.add_row("peak memory", f"{res.peak_memory_gb:.1f} GB")
    for k, v in res.breakdown.items():
        table.add_row(f"  {k}", f"{v:.4f} s")
    for k, v in res.signals.items():
        table.add_row(f"  {k}", f"{v:.3g}")
    console.print(table)


def bench(
    suite: Annotated[str, typer.Option("--suite", help="suite directory, or a name under benchmarks/")] = "suite",
    tuners: Annotated[str, typer.Option("--tuners", help="comma list of attune,random,tpe,gp,cmaes,grid,llm,optico "
                                                         "(llm, optico: only where ATTUNE_LLM_BASE_URL is set)")] =
        "attune,random,tpe,gp,cmaes,grid",
    budget: Annotated[str, typer.Option("--budget", help="accelerator-hours per recipe, or Nt for N trials' worth; "
                                                         "a comma list (8t,15t,30t) runs each")] =
        "15t",
    seeds: Annotated[int, typer.Option("--seeds", help="seeds per (recipe, tuner)")] = 5,
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("runs/bench"),
    only: Annotated[Optional[str], typer.Option("--only", help="comma list of recipe names to keep")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="keep the first N recipes of the suite")] = None,
    jobs: Annotated[int, typer.Option("--jobs", help="parallel worker processes")] = 1,
    attune_policy: Annotated[str, typer.Option("--attune-policy", help="policy of the attune tuner")] = "playbook",
    cache: Annotated[Optional[Path], typer.Option("--cache", help="oracle cache directory")] = None,
    lessons: Annotated[Optional[str], typer.Option(
        "--lessons", help="the lessons benchmark instead: 'loo' (learn from every other model family, tune this one) "
                          "or 'learn=SUITE_A,apply=SUITE_B'; attune cold and warm at equal budget and seeds")] = None,
) -> None:
    """Benchmark tuners on a suite at equal budget: fraction of the exhaustive optimum, waste, refusals."""
    from attune.bench.run import run_bench
    from attune.commands import console
    from attune.commands import fail as _fail
    from attune.errors import AttuneError

    cache_dir = cache
    if cache_dir is None:
        from platformdirs import user_cache_dir

        cache_dir = Path(user_cache_dir("attune")) / "oracle"
    if lessons is not None:
        from attune.bench.lessons import markdown as lessons_markdown
        from attune.bench.lessons import run_lessons_bench

        try:
            ldoc = run_lessons_bench(suite, design=lessons, budget=budget, seeds=seeds, out_dir=out,
                                     only=[s.strip() for s in only.split(",")] if only else None, jobs=jobs,
                                     attune_policy=attune_policy, cache_dir=cache_dir,
                                     on_progress=lambda msg: console.print(f"[dim]{msg}[/]"))
        except AttuneError as err:
            _fail(err)
        console.print(lessons_markdown(ldoc), markup=False)
        console.print(f"wrote {out / 'lessons.json'}, {out / 'lessons.md'}, {out / 'lessons.png'}")
        return
    try:
        doc = run_bench(suite, tuners=[t.strip() for t in tuners.split(",") if t.strip()], budget=budget,
                        seeds=seeds, out_dir=out, only=[s.strip() for s in only.split(",")] if only else None,
                        limit=limit, jobs=jobs, attune_policy=attune_policy, cache_dir=cache_dir,
                        on_progress=lambda msg: console.print(f"[dim]{msg}[/]"))
    except AttuneError as err:
        _fail(err)
    from attune.bench.report import markdown, markdown_combined

    console.print(markdown_combined(doc) if "budgets" in doc else markdown(doc), markup=False)
    console.print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'anytime.png'}, {out / 'summary.png'}")


def calibrate(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Simulate NVIDIA's published training throughputs at their exact settings and report the error per row."""
    import json

    from attune.sim.calibration import calibrate as run_calibration
    from attune.sim.calibration import format_table, median_abs_error

    rows = run_calibration()
    if as_json:
        typer.echo(json.dumps({"rows": [{"row": r.row.name, "published": r.row.tokens_per_s_per_gpu,
                                         "predicted": r.predicted.tokens_per_s_per_device, "error": r.error} for r in rows],
                               "median_abs_error": median_abs_error(rows)}, indent=2))
        return
    typer.echo(format_table(rows))


def register(app: typer.Typer) -> None:
    """Add ``sim``, ``calibrate`` and ``bench`` as top-level commands of ``app``."""
    app.command(name="sim")(sim)
    app.command(name="calibrate")(calibrate)
    app.command(name="bench")(bench)
