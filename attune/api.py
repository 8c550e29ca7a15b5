"""What the CLI (and the operator) call. Each function is one capability, no presentation."""

from __future__ import annotations

import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from attune.backends import make_backend
from attune.engine.journal import Event
from attune.engine.loop import EventFn, Tuner
from attune.engine.state import RunState, TuneConfig
from attune.errors import AttuneError
from attune.policies import make_policy
from attune.recipe.io import load_recipe
from attune.recipe.model import Recipe
from attune.report import write_outputs

DEFAULT_POLICY = "playbook"


def _journal_field(run_dir: str | Path, name: str) -> Any:
    from attune.engine.journal import Journal

    events = Journal(run_dir).read()
    return events[0].get(name) if events else None


def safe_name(name: str) -> str:
    """A recipe name as one safe directory name: no separators, no leading dots, printable, at most 64 chars."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-_")[:64]
    return cleaned or "recipe"


def default_run_dir(recipe: Recipe, root: str | Path = "runs") -> Path:
    return Path(root) / f"{safe_name(recipe.name)}-{time.strftime('%Y%m%d-%H%M%S')}"


def preflight(recipe: Recipe, backend: str) -> list[str]:
    """Problems knowable before spending budget: the framework's checks for running ``recipe`` on ``backend``."""
    problems: list[str] = recipe.framework_impl.preflight(recipe, backend)
    return problems


def _check_out_dir(run_dir: Path) -> None:
    for parent in (run_dir, *run_dir.parents):
        if parent.exists():
            if not parent.is_dir():
                raise AttuneError(f"--out {run_dir}: {parent} is not a directory; give a directory path for the run")
            if not os.access(parent, os.W_OK):
                raise AttuneError(f"--out {run_dir}: cannot write in {parent}")
            return


def tune(recipe: Recipe | str | Path | None = None, *, budget_hours: float | None = None, backend: str | None = None,
         policy: str | None = None, out_dir: str | Path | None = None, resume: str | Path | None = None,
         on_event: EventFn | None = None, seed: int = 0, backend_options: dict[str, Any] | None = None,
         policy_options: dict[str, Any] | None = None, **overrides: Any) -> tuple[RunState, dict[str, Path]]:
    """Tune a recipe (or resume the run in ``resume``); returns the final state and the written files."""
    rec: Recipe | None = None
    if resume is None and recipe is not None:
        rec = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    if backend is None:  # a resumed run keeps the backend it started with; a new one takes its framework's first
        backend = _journal_field(resume, "backend") if resume is not None else \
            rec.framework_impl.backends[0] if rec is not None else None
    be = make_backend(backend or "local", **(backend_options or {}))
    if policy is None:  # a resumed run keeps the policy it started with
        policy = _journal_field(resume, "policy") if resume is not None else None
    pol = make_policy(policy or DEFAULT_POLICY, seed=seed, **(policy_options or {}))
    if budget_hours is not None and (not math.isfinite(budget_hours) or budget_hours <= 0):
        raise AttuneError("--budget must be a finite positive number of accelerator-hours (e.g. --budget 0.2)")
    if resume is not None:
        run_dir = Path(resume).resolve()
        if not run_dir.is_dir():
            raise AttuneError(f"--resume {resume}: no such run directory")
        tuner = Tuner.resume(run_dir, backend=be, policy=pol, budget_hours=budget_hours, on_event=on_event)
        problems = preflight(tuner.state.baseline, str(backend or "local"))
        if problems:  # what stops a trial here stops it on every resume: say so instead of launching it again
            tuner.lock.release()
            raise AttuneError(f"{run_dir} cannot continue on the {backend or 'local'} backend here (nothing was "
                              "spent):\n" + "\n".join(f"  - {p}" for p in problems))
    else:
        if rec is None:
            raise AttuneError("give a recipe to tune, or --resume DIR")
        if budget_hours is None or not math.isfinite(budget_hours) or budget_hours <= 0:
            raise AttuneError("--budget must be a finite positive number of accelerator-hours (e.g. --budget 0.2)")
        problems = preflight(rec, backend or "local")
        if problems:
            raise AttuneError(f"{rec.name} cannot run on the {backend or 'local'} backend here (nothing was "
                              "spent):\n" + "\n".join(f"  - {p}" for p in problems))
        run_dir = (Path(out_dir) if out_dir else default_run_dir(rec)).resolve()
        _check_out_dir(run_dir)
        if (run_dir / "journal.jsonl").exists():
            raise AttuneError(f"{run_dir} already holds a tuning run; use --resume {run_dir} or another --out")
        given = {k: v for k, v in overrides.items() if v is not None}  # what the user set wins over the lessons
        config = TuneConfig.from_recipe(rec, budget_hours, **{**_noise_prior(pol, rec, be), **given})
        tuner = Tuner(rec, backend=be, policy=pol, config=config, run_dir=run_dir, on_event=on_event)

    def checkpoint(kind: Event, payload: dict[str, Any]) -> None:
        if kind is Event.TRIAL_FINISHED:
            write_outputs(tuner.state, run_dir, plots=False)
        if on_event:
            on_event(kind, payload)

    tuner.on_event = checkpoint
    state = tuner.run()
    _record_lessons(state, policy_options, run_dir.name)
    return state, write_outputs(state, run_dir)


