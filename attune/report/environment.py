"""Where and how a run was measured: the invocation, the machine and the software, captured once per run.

``environment.json`` is written into the run directory the first time :func:`attune.report.write_outputs` runs
(after the first trial), so it describes the machine the trials ran on, not the one a card is made on later.
Nothing here imports torch or touches the network; every probe is best-effort and never fails a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

FILENAME = "environment.json"
#: environment variables that change what ``attune tune`` does, recorded with the invocation
RELEVANT_ENV = ("ATTUNE_LESSONS", "ATTUNE_LLM_BASE_URL", "ATTUNE_LLM_MODEL", "OMP_NUM_THREADS")
_PACKAGE = Path(__file__).resolve().parents[1]


def iso(t: float | None) -> str | None:
    """UTC ISO-8601 time of a UNIX timestamp (``None`` stays ``None``)."""
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _load() -> float | None:
    """The 1-minute load average after the first trial (other work on the machine skews measured trials)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _git_revision() -> str | None:
    """The attune checkout's commit (``+dirty`` with local changes), where attune runs from a git checkout."""
    root = _PACKAGE.parent
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                "attune"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def simulator_digest() -> str:
    """A digest of the simulator's source (its model of step time and memory): simulated claims depend on it."""
    h = hashlib.sha256()
    for name in ("perf.py", "hardware.py"):
        p = _PACKAGE / "sim" / name
        if p.exists():
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def invocation() -> dict[str, Any] | None:
    """The ``attune tune ...`` command line this process runs, or ``None`` when attune was called as a library."""
    args = sys.argv[1:]
    if not args or args[0] != "tune":
        return None
    return {"argv": ["attune", *args], "cwd": os.getcwd(),
            "env": {k: os.environ[k] for k in RELEVANT_ENV if k in os.environ}}


def capture(backend: str | None) -> dict[str, Any]:
    """The environment document of a run on ``backend`` (``sim``: the machine is the simulator's model)."""
    software: dict[str, Any] = {"attune": _version("attune-llm") or "unknown", "attune_git": _git_revision(),
                                "python": platform.python_version()}
    from attune import registry

    frameworks = [registry.get(name).distribution for name in registry.names()]
    for dist in dict.fromkeys(["torch", *(d for d in frameworks if d), "accelerate", "nemo-toolkit"]):
        v = _version(dist)
        if v is not None:
            software[dist] = v
    doc: dict[str, Any] = {
        "captured_at": iso(time.time()),
        "backend": backend,
        "invocation": invocation(),
        "software": software,
        "host": {"os": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
                 "memory_gb": _memory_gb(), "load_average_1m": _load()},
    }
    if backend == "sim":
        doc["simulator"] = {"model": "attune.sim analytical model", "digest": simulator_digest()}
    return doc


def ensure(run_dir: Path, backend: str | None) -> dict[str, Any]:
    """Read ``run_dir/environment.json``, writing it first if the run has none yet."""
    path = run_dir / FILENAME
    if path.exists():
        try:
            doc: dict[str, Any] = json.loads(path.read_text())
            return doc
        except (OSError, ValueError):
            pass
    doc = capture(backend)
    try:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(path)
    except OSError:
        pass
    return doc


def read(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / FILENAME
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except (OSError, ValueError):
        return None
