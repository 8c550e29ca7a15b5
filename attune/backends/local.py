"""Local trials: the recipe's own launch (its framework renders it) as one process group on this machine.

The launch is an argument list the framework renders from validated values, never a shell string. Its output
is read line by line as it arrives: the framework's parser turns lines into step records (timed by their
arrival where the framework prints no step time) and failure signatures. Each record keeps when its line arrived,
so a trial whose lines came in one burst (its steps then untimed) is a measurement fault that the engine runs
again (:func:`~attune.engine.measure.timing_fault`). A trial ends when its process ends or, for frameworks that
would train on to the user's full step count, as soon as warm-up plus the measurement window have been seen; the
whole process group is killed on every exit path. The budget is charged ``devices × wall-clock`` from launch to
teardown, failed trials included.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from attune.backends.base import TrialBackend, TrialRequest, TrialResult
from attune.backends.stacks import StackSampler, sampler
from attune.engine.budget import charge
from attune.engine.measure import MeasurementError, WindowEnd, summarise, timing_fault, window_end
from attune.frameworks.base import Framework, Observation
from attune.recipe.model import Recipe
from attune.trial import FailureKind, TrialOutcome, failure_message

log = logging.getLogger(__name__)


def classify(rc: int | None, timed_out: bool, obs: Observation, steps: int, *, ended_by_us: bool = False,
             exit_codes: Mapping[int, FailureKind] | None = None, log_tail: str = "") -> tuple[TrialOutcome, str]:
    """Outcome of a finished process group, from its exit status, what its output showed, and its log tail."""
    code_kind = (exit_codes or {}).get(rc or 0) if rc else None
    n_steps = len(obs.steps)
    if timed_out:
        return TrialOutcome.TIMED_OUT, f"no result before the deadline (last step seen: {n_steps}/{steps})"
    for kind, fallback in ((FailureKind.OOM, "out of memory"), (FailureKind.DIVERGED, "loss became NaN or Inf")):
        said = failure_message(obs.errors, kind)
        if said is not None or code_kind is kind:
            return kind.outcome, said or fallback
    if n_steps >= steps and (rc == 0 or ended_by_us):
        return TrialOutcome.SUCCEEDED, ""
    if obs.done and n_steps >= steps:
        # every step ran and was recorded; a rank then failed at shutdown (seen with gloo teardown)
        return TrialOutcome.SUCCEEDED, f"all {steps} steps completed, then the process group exited with {rc} at shutdown"
    comm = failure_message(obs.errors, FailureKind.COMM)
    if comm:
        return TrialOutcome.CRASHED, comm
    if rc == 0:
        return TrialOutcome.FINISHED_EARLY, (f"the launch finished by itself (exit status 0) after {n_steps} of the "
                                             f"{steps} steps the measurement needs; raise the recipe's step count "
                                             "or lower the window")
    first = obs.first_error or next((str(e.get("message", "")) for e in obs.errors), None)
    tail = " | ".join(log_tail.strip().splitlines()[-3:])
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return TrialOutcome.CRASHED, f"killed by {name} (exit status {rc}): {first or tail}"
    return TrialOutcome.FAILED, f"exit status {rc}: {first or tail}"


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0, token: str | None = None) -> None:
    """End a trial: SIGTERM its process group, SIGKILL whatever is left after ``grace_s``, then SIGKILL every process
    that still carries the trial's ``token`` in its environment (a worker that moved to a session of its own after
    the guard was killed: nothing else would end it).

    The guard is started as a session leader, so the group's id is its pid whether or not the guard still lives (a
    guard killed and already reaped still leaves its group to end)."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        if _group_ended(proc, pgid, grace_s):
            break
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if token:
        kill_tagged(token)


