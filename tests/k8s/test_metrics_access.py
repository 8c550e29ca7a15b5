"""How the operator reaches Prometheus and the agent for a run: measurements that need enough steps, DCGM missing as a
condition, credentials from Secrets, allowed hosts only, HTTPS or loopback for credentials, TLS with the run's CA,
and no response body quoted in an error."""

from __future__ import annotations

import json

import pytest

from tests.k8s.conftest import good_run
from tests.k8s.fakes import FakePorts, conds, records, step, tuning_run

pytestmark = pytest.mark.k8s


# -- measurements need enough steps; DCGM missing is a condition ---------------------------------------------------

def test_a_gpu_trial_without_dcgm_data_says_so():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["recipe"]["inline"]["resources"]["accelerator"] = "h100-sxm-80gb"
    for _ in range(3):
        step(run, ports)
        ports.finish()
    c = conds(run)["GPUMetricsAvailable"]
    assert c["status"] == "False" and c["reason"] == "NoDCGMData"
    ports.signals = {"sm_active": 0.5}
    for _ in range(3):
        step(run, ports)
        ports.finish()
    assert conds(run)["GPUMetricsAvailable"]["reason"] == "PartialDCGMData"


def test_prometheus_credentials_come_from_secrets():
    from attune.operator import orgs

    ports = FakePorts()
    run = tuning_run()
    run["spec"]["metrics"]["prometheusUrl"] = "https://prom.ml.svc"  # a token goes over https only
    run["spec"]["metrics"]["prometheus"] = {"bearerTokenSecretRef": {"name": "prom", "key": "token"},
                                            "tenant": "team-a"}
    for _ in range(3):
        step(run, ports)
        ports.finish()
    c = conds(run)["MetricsAvailable"]
    assert c["reason"] == "SecretNotFound" and "prom" in c["message"] and not records(ports, run)
    ports.secrets[("prom", "token")] = "s3cret"
    orgs.configure([f"{run['metadata']['namespace']}=org-of-the-platform"])
    try:
        step(run, ports)
    finally:
        orgs.configure([])
    # the run's own tenant (past a webhook that was down) is never sent: the platform's organisation is
    assert ports.measured[2].bearer_token == "s3cret" and ports.measured[2].tenant == "org-of-the-platform"
    assert "s3cret" not in json.dumps(run["status"])


# -- URLs, auth, no response bodies, enough steps ------------------------------------------------------------------

@pytest.mark.parametrize(("url", "ok"), [
    ("http://prometheus-operated.monitoring.svc:9090", True),
    ("https://thanos.obs.svc.cluster.local", True),
    ("http://127.0.0.1:8081", True),
    ("http://localhost:9090", True),
    ("http://169.254.169.254/latest/meta-data", False),  # the cloud's metadata service
    ("http://10.0.0.1:9090", False),
    ("http://prometheus-operated.monitoring:9090", False),  # a short name: indistinguishable from a domain
    ("http://evil.example.com", False),
    ("http://user:pw@prom.monitoring.svc", False),
    ("file:///etc/passwd", False),
    ("http://svc", False),
])
def test_only_allowed_hosts_are_fetched(url, ok, monkeypatch):
    from attune.operator import urls

    monkeypatch.delenv(urls.ENV, raising=False)
    assert (urls.url_problem(url, "x") is None) is ok, urls.url_problem(url, "x")
    monkeypatch.setenv(urls.ENV, "*.example.com,10.0.0.0/8")
    assert urls.url_problem("http://evil.example.com", "x") is None and urls.url_problem("http://10.0.0.1", "x") is None
    assert urls.url_problem("http://127.0.0.1", "x") is not None


@pytest.mark.parametrize(("url", "ok"), [
    ("http://prom.ml.svc:9090", True),
    ("http://prom.ml.svc.cluster.local:9090", True),
    ("http://prometheus-operated.monitoring.svc:9090", False),  # another namespace: the platform must allow it
    ("http://agent.other-tenant.svc.cluster.local", False),
    ("http://prom.ml", False),
    ("http://prom", False),  # resolved in the operator's namespace, not the run's
])
def test_by_default_a_run_reaches_services_of_its_own_namespace_only(url, ok, monkeypatch):
    from attune.operator import urls

    monkeypatch.delenv(urls.ENV, raising=False)
    assert (urls.url_problem(url, "x", namespace="ml") is None) is ok, urls.url_problem(url, "x", namespace="ml")
    monkeypatch.setenv(urls.ENV, "namespace,prometheus-operated.monitoring.svc")  # the platform shares one
    assert urls.url_problem("http://prometheus-operated.monitoring.svc:9090", "x", namespace="ml") is None


