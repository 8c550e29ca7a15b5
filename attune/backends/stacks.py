"""Where a trial's step time goes, for frameworks that print no phase timers: sampled Python stacks.

A local trial of such a framework (the HF Trainer, a user's own script) is sampled during its measurement window by
`py-spy <https://github.com/benfred/py-spy>`_, which attaches to the running process group from outside (nothing in
the user's code changes; ``--nonblocking`` never pauses it). Every sample of a training process's main thread is
attributed to one phase by the frames on its stack (:func:`phase_of`):

* ``comm``: collective communication (``torch.distributed`` collectives, DeepSpeed's ``comm``);
* ``data``: the data loader (``torch.utils.data``, ``datasets``, a ``collate`` function);
* ``optimizer``: the optimizer step and zeroing of gradients (``torch.optim``, an ``optimizer_step``);
* ``backward``: autograd (``torch.autograd``, a tensor's ``backward``);
* ``forward``: a module's forward (``torch.nn.modules``, ``torch.nn.functional``);
* ``host``: everything else the loop does (logging, callbacks, bookkeeping).

Samples include idle ones (``--idle``): a loop waiting on a slow read is data loading, not nothing. Processes that
never run any of the training phases (a launcher waiting on its workers) are left out. The shares become the
measurement's ``phases`` (seconds per step: share × the median step time) and ``signals["stack_samples"]``, and the
diagnosis reads them as it reads a trainer's own timers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RATE_HZ = 67
"""Samples per second (py-spy's default is 100; a prime rate does not beat with a periodic loop)."""
MIN_SAMPLES = 20
"""Fewer training samples than this attribute nothing (too few to give a share)."""
PHASES = ("comm", "data", "optimizer", "backward", "forward", "host")

# (phase, pattern on "function (file:line)") in precedence order: the first phase any frame of a stack matches wins
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("comm", re.compile(r"torch/distributed/(distributed_c10d|_functional_collectives|fsdp/_runtime)|deepspeed/comm/"
                        r"|\b(all_reduce|all_gather|reduce_scatter|broadcast|barrier|all_to_all)\w* \(")),
    ("data", re.compile(r"torch/utils/data/|/datasets/|\bcollate\w* \(|\b_get_batch_samples \(|\bget_batch \(|"
                        r"\bprefetch\w* \(|\b__getitem__ \(")),
    ("optimizer", re.compile(r"torch/optim/|\boptimizer_step \(|\bzero_grad \(|\b_single_tensor_\w+ \(|"
                             r"\b_multi_tensor_\w+ \(|\b_fused_\w+ \(")),
    ("backward", re.compile(r"torch/autograd/|\bbackward \(|_engine_run_backward")),
    ("forward", re.compile(r"torch/nn/modules/|torch/nn/functional\.py|\b_call_impl \(|\bforward \(")),
)
_PROCESS = re.compile(r'^process (\d+):')
_THREAD = re.compile(r'^thread \((\w+)\)(?:: (.*))?$')


def sampler(python: str | None = None) -> str | None:
    """The py-spy executable: beside the trial's interpreter, beside attune's, or on ``PATH``; ``None`` if absent."""
    for base in (python, sys.executable):
        if base:
            cand = Path(base).parent / "py-spy"
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    return shutil.which("py-spy")


def phase_of(frames: list[str]) -> str:
    """The phase of one sampled stack (root first): the first rule any of its frames matches, else ``host``."""
    for phase, pattern in _RULES:
        if any(pattern.search(f) for f in frames):
            return phase
    return "host"


@dataclass(frozen=True)
class StackProfile:
    """What the samples showed: each phase's share of the training processes' main-thread samples."""

    shares: dict[str, float]
    samples: int
    processes: int

    def phases(self, step_time_s: float) -> dict[str, float]:
        """Seconds per step in each phase (share × the median step time)."""
        return {k: round(v * step_time_s, 6) for k, v in self.shares.items() if v > 0}


def attribute(raw: str) -> StackProfile | None:
    """Shares of the phases in py-spy's ``--format raw`` output (``--threads --subprocesses``), or ``None``.

    Each line is ``frame;frame;... count``, root first, where the first frames name the process (and its parents:
    ``process PID:"command"``) and the thread (``thread (TID): MainThread``). Of every process only its main thread
    counts; a process none of whose samples is in a training phase (a launcher) is left out."""
    per_proc: dict[str, Counter[str]] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        proc = "0"
        while frames and (m := _PROCESS.match(frames[0])):
            proc, frames = m.group(1), frames[1:]
        thread = _THREAD.match(frames[0]) if frames else None
        if thread is not None:
            frames = frames[1:]
        main = thread.group(2) == "MainThread" if thread is not None and thread.group(2) else \
            bool(frames) and frames[0].startswith("<module>")
        if not frames or not main:
            continue  # not a main thread (a loader's pin-memory thread, a TensorBoard writer...)
        per_proc.setdefault(proc, Counter())[phase_of(frames)] += int(count)
    training = {p: c for p, c in per_proc.items() if any(c[k] for k in PHASES if k != "host")}
    total: Counter[str] = Counter()
    for c in training.values():
        total.update(c)
    n = sum(total.values())
    if n < MIN_SAMPLES:
        return None
    return StackProfile(shares={k: total[k] / n for k in PHASES}, samples=n, processes=len(training))


class StackSampler:
    """py-spy attached to a trial's process group for its measurement window: :meth:`start`, then :meth:`stop`."""

    def __init__(self, binary: str, out: Path, rate_hz: int = RATE_HZ) -> None:
        self.binary = binary
        self.out = out
        self.rate_hz = rate_hz
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = False
        self.log = out.with_suffix(".log")

    def start(self, pid: int) -> None:
        self.started = True
        argv = [self.binary, "record", "--pid", str(pid), "--subprocesses", "--idle", "--threads", "--nonblocking",
                "--rate", str(self.rate_hz), "--format", "raw", "--output", str(self.out)]
        try:
            with self.log.open("wb") as err:
                self.proc = subprocess.Popen(argv, stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as e:
            log.info("no stack samples: cannot start %s: %s", self.binary, e.strerror)
            self.proc = None

    def stop(self) -> StackProfile | None:
        """End the sampling (py-spy writes its file on SIGINT) and attribute what it saw."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        try:
            raw = self.out.read_text(errors="replace")
        except OSError:
            why = self.log.read_text(errors="replace").strip().splitlines()[-1:] if self.log.exists() else []
            log.info("no stack samples (%s)", why[0] if why else f"py-spy exited with {p.returncode}")
            return None
        return attribute(raw)


__all__ = ["PHASES", "StackProfile", "StackSampler", "attribute", "phase_of", "sampler"]
