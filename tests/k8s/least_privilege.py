"""The excess-permission check of a run of the whole tests/k8s directory: every permission the chart grants is used
by some test's operator.

Each operator under test leaves its authorization decisions in a folder shared by the run's processes (named after
pytest-xdist's testrunuid, which the controller fixes before it starts the workers; a fresh one without xdist). Each
process notes, at the end of its session (after its session fixtures wrote their usage), which tests/k8s tests it
started, which failed or were skipped, and whether any was deselected. The controller (the only process without
xdist) checks once every worker has ended, and only when the selection was the whole directory (every test file,
nothing deselected, nothing failed or skipped): then a granted permission no request used fails the run.

(Seen: the check ran in the worker whose notes completed the set of *started* tests while the other worker's
session-scoped release had not yet written what its operator used, and reported permissions as unused.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.k8s import rbac

K8S_DIR = Path(__file__).resolve().parent
_RUN: dict[str, Any] = {"started": set(), "bad": set(), "deselected": False, "selected": set(), "uses_kube": set()}


def configure(config: pytest.Config) -> None:
    """Name the usage folder after the run: the controller picks the testrunuid its workers will be given."""
    uid = getattr(config, "workerinput", {}).get("testrunuid")
    if uid is None:
        try:
            uid = config.getoption("testrunuid") or uuid.uuid4().hex
            config.option.testrunuid = uid  # xdist's controller hands this one to every worker
        except ValueError:  # xdist not loaded
            uid = uuid.uuid4().hex
    os.environ.setdefault(rbac.USAGE_ENV, str(Path(tempfile.gettempdir()) / f"attune-rbac-usage-{uid}"))


def in_k8s(item: pytest.Item) -> bool:
    return Path(str(item.fspath)).resolve().parent == K8S_DIR


def deselected(items: list[pytest.Item]) -> None:
    if any(in_k8s(i) for i in items):
        _RUN["deselected"] = True


def collected(session: pytest.Session) -> None:
    _RUN["selected"] = {i.nodeid for i in session.items if in_k8s(i)}
    _RUN["uses_kube"] = {i.nodeid for i in session.items if in_k8s(i) and "kube" in getattr(i, "fixturenames", ())}


def started(nodeid: str) -> None:
    if nodeid in _RUN["selected"]:
        _RUN["started"].add(nodeid)


def reported(report: pytest.TestReport) -> None:
    if report.nodeid in _RUN["selected"] and (report.failed or (report.skipped and report.nodeid in _RUN["uses_kube"])):
        _RUN["bad"].add(report.nodeid)


def finish(session: pytest.Session) -> None:
    """At the end of a process's session: note what it ran; in the controller, run the check."""
    folder = Path(os.environ[rbac.USAGE_ENV])
    if _RUN["selected"]:
        folder.mkdir(parents=True, exist_ok=True)
        note = {"started": sorted(_RUN["started"]), "bad": sorted(_RUN["bad"]), "deselected": _RUN["deselected"],
                "selected": sorted(_RUN["selected"])}
        (folder / f"run-{os.getpid()}.note").write_text(json.dumps(note))
    if hasattr(session.config, "workerinput"):
        return  # a worker: the controller checks once every worker has ended
    problem = check(folder)
    shutil.rmtree(folder, ignore_errors=True)
    if problem:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "least privilege", red=True, bold=True)
            reporter.write_line(problem, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def check(folder: Path) -> str | None:
    """The failure message when the whole directory ran cleanly and the chart grants what no operator used."""
    notes = [json.loads(p.read_text()) for p in folder.glob("run-*.note")]
    if not notes:
        return None
    selected = set().union(*(n["selected"] for n in notes))
    ran = set().union(*(n["started"] for n in notes))
    files = {Path(n.split("::")[0]).name for n in selected}
    whole = {p.name for p in K8S_DIR.glob("test_*.py")} <= files and not any(n["deselected"] for n in notes)
    if not whole or selected - ran or any(n["bad"] for n in notes):
        return None
    unused = unused_permissions(folder)
    if not unused:
        return None
    return ("the chart grants permissions no test's operator used (excess privilege: drop them from "
            "charts/attune/templates/rbac.yaml, or add a test that needs them): "
            + ", ".join(f"{v} {r} ({g or 'core'})" for g, r, v in sorted(unused)))


def unused_permissions(folder: Path) -> set[tuple[str, str, str]]:
    used: set[tuple[str, str, str]] = set()
    granted: set[tuple[str, str, str]] = set()
    for path in folder.glob("*.json"):
        usage = json.loads(path.read_text())
        granted |= rbac.granted_atoms(rbac.chart_rbac(usage["mode"]))
        used |= {rbac.used_atom(d) for d in usage["decisions"] if d["allowed"] and d["resource"]}
    return rbac.unused_atoms(granted, used)
