"""Issue 39, item 16: the DCGM exporter's series as a real Prometheus stores them. Scraped the way its chart's
ServiceMonitor does by default (``honorLabels: false``, the scrape's target labels naming the exporter's own pod),
the exporter's ``pod``/``namespace`` (the pod using the GPU) become ``exported_pod``/``exported_namespace``: the
trial's GPU series are found under those, by default, and never under the trainer's ``podLabel``."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from attune.operator import metrics
from attune.operator.resources import MetricsSpec
from tests.k8s.harness import Prometheus, wait_for

pytestmark = [pytest.mark.k8s]

#: what dcgm-exporter (--kubernetes) writes for a GPU a trial pod uses
EXPOSITION = ('# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n'
              'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-1",pod="r-t001-master-0",namespace="ml",container="pytorch"} '
              '0.625\n')


class _Exporter:
    def __init__(self) -> None:
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = EXPOSITION.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_trials_gpu_series_are_found_where_the_exporters_scrape_put_them(prometheus: Prometheus) -> None:
    exporter = _Exporter()
    target = prometheus.sd_dir / "dcgm-exporter.json"
    try:
        # the ServiceMonitor's target labels: the exporter's own pod and namespace
        target.write_text(json.dumps([{"targets": [f"127.0.0.1:{exporter.port}"],
                                       "labels": {"pod": "nvidia-dcgm-exporter-x7k2p", "namespace": "gpu-operator"}}]))
        prom = metrics.PrometheusClient(prometheus.url, 5)
        stored = wait_for(lambda: prom.query_vector("DCGM_FI_PROF_SM_ACTIVE"), 30, "Prometheus to scrape the exporter")
        labels = stored[0][0]
        assert labels["exported_pod"] == "r-t001-master-0" and labels["pod"] == "nvidia-dcgm-exporter-x7k2p"
        default = MetricsSpec(prometheusUrl=prometheus.url)
        q = metrics.dcgm_queries(default, "ml", "r-t001", 60)["sm_active"]
        assert prom.query(q) == pytest.approx(0.625)
        # the trainer's podLabel on DCGM's series (what the operator queried before): nothing
        old = q.replace("exported_namespace=", "namespace=").replace("exported_pod=~", "pod=~")
        assert prom.query(old) is None
    finally:
        target.unlink(missing_ok=True)
        exporter.close()
