"""A run directory read back: the journal folded into a :class:`RunState`, plus how and when the run was made.

``attune report DIR``, ``attune card DIR`` and ``attune runs`` read runs through :func:`load_run`; the end of
``attune tune`` builds the same view from its live state with :func:`view_of`. Reading never changes a run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.engine.journal import Event, Journal, replay
from attune.engine.state import RunState
from attune.errors import AttuneError
from attune.report import environment


@dataclass
class RunView:
    """One tuning run as the report, the card and ``attune runs`` see it."""

    run_dir: Path
    state: RunState
    backend: str | None = None
    policy: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    #: trials the journal saw start but not finish (the run is still going, or was killed in them)
    open_trials: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def simulated(self) -> bool:
        return self.backend in ("sim", "fake")

    @property
    def status(self) -> str:
        """``finished``, ``running`` (a trial is open and the journal moved recently) or ``unfinished``."""
        if self.state.finished:
            return "finished"
        if self.open_trials:
            import time

            try:
                age = time.time() - (self.run_dir / Journal.FILENAME).stat().st_mtime
            except OSError:
                age = float("inf")
            timeout = self.state.config.trial_timeout_s
            if age < max(timeout, 60.0) * 1.5:
                return "running"
        return "unfinished"


def load_run(run_dir: str | Path) -> RunView:
    """Fold ``run_dir/journal.jsonl`` into a view of the run (raises :class:`AttuneError` if it is not a run)."""
    d = Path(run_dir)
    if not (d / Journal.FILENAME).exists():
        raise AttuneError(f"{d} holds no journal.jsonl; give a run directory made by `attune tune` "
                          "(e.g. runs/NAME-TIME)")
    run = replay(Journal(d).read(), d / Journal.FILENAME)
    state = RunState(baseline=run.baseline, config=run.config, records=sorted(run.records, key=lambda r: r.id),
                     setup=run.setup)
    finished = run.finished
    if finished is not None:
        state.finished = finished.get("reason") or "finished"
    return RunView(run_dir=d, state=state, backend=run.start.get("backend"), policy=run.start.get("policy"),
                   started_at=run.start.get("time"), finished_at=finished.get("time") if finished else None,
                   open_trials=run.open_trials, environment=environment.read(d))


def view_of(state: RunState, run_dir: str | Path) -> RunView:
    """The view of a live run (its state in memory; backend, policy and times from the journal's ends)."""
    d = Path(run_dir)
    view = RunView(run_dir=d, state=state, environment=environment.read(d))
    path = d / Journal.FILENAME
    try:
        with path.open() as f:
            first = json.loads(f.readline() or "{}")
        view.backend, view.policy, view.started_at = first.get("backend"), first.get("policy"), first.get("time")
        if state.finished:
            last = path.read_text().rstrip("\n").rsplit("\n", 1)[-1]
            ev = json.loads(last)
            if ev.get("event") == Event.RUN_FINISHED.value:
                view.finished_at = ev.get("time")
    except (OSError, ValueError):
        pass
    return view


def find_runs(root: str | Path, depth: int = 3) -> list[Path]:
    """Run directories (holding ``journal.jsonl``) at or below ``root``, at most ``depth`` levels down."""
    base = Path(root)
    found: list[Path] = []

    def walk(d: Path, level: int) -> None:
        if (d / Journal.FILENAME).is_file():
            found.append(d)
            return
        if level >= depth:
            return
        try:
            children = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for c in children:
            if c.name == "trials":
                continue
            walk(c, level + 1)

    if base.is_dir():
        walk(base, 0)
    return found
