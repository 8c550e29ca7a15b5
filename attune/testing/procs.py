"""Process helpers for tests: which processes still work inside a directory."""

from __future__ import annotations

from pathlib import Path

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
