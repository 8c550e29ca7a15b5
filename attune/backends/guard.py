"""Trial guard: ``python guard.py -- ARGV...`` runs ARGV in its own process group and ends that whole group
when the tuner goes away, however it goes (SIGKILL included).

The local backend starts the guard as a session leader with its standard input a pipe it never writes. The
guard waits on that pipe: end-of-file means the tuner's end of it is closed, which the kernel does when the
tuner dies. Then (and on SIGTERM/SIGHUP, and on the parent-death signal Linux sends) it kills its process group,
i.e. the trial and every process the trial started (torchrun's workers, data-loader workers). The guard exits
with the trial's own status, so a launcher's exit codes keep their meaning.

This file is run by path and imports nothing from attune, so it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1


GRACE_S = 5.0
_child: subprocess.Popen[bytes] | None = None
_ending = threading.Lock()


def _descendants(root: int) -> set[int]:
    """Every live descendant of ``root`` (from /proc), including those that moved to sessions of their own."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in out}
        out |= frontier
    return out


def _await_exit(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``pid`` to exit, without reaping it. Not ``Popen.wait``: this runs in a
    signal handler that interrupted the main thread inside ``child.wait()``, whose lock it would wait on in vain for
    the whole timeout (every trial attune ended took the full grace period to stop)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):  # no pidfd (old kernel): the grace period serves as the wait
        return
    try:
        select.select([fd], [], [], timeout)  # a pidfd turns readable when its process exits
    finally:
        os.close(fd)


def _kill_group(*_: object) -> None:
    """End the trial: SIGTERM it (torchrun forwards that to its workers), then SIGKILL every descendant and the
    group after a grace period. torchrun's workers run in sessions of their own, so the group alone is not enough."""
    if not _ending.acquire(blocking=False):
        return
    me = os.getpid()
    seen = _descendants(me)
    if _child is not None and _child.poll() is None:
        try:
            _child.terminate()
            _await_exit(_child.pid, GRACE_S)
        except OSError:
            pass
    for pid in seen | _descendants(me):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the guard is the group leader: this ends it last


def _watch_parent() -> None:
    # a raw read of fd 0, not sys.stdin: a daemon thread blocked inside the buffered reader holds its lock, and the
    # interpreter aborts (SIGABRT, "could not acquire lock ... at interpreter shutdown") when the trial ends first
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    _kill_group()


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: guard.py -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    try:  # a second line of defence: Linux signals us when the tuner (our parent) dies
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _kill_group)
    if os.getppid() == 1:  # the tuner died before we got here
        return 1
    global _child
    try:
        _child = child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as err:
        print(f"attune: cannot start {command[0]!r}: {err.strerror}", file=sys.stderr, flush=True)
        return 127
    threading.Thread(target=_watch_parent, daemon=True).start()
    rc = child.wait()
    for pid in _descendants(os.getpid()):  # nothing the trial started outlives it
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if rc < 0:  # died of a signal: die of the same one, so the tuner sees the same status
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter shutdown while the watcher thread still blocks on its read
