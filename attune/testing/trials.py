"""Short real trials for tests: a request of one warm-up and three measured steps, and a local backend whose trials
find this interpreter's ``python`` / ``torchrun`` / ``deepspeed`` first on PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from attune.backends.base import TrialRequest
from attune.backends.local import LocalBackend


def request(tmp_path: Path, **kw: Any) -> TrialRequest:
    """A short real trial in ``tmp_path/trial``: one warm-up step and three measured ones (``kw`` overrides)."""
    base: dict[str, Any] = {"trial_id": 1, "trial_dir": tmp_path / "trial", "warmup_steps": 1, "measure_steps": 3,
                            "timeout_s": 120}
    return TrialRequest(**{**base, **kw})


def backend() -> LocalBackend:
    """Local trials that run the launchers from PATH, this interpreter's first."""
    return LocalBackend(extra_env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})


__all__ = ["backend", "request"]
