"""``attune card verify CARD``: re-run a card's reproduce command and say whether its claim still holds.

The claim of a card is its speedup over the baseline and, for a simulated card (the simulator is the machine),
its tuned throughput per device. The reproduced run must reach both within a tolerance: the larger of the
card's and the reproduced run's noise floors (at least 1 %). A measured card's absolute throughput is held
to that tolerance only on the same machine (same CPU model and count, same accelerators); elsewhere it is
reported, not judged. Exit codes: 0 the claim holds, 1 it does not, 3 the card's backend is not available here.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attune.cards.io import baseline_recipe, load_card
from attune.cards.model import Card
from attune.errors import AttuneError
from attune.recipe.io import load_recipe, recipe_to_dict
from attune.report.result import PLOTS_ENV

HOLDS, DOES_NOT_HOLD, UNAVAILABLE = 0, 1, 3


@dataclass
class Verification:
    card: Card
    code: int
    summary: str
    checks: list[tuple[str, bool | None, str]] = field(default_factory=list)  # (what, passed?, detail)
    run_dir: Path | None = None
    result: dict[str, Any] | None = None
    wall_s: float = 0.0

    @property
    def holds(self) -> bool:
        return self.code == HOLDS


def backend_available(card: Card) -> str | None:
    """Why the card's backend cannot run here, or ``None`` when it can."""
    backend = card.measurement.backend
    if backend == "sim":
        return None
    if backend == "fake":
        return "the card was made with the test-only fake backend; there is nothing to re-run"
    if backend != "local":
        return f"unknown backend {backend!r}"
    from attune import registry

    dist = registry.get(card.framework.name).distribution if card.framework.name in registry.names() else None
    if dist:
        from importlib import metadata

        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            return f"{dist} is not installed here (pip install {dist})"
    acc = card.hardware.accelerator
    if acc == "cpu":
        cpus = os.cpu_count() or 1
        if cpus < card.hardware.devices_per_node:
            return f"the card needs {card.hardware.devices_per_node} CPU slots, this machine has {cpus}"
        return None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return f"the card ran on {card.hardware.label}; this machine has no NVIDIA accelerator"
    try:
        gpus = [ln for ln in subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout.splitlines()
                if ln.startswith("GPU ")]
    except (OSError, subprocess.SubprocessError):
        gpus = []
    if len(gpus) < card.hardware.devices_per_node or card.hardware.nodes > 1:
        return f"the card ran on {card.hardware.label}; this machine has {len(gpus)} GPU(s)"
    return None


def _same_machine(card: Card) -> bool:
    from attune.report.environment import capture

    here = capture(card.measurement.backend).get("host") or {}
    there = (card.measurement.machine or {}).get("host") or {}
    return bool(there) and all(here.get(k) == there.get(k) for k in ("cpu", "cpu_count"))


def reproduce_argv(card: Card, workdir: Path) -> tuple[list[str], dict[str, str], str]:
    """The reproduce command as an argument list for this interpreter, its environment, and the recipe used."""
    words = shlex.split(card.reproduce.command)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-") and words[0].split("=", 1)[0].isidentifier():
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    if not words or words[0] != "attune" or words[1:2] != ["tune"]:
        raise AttuneError(f"card {card.id}: reproduce.command is not an `attune tune ...` command: "
                          f"{card.reproduce.command}")
    argv = [sys.executable, "-m", "attune", *words[1:]]
    baseline = baseline_recipe(card)
    used = "the card's own baseline recipe"
    path = card.reproduce.recipe_path
    if path and path in argv:
        i = argv.index(path)
        original = Path(path)
        same = False
        if original.exists():
            try:
                same = recipe_to_dict(load_recipe(original)) == recipe_to_dict(baseline)
            except AttuneError:
                same = False
        if same:
            used = f"{path} (identical to the card's baseline)"
        else:
            materialised = workdir / Path(path).name
            materialised.write_text(yaml.safe_dump(recipe_to_dict(baseline), sort_keys=False))
            argv[i] = str(materialised)
            used = (f"the card's baseline written to {materialised}"
                    + (f" ({path} differs from it)" if original.exists() else f" ({path} is not here)"))
    return argv, env, used


