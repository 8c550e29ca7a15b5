"""Append-only JSONL journal of a tuning run; ``--resume`` replays it. One writer per run directory.

Every event is one line written with a single ``write`` on an ``O_APPEND`` descriptor and fsynced before the
engine acts on it, so a crash loses at most the line being written. On the next open for writing a torn final
line (power loss mid-write) is detected, moved to ``journal.torn-<time>.jsonl`` beside the journal (kept, never
silently dropped) and the journal is cut back to its last complete record, so appends never follow garbage.

:class:`RunLock` makes a run directory exclusive: the tuner holds an ``flock`` on ``DIR/lock`` for its whole
life (the kernel releases it when the process dies, however it dies); a second tuner on the same directory is
refused with a message naming the holder.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from attune.engine.state import TuneConfig
from attune.errors import JournalError, RecipeError
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.trial import TrialKind, TrialRecord


class Event(str, Enum):
    RUN_STARTED = "run_started"
    TRIAL_STARTED = "trial_started"
    TRIAL_FINISHED = "trial_finished"
    RUN_FINISHED = "run_finished"
    SETUP = "setup"  # one-time set-up before the first trial (a JIT op build): what, how long, whether it worked
    BUDGET_CHANGED = "budget_changed"  # a resume raised (or lowered) the budget: later resumes keep it


def setup_record(event: dict[str, Any]) -> dict[str, Any]:
    """A ``setup`` event as the run state holds it: what, wall_s, ok, message (the event's own fields dropped)."""
    return {k: v for k, v in event.items() if k not in ("event", "time")}


def journaled_config(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's configuration as its journal holds it now: ``run_started``'s, with the budget of the last
    ``budget_changed`` event (a resume with ``--budget``) applied."""
    cfg = dict(events[0]["config"])
    cfg["search_space"] = tuple(cfg.get("search_space", ()))
    for ev in events[1:]:
        if ev.get("event") == Event.BUDGET_CHANGED.value:
            cfg["budget_hours"] = float(ev["budget_hours"])
    return cfg


class RunLock:
    """An exclusive, OS-released lock on a run directory (``DIR/lock``), with the holder written inside."""

    FILENAME = "lock"

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / self.FILENAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise JournalError(f"cannot use {self.path.parent} as a run directory: {err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise JournalError(f"{self.path.parent} is in use by another tuner ({holder}); wait for it to finish, "
                               "or stop it, then `attune tune --resume` this directory") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                                 "argv": sys.argv}).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 65536, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("since", 0))))
        return f"pid {info.get('pid')} on {info.get('host')} since {since}"
    except (OSError, ValueError, TypeError):
        return "holder unknown"


class RunJournal(Protocol):
    """Where a run's events go: the run directory's :class:`Journal`, or a :class:`MemoryJournal` for runs that are
    never resumed (the benchmark's)."""

    def exists(self) -> bool: ...

    def append(self, event: Event, **payload: Any) -> None: ...

    def read(self) -> list[dict[str, Any]]: ...


class MemoryJournal:
    """The events of a run kept in memory, in the order appended (nothing on disk, nothing to resume)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def exists(self) -> bool:
        return bool(self.events)

    def append(self, event: Event, **payload: Any) -> None:
        self.events.append({"event": event.value, **payload})

    def read(self) -> list[dict[str, Any]]:
        return list(self.events)


class Journal:
    """``DIR/journal.jsonl``: ``append`` one event, ``read`` them all back in order."""

    FILENAME = "journal.jsonl"

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / self.FILENAME
        self._repaired = False

    def exists(self) -> bool:
        return self.path.exists()

    def append(self, event: Event, **payload: Any) -> None:
        if not self._repaired:
            self.repair()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps({"event": event.value, "time": time.time(), **payload}, default=str,
                           allow_nan=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            if written != len(line):  # a short write would leave a torn record: say so now
                raise JournalError(f"could not append to {self.path} (wrote {written} of {len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)

    def repair(self) -> Path | None:
        """Cut a torn final record off the journal into a side file; returns the side file, if any."""
        self._repaired = True
        data = self._bytes()
        if data is None or not data:
            return None
        if data.endswith(b"\n"):
            last_start = data.rstrip(b"\n").rfind(b"\n") + 1
            try:
                json.loads(data[last_start:].decode("utf-8"))
                return None
            except (UnicodeDecodeError, json.JSONDecodeError):
                pass  # a complete line that is not a record: torn all the same
        else:
            last_start = data.rfind(b"\n") + 1
            try:  # a whole record that only lacks its newline (read() used it): complete it
                json.loads(data[last_start:].decode("utf-8"))
                with self.path.open("ab") as f:
                    f.write(b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                return None
            except (UnicodeDecodeError, json.JSONDecodeError):
                pass
        torn = data[last_start:]
        side = self.path.with_name(f"journal.torn-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl")
        side.write_bytes(torn)
        with self.path.open("r+b") as f:
            f.truncate(last_start)
            f.flush()
            os.fsync(f.fileno())
        return side

    def _bytes(self) -> bytes | None:
        if not self.path.exists():
            return None
        if not self.path.is_file():
            raise JournalError(f"{self.path} is not a file; is this a run directory made by `attune tune`?")
        try:
            return self.path.read_bytes()
        except OSError as err:
            raise JournalError(f"cannot read {self.path}: {err.strerror}") from None

    def read(self) -> list[dict[str, Any]]:
        data = self._bytes()
        if data is None:
            raise JournalError(f"no journal at {self.path}; is this a run directory made by `attune tune`?")
        events = []
        lines = data.split(b"\n")
        complete = data.endswith(b"\n")
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            final = i == len(lines) - 1 or (complete and i == len(lines) - 2)
            try:
                event = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                if final:  # torn final line from a crash: ignored here, set aside by the next append
                    continue
                raise JournalError(f"{self.path}:{i + 1} is corrupt (not a JSON record); the journal cannot be "
                                   "replayed. Move that line aside to resume from the records before it") from None
            if not isinstance(event, dict) or not isinstance(event.get("event"), str):
                raise JournalError(f"{self.path}:{i + 1} is not a journal event (no 'event' field)")
            events.append(event)
        return events


# -- the one replay: a journal folded back into what the run started from and its records -------------------------

@dataclass
class Replayed:
    """A run's journal folded back: what it started from, its records (in journal order), its one-time set-up, the
    trials it started and never finished, and how it ended (``None`` while it has not)."""

    start: dict[str, Any]
    baseline: Recipe
    config: TuneConfig
    records: list[TrialRecord]
    setup: list[dict[str, Any]]
    open_trials: list[dict[str, Any]]
    finished: dict[str, Any] | None
    budget_changed: bool = False


def replay(events: list[dict[str, Any]], path: Path, *, budget_hours: float | None = None) -> Replayed:
    """Fold a journal's events (the one replay: the tuner's resume and the reports read a run alike). A new
    ``budget_hours`` replaces the journaled one. Raises :class:`JournalError` naming the line that cannot be read."""
    if not events or events[0].get("event") != Event.RUN_STARTED.value:
        raise JournalError(f"{path} does not start with a run_started event; is {path.parent} a run directory made "
                           "by `attune tune`?")
    start = events[0]
    try:
        baseline = parse_recipe(start["recipe"], f"{path} (run_started.recipe)")
        cfg_data = journaled_config(events)
        changed = budget_hours is not None and budget_hours != cfg_data["budget_hours"]
        if changed:
            cfg_data["budget_hours"] = budget_hours
        config = TuneConfig(**cfg_data)
    except (KeyError, TypeError, ValueError, RecipeError) as err:
        raise JournalError(f"{path}:1 is not a run_started record attune can resume ({err})") from None
    records: list[TrialRecord] = []
    setup: list[dict[str, Any]] = []
    open_trials: dict[int, dict[str, Any]] = {}
    finished: dict[str, Any] | None = None
    for line, ev in enumerate(events[1:], start=2):
        try:
            if ev["event"] == Event.TRIAL_STARTED.value:
                tid, kind = ev["trial"], ev["kind"]
                if isinstance(tid, bool) or not isinstance(tid, int) or not 0 < tid < 10**9 \
                        or kind not in set(TrialKind) or not isinstance(ev["trial_dir"], str):
                    raise ValueError(f"trial {tid!r} of kind {kind!r} is not a trial this journal can hold")
                open_trials[tid] = ev
            elif ev["event"] == Event.TRIAL_FINISHED.value:
                rec = TrialRecord.model_validate(ev["record"])
                open_trials.pop(rec.id, None)
                records.append(rec)
            elif ev["event"] == Event.SETUP.value:
                setup.append(setup_record(ev))
            elif ev["event"] == Event.RUN_FINISHED.value:
                finished = ev
        except (KeyError, TypeError, ValueError) as err:
            raise JournalError(f"{path}:{line} is not a valid {ev.get('event')} record "
                               f"({str(err).splitlines()[0]}); the journal cannot be replayed") from None
    return Replayed(start=start, baseline=baseline, config=config, records=records, setup=setup,
                    open_trials=list(open_trials.values()), finished=finished, budget_changed=changed)
