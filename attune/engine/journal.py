"""Append-only JSONL journal of a tuning run; ``--resume`` replays it.

Every event is one line, flushed and fsynced before the engine acts on it, so a crash loses at most the
line being written (a torn last line is ignored on replay).
"""

from __future__ import annotations

import json
import os
import time
from enum import Enum
from pathlib import Path
from typing import Any

from attune.errors import JournalError


class Event(str, Enum):
    RUN_STARTED = "run_started"
    TRIAL_STARTED = "trial_started"
    TRIAL_FINISHED = "trial_finished"
    RUN_FINISHED = "run_finished"


class Journal:
    """``DIR/journal.jsonl``: ``append`` one event, ``read`` them all back in order."""

    FILENAME = "journal.jsonl"

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / self.FILENAME

    def exists(self) -> bool:
        return self.path.exists()

    def append(self, event: Event, **payload: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"event": event.value, "time": time.time(), **payload}, default=str)
        with self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            raise JournalError(f"no journal at {self.path}; is this a run directory made by `attune tune`?")
        events = []
        lines = self.path.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # torn final line from a crash: ignore it
                    continue
                raise JournalError(f"{self.path}:{i + 1} is corrupt; the journal cannot be replayed") from None
        return events