def _group_ended(proc: subprocess.Popen[bytes], pgid: int, within_s: float) -> bool:
    """Wait up to ``within_s`` for process group ``pgid`` to have no live member left (reaping the guard meanwhile;
    a zombie that nobody reaps, as under a container's init that does not, has ended)."""
    deadline = time.monotonic() + within_s
    while True:
        proc.poll()
        if not _live_members(pgid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _live_members(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        except (OSError, ValueError, IndexError):
            continue
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


def kill_tagged(token: str) -> list[int]:
    """SIGKILL every process (but this one) whose environment holds ``ATTUNE_TRIAL_TOKEN=token``; their pids."""
    tag = f"{TOKEN_ENV}={token}".encode()
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if tag in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
        except (OSError, ValueError):
            continue
    return killed


GUARD = str(Path(__file__).with_name("guard.py"))
TOKEN_ENV = "ATTUNE_TRIAL_TOKEN"


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _same_process(pid: int, start_ticks: int | None, token: str) -> bool:
    """True if ``pid`` is still the process that was launched (same start time; same trial token if readable)."""
    now = _start_ticks(pid)
    if now is None or (start_ticks is not None and now != start_ticks):
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return start_ticks is not None
    return f"{TOKEN_ENV}={token}".encode() in environ


def write_files(launch_files: dict[str, str], cwd: Path) -> None:
    for name, text in launch_files.items():
        path = Path(name) if Path(name).is_absolute() else cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


class LocalBackend(TrialBackend):
    """Runs each trial's launch on this machine."""

    name = "local"
    teardown_s = 12.0  # kill_group's SIGTERM grace (10 s), then SIGKILL, which ends a group at once
    #: no local trial starts Python and its framework, steps and ends in less than this
    STARTUP_FLOOR_S = 5.0

    def __init__(self, *, cache_dir: Path | None = None, metrics_port: int | None = None, python: str = sys.executable,
                 extra_env: dict[str, str] | None = None) -> None:
        self.cache_dir = cache_dir.resolve() if cache_dir else None
        self.metrics_port = metrics_port
        self.python = python
        self.extra_env = dict(extra_env or {})

    def _stack_sampler(self, fw: Framework, trial_dir: Path) -> StackSampler | None:
        """A py-spy sampler for a framework that prints no phase timers of its own (see :mod:`attune.backends.stacks`);
        ``None`` where py-spy is not installed or ``ATTUNE_STACK_SAMPLES=off``."""
        if fw.phase_keys or os.environ.get("ATTUNE_STACK_SAMPLES", "").lower() in ("off", "0"):
            return None
        binary = sampler(self.python)
        return StackSampler(binary, trial_dir / "stacks.txt") if binary else None

    def estimate_hours(self, recipe: Recipe, request: TrialRequest) -> float | None:
        """A floor, before any trial ran: a launch holds its devices for at least :attr:`STARTUP_FLOOR_S`."""
        return charge(recipe.resources.devices, self.STARTUP_FLOOR_S)

    def prepare(self, recipe: Recipe, work_dir: Path) -> dict[str, object] | None:
        step = recipe.framework_impl.setup(recipe, python=self.python)
        if step is None:
            return None
        work_dir.mkdir(parents=True, exist_ok=True)
        log_path = work_dir / "setup.log"
        t0 = time.monotonic()
        try:
            with log_path.open("wb") as log_file:
                proc = subprocess.run(list(step.argv), stdout=log_file, stderr=subprocess.STDOUT, timeout=1800,
                                      env={**os.environ, **step.env, **self.extra_env}, cwd=work_dir)
            ok, message = proc.returncode == 0, f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            ok, message = False, "ran past 1800 s"
        except OSError as err:
            ok, message = False, f"cannot start {step.argv[0]}: {err.strerror}"
        wall = time.monotonic() - t0
        if not ok:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
            message += (": " + tail[0][:300]) if tail else ""
        return {"what": step.what, "wall_s": wall, "ok": ok, "message": message, "log": str(log_path)}

    def release(self, trial_dir: Path) -> None:
        """Kill the process group a killed tuner left running for ``trial_dir``, if it is still that trial's.

        The group's leader is checked against what was saved at launch (its start time and the trial token in its
        environment), so a process id the system has since given to something else is never signalled.
        """
        try:
            saved = json.loads((trial_dir / "pgid").read_text())
            pgid, started, token = int(saved["pgid"]), saved.get("start_ticks"), str(saved.get("token", ""))
        except (OSError, ValueError, TypeError, KeyError):
            return
        if not _same_process(pgid, started, token):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                return
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)

    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        trial_dir = request.trial_dir.resolve()  # the trial runs inside it: every path it gets is absolute
        trial_dir.mkdir(parents=True, exist_ok=True)
        fw = recipe.framework_impl
        tl = fw.trial_launch(recipe, request, trial_dir, python=self.python, metrics_port=self.metrics_port)
        cwd = Path(tl.launch.cwd) if tl.launch.cwd else trial_dir
        write_files(dict(tl.launch.files), cwd)
        token = uuid.uuid4().hex
        env = {**os.environ, **tl.launch.env, "PYTHONUNBUFFERED": "1", **self.extra_env, TOKEN_ENV: token}
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.cache_dir or trial_dir / "inductor-cache"))
        if self.cache_dir:
            env["TORCHINDUCTOR_CACHE_DIR"] = str(self.cache_dir)
        parser = fw.parser(recipe)
        spy = self._stack_sampler(fw, trial_dir)
        enough = threading.Event()
        window: list[WindowEnd] = []  # where the adaptive window ended (request.plan), once it has
        devices = recipe.resources.devices
        log_path = trial_dir / "log.txt"
        timed_out = ended_by_us = False
        t0 = time.monotonic()
        with log_path.open("wb") as log_file:
            # the guard ends the trial's whole process group if this process dies (its stdin pipe closes)
            proc = subprocess.Popen([sys.executable, GUARD, "--", *tl.launch.argv], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, cwd=cwd)
            (trial_dir / "pgid").write_text(json.dumps({"pgid": proc.pid, "start_ticks": _start_ticks(proc.pid),
                                                        "token": token}))

            def pump() -> None:
                assert proc.stdout is not None
                for raw in iter(proc.stdout.readline, b""):
                    now = time.monotonic()
                    try:
                        log_file.write(raw)
                        log_file.flush()
                    except (ValueError, OSError):  # the trial is over and its log closed (a leftover still wrote)
                        break
                    seen = len(parser.steps)
                    parser.feed(raw.decode("utf-8", errors="replace"), now)
                    for rec in parser.steps[seen:]:  # when each step's line arrived: a burst shows (timing_fault)
                        rec.setdefault("arrived_s", now - t0)
                    if spy is not None and not spy.started and len(parser.steps) >= max(1, request.warmup_steps):
                        spy.start(proc.pid)  # the measurement window begins: sample where its time goes
                    if tl.stop_after_steps is not None and len(parser.steps) >= tl.stop_after_steps:
                        enough.set()
                    if request.plan is not None and not window and len(parser.steps) > seen:
                        end = window_end(parser.steps, request, devices)
                        if end is not None:  # measured enough: the trial ends here
                            window.append(end)
                            enough.set()
                enough.set()  # end of output: the process is exiting

            reader = threading.Thread(target=pump, name=f"trial-{request.trial_id}-output", daemon=True)
            reader.start()
            try:
                deadline = t0 + request.timeout_s
                # until enough steps, the end of the output, the deadline, or the guard's death (killed from
                # outside: whatever it started may hold the output open, and nothing supervises it any more)
                while not enough.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.01))):
                    if proc.poll() is not None:
                        break
                    if time.monotonic() >= deadline:
                        timed_out = True
                        break
                if not timed_out and proc.poll() is None and (window or (tl.stop_after_steps is not None
                                                             and len(parser.steps) >= tl.stop_after_steps)):
                    ended_by_us = True
            finally:
                profile = spy.stop() if spy is not None else None
                kill_group(proc, token=token)
                reader.join(timeout=10)
                if proc.stdin is not None:
                    proc.stdin.close()
        wall = time.monotonic() - t0
        obs = fw.collect(parser, trial_dir)
        log_text = log_path.read_text(errors="replace")
        if not window and request.plan is not None and len(obs.steps) >= request.steps:
            end = window_end(obs.steps, request, devices)  # the process ended as its last step arrived
            window += [end] if end is not None else []
        ran = min(len(obs.steps), request.steps)
        needed = ran if window else request.steps  # an adaptive window ends the trial when it has measured enough
        outcome, message = classify(proc.returncode, timed_out, obs, needed, ended_by_us=ended_by_us,
                                    exit_codes=fw.exit_codes, log_tail=log_text[-4000:])
        warmup = window[0].warmup if window else request.warmup_steps
        measurement = None
        try:
            if outcome is TrialOutcome.SUCCEEDED:
                measurement = summarise(obs.steps[:ran], warmup_steps=warmup, devices=devices,
                                        reported=obs.reported, ended=window[0].reason if window else None)
                fault = timing_fault(obs.steps[:ran], warmup_steps=warmup, wall_s=wall) \
                    if measurement is not None else None
                if fault is not None:
                    outcome, message = TrialOutcome.MISMEASURED, f"measurement fault: {fault}"
                if measurement is not None and profile is not None and not measurement.phases:
                    measurement = measurement.model_copy(update={
                        "phases": profile.phases(measurement.step_time_median_s),
                        "signals": {**measurement.signals, "stack_samples": float(profile.samples)}})
            elif outcome is TrialOutcome.DIVERGED:
                measurement = summarise(obs.steps, warmup_steps=0, devices=devices,
                                        reported=obs.reported) if obs.steps else None
        except MeasurementError as err:
            outcome, message, measurement = TrialOutcome.FAILED, str(err), None
        log.info("trial %s: %s in %.1fs %s", request.trial_id, outcome.value, wall, message)
        return TrialResult(outcome=outcome, measurement=measurement, wall_s=wall, devices=devices,
                           charged_hours=charge(devices, wall), message=message)
