"""A tiny TRL SFT setup built offline for the tests, with the example's own builder (examples/trl/make_tiny.py): a
two-layer Llama, its word-level tokenizer and a local ``data/train.jsonl`` that ``trl sft --dataset_name data`` loads.

The build runs in a subprocess (the test process does not import torch/transformers for it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "trl"


def offline_env() -> dict[str, str]:
    """The environment of a training process here: no hub access, one thread, this interpreter's bin first."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def build_tiny_sft(root: Path, *, rows: int = 256, hidden: int = 64, layers: int = 2) -> Path:
    """``root/model`` (model + tokenizer) and ``root/data/train.jsonl``; returns ``root``. Built once per root."""
    if (root / "model" / "config.json").is_file() and (root / "data" / "train.jsonl").is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, str(EXAMPLE / "make_tiny.py"), str(root), "--rows", str(rows),
                           "--hidden", str(hidden), "--layers", str(layers)],
                          capture_output=True, text=True, env=offline_env(), timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny SFT setup failed:\n{done.stderr[-3000:]}")
    return root


def example_command() -> list[str]:
    """The launch of examples/trl/run.sh (its ``exec`` line)."""
    line = next(ln for ln in (EXAMPLE / "run.sh").read_text().splitlines() if ln.startswith("exec "))
    return line.split()[1:]