def verify(card_path: str | Path, *, out: str | Path | None = None, timeout_s: float = 3600.0) -> Verification:
    """Re-run the card's reproduce command (into ``out`` or a temporary directory) and judge its claim."""
    card = load_card(card_path)
    why = backend_available(card)
    if why is not None:
        return Verification(card, UNAVAILABLE, f"cannot verify here: {why}")
    keep = out is not None
    work = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix=f"attune-verify-{card.id}-"))
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "run"
    if (run_dir / "journal.jsonl").exists():
        raise AttuneError(f"{run_dir} already holds a run; give another --out")
    argv, env, used = reproduce_argv(card, work)
    argv += ["--out", str(run_dir)]
    t0 = time.monotonic()
    log_path = work / "reproduce.log"
    try:
        with log_path.open("w") as fh:
            fh.write("$ " + shlex.join(argv) + "\n")
            fh.flush()
            # the claim is judged from result.json: the run's PNG chart is not drawn (its HTML report still is)
            proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT,
                                  env={**os.environ, **env, PLOTS_ENV: "off"},
                                  timeout=timeout_s, cwd=os.getcwd())
    except subprocess.TimeoutExpired:
        return Verification(card, DOES_NOT_HOLD, f"the reproduce command ran past {timeout_s:.0f} s",
                            run_dir=run_dir, wall_s=time.monotonic() - t0)
    wall = time.monotonic() - t0
    if proc.returncode != 0 or not (run_dir / "result.json").exists():
        tail = log_path.read_text(errors="replace")[-1500:]
        return Verification(card, DOES_NOT_HOLD, f"the reproduce command failed (exit {proc.returncode}):\n{tail}",
                            run_dir=run_dir, wall_s=wall)
    result = json.loads((run_dir / "result.json").read_text())
    v = judge(card, result)
    v.checks.insert(0, ("recipe", None, used))
    v.run_dir, v.result, v.wall_s = run_dir, result, wall
    if not keep and v.holds:
        shutil.rmtree(work, ignore_errors=True)
        v.run_dir = None
    return v


def judge(card: Card, result: dict[str, Any]) -> Verification:
    """Compare a reproduced run's ``result.json`` with the card's claim."""
    claimed = card.throughput
    tol = max(claimed.noise_floor or 0.0, result.get("noise_floor") or 0.0, 0.01)
    sp, tuned = result.get("speedup"), result.get("best_throughput")
    checks: list[tuple[str, bool | None, str]] = []
    floor = claimed.speedup * (1 - tol)
    if claimed.speedup_low is not None:  # a certified claim: reaching the low end of its interval holds it
        floor = min(floor, claimed.speedup_low)
    sp_ok = bool(sp) and sp is not None and sp >= floor
    interval = (f", claimed interval {claimed.speedup_low:.4f}–{claimed.speedup_high:.4f}×"
                if claimed.speedup_low is not None and claimed.speedup_high is not None else "")
    checks.append(("speedup", sp_ok, f"reproduced {sp or 0:.4f}× vs claimed {claimed.speedup:.4f}×{interval} "
                                     f"(must reach {floor:.4f}×, tolerance {tol:.1%})"))
    enforce = card.simulated or _same_machine(card)
    tp_ok = bool(tuned) and tuned is not None and tuned >= claimed.tuned * (1 - tol)
    checks.append(("throughput per device", tp_ok if enforce else None,
                   f"reproduced {tuned or 0:,.0f} vs claimed {claimed.tuned:,.0f} {claimed.unit}"
                   + ("" if enforce else " (another machine: reported, not judged)")))
    same = (result.get("best_changes") or {}) == {k: c.to for k, c in card.recipe.changes.items()}
    checks.append(("same recipe found", None, "yes" if same else
                   f"no: kept {result.get('best_changes') or 'nothing'} (card: "
                   f"{ {k: c.to for k, c in card.recipe.changes.items()} or 'nothing'})"))
    holds = sp_ok and (tp_ok or not enforce)
    summary = ("the claim holds" if holds else "the claim does NOT hold") + \
        f": {sp or 0:.3f}× reproduced, {claimed.speedup:.3f}× claimed"
    return Verification(card, HOLDS if holds else DOES_NOT_HOLD, summary, checks)