def test_credentials_go_over_https_or_loopback_only():
    from attune.operator import urls

    assert urls.credentials_problem("https://prom.ml.svc", "x") is None
    assert urls.credentials_problem("http://127.0.0.1:9090", "x") is None
    assert "only over https" in urls.credentials_problem("http://prom.ml.svc", "x")
    try:
        urls.configure(None, insecure_credentials=True)
        assert urls.credentials_problem("http://prom.ml.svc", "x") is None
    finally:
        urls.configure(None)
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["metrics"]["prometheus"] = {"bearerTokenSecretRef": {"name": "prom", "key": "token"}}
    ports.secrets[("prom", "token")] = "s3cret"
    reads = []
    ports.read_secret = lambda *a: reads.append(a) or "s3cret"
    step(run, ports)
    c = conds(run)["MetricsAvailable"]
    assert run["status"]["phase"] == "Failed" and c["reason"] == "InsecureCredentials", c
    assert not reads and not ports.jobs_created, "a Secret was read or a trial ran for an http URL with a token"


def test_the_webhook_refuses_a_url_the_operator_may_not_fetch():
    from attune.operator.webhook import run_problems

    run = good_run("r", "http://169.254.169.254", "http://evil.example.com")
    problems = run_problems(run)
    assert any("prometheusUrl: host 169.254.169.254" in p for p in problems)
    assert any("agent.endpoint: host evil.example.com" in p for p in problems)


class _Recorder:
    """A loopback HTTP(S) server answering every request with ``status`` and ``body``, recording its headers."""

    def __init__(self, status: int, body: bytes, tls: tuple[str, str] | None = None) -> None:
        import http.server
        import ssl
        import threading

        self.headers: list[dict[str, str]] = []
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                rec.headers.append(dict(self.headers))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_prometheus_gets_its_token_and_tenant_and_its_answer_is_not_quoted_in_errors():
    from attune.operator import metrics

    secret = b'{"status": "error", "errorType": "bad_data", "error": "SECRET-INTERNAL-PAGE <html>"}'
    srv = _Recorder(500, b"SECRET-INTERNAL-PAGE " * 20)
    try:
        prom = metrics.PrometheusClient(srv.url, 5, metrics.Access(bearer_token="tok", tenant="team-a",
                                                                  basic_auth=None))
        with pytest.raises(metrics.MetricsUnavailable) as err:
            prom.query("up")
        assert "SECRET" not in str(err.value) and "HTTP 500" in str(err.value)
        assert srv.headers[0]["Authorization"] == "Bearer tok" and srv.headers[0]["X-Scope-OrgID"] == "team-a"
    finally:
        srv.close()
    srv = _Recorder(200, secret)
    try:
        with pytest.raises(metrics.MetricsUnavailable) as err:
            metrics.PrometheusClient(srv.url, 5, metrics.Access(basic_auth=("u", "p"))).query("up")
        assert "SECRET" not in str(err.value) and "bad_data" in str(err.value)
        assert srv.headers[0]["Authorization"].startswith("Basic ")
    finally:
        srv.close()


def test_the_agents_error_page_is_not_quoted():
    from attune.operator import agent_client

    srv = _Recorder(502, b"SECRET-INTERNAL-PAGE")
    try:
        with pytest.raises(agent_client.AgentUnavailable) as err:
            agent_client.ask_sidecar(srv.url, agent_client.ProposeRequest(
                policy="playbook", baseline={}, best={}, records=[], search_space=[], noise_floor=0.02,
                budget_left_hours=1.0), 5)
        assert "SECRET" not in str(err.value) and "502" in str(err.value)
    finally:
        srv.close()


def test_prometheus_over_tls_with_the_runs_ca(tmp_path):
    import shutil
    import subprocess

    from attune.operator import metrics

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test CA")
    d = tmp_path
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.crt",
        "-days", "2", "-extfile", "ext")
    ok = b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "3"]}]}}'
    srv = _Recorder(200, ok, tls=(str(d / "srv.crt"), str(d / "srv.key")))
    try:
        with pytest.raises(metrics.MetricsUnavailable):  # not trusted without the CA
            metrics.PrometheusClient(srv.url, 5).query("up")
        prom = metrics.PrometheusClient(srv.url, 5, metrics.Access(ca_pem=(d / "ca.crt").read_text()))
        assert prom.query("up") == 3.0
    finally:
        srv.close()


def test_two_steps_of_sixty_are_not_a_measurement():
    from attune.operator import metrics
    from attune.operator.resources import MetricsSpec
    from tests.k8s.fakes import ScriptedPrometheus

    m = MetricsSpec(prometheusUrl="http://p.svc", warmupSteps=2, measureSteps=60)
    few = ScriptedPrometheus(dict.fromkeys((1, 2, 3, 4), 1.0), sampled=[3, 4])
    assert metrics.min_steps(m) == 48
    assert metrics.measure_trial(few, m, "ml", "r-t001", 1000.0, 1100.0, tokens_per_step=512, devices=1) is None
    enough = ScriptedPrometheus(dict.fromkeys(range(1, 63), 1.0), sampled=[])
    meas = metrics.measure_trial(enough, m, "ml", "r-t001", 1000.0, 1100.0, tokens_per_step=512, devices=1)
    assert meas is not None and meas.steps_measured == 60