def _noise_prior(policy: Any, recipe: Recipe, backend: Any) -> dict[str, Any]:
    """The noise prior the policy's lessons store holds for this cluster (TuneConfig overrides; none without one)."""
    store = getattr(policy, "lessons", None)
    if store is None:
        return {}
    try:
        from attune.agent.lessons import noise_prior_overrides

        return noise_prior_overrides(store, recipe, backend=getattr(backend, "name", None))
    except Exception as err:  # noqa: BLE001 - lessons are advice; a tuning run never fails on them
        logging.getLogger(__name__).warning("could not read the noise prior from the lessons store: %s", err)
        return {}


def _record_lessons(state: RunState, policy_options: dict[str, Any] | None, run_id: str) -> None:
    """Distil the finished run into the user's lessons store (skipped when the agent is absent or lessons are off)."""
    store = (policy_options or {}).get("lessons")
    if store is False:
        return
    try:
        from attune.agent.lessons import record_run
    except ImportError:
        return
    try:
        record_run(state, store, run_id=run_id)
    except Exception as err:  # noqa: BLE001 - lessons are advice; a tuning run never fails on them
        logging.getLogger(__name__).warning("could not record lessons: %s", err)


# -- the user's own launch: import and render --------------------------------------------------------------

def import_launch(framework: str, argv: list[str], *, cwd: str | Path | None = None, name: str | None = None,
                  options: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Recipe:
    """The recipe of a native launch (``attune import --framework FW -- COMMAND...``), validated. ``env`` is the
    launch's environment (default: this process's)."""
    import os

    from attune import frameworks
    from attune.recipe.io import parse_recipe

    if framework not in frameworks.names():
        raise AttuneError(frameworks.unknown_message(framework))
    if not argv:
        raise AttuneError(f"give the launch command after `--`, e.g. attune import --framework {framework} -- "
                          "python train.py --per_device_train_batch_size 1")
    fw = frameworks.get(framework)
    data = fw.import_launch(list(argv), cwd=Path(cwd or os.getcwd()).resolve(),
                            env=dict(os.environ) if env is None else env, options=options or {})
    if name:
        data["name"] = name
    return parse_recipe(data, f"the {framework} launch `{' '.join(argv)}`")


def import_script(framework: str, script: str | Path, *, name: str | None = None,
                  options: dict[str, Any] | None = None) -> Recipe:
    """The recipe of a shell launch script (``attune import --framework FW --script run.sh``): its ``exec`` line is
    the command, its ``export`` lines the environment, its directory the working directory."""
    from attune.frameworks.cmdline import read_launch_script

    argv, env = read_launch_script(script)
    return import_launch(framework, argv, cwd=Path(script).resolve().parent, name=name, options=options, env=env)


def render(recipe: Recipe, sets: list[str] | None = None) -> tuple[Recipe, Any]:
    """``recipe`` with the ``--set`` knob changes applied (gate-checked) and the exact launch it renders to."""
    from attune.gate import apply_sets, evaluate
    from attune.recipe.io import parse_recipe

    target = recipe
    if sets:
        data = apply_sets(recipe.model_dump(mode="python"), sets)
        verdict = evaluate(recipe, data)
        if not verdict.admitted:
            raise AttuneError("the correctness gate refuses this change, so attune would never run it:\n"
                              + "\n".join(f"  - {r.render()}" for r in verdict.reasons))
        target = parse_recipe(data, "the changed recipe")
    return target, target.framework_impl.render(target)
