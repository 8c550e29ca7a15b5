"""Process helpers for tests: which processes still work inside a directory, and bounded waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil


def processes_in(directory: Path) -> list[int]:
    """PIDs of live processes whose working directory lies under ``directory``."""
    pids = []
    for p in psutil.process_iter(["pid", "cwd"]):
        try:
            if p.info["cwd"] and str(directory) in p.info["cwd"]:
                pids.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return pids


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
