"""Prometheus scraping the real control plane's pods the way the chart's PodMonitors ask.

On a cluster, the Prometheus Operator turns each PodMonitor into a scrape job whose Kubernetes pod discovery lists the
pods through the API server, and Prometheus scrapes each selected container port. Debian's ``prometheus`` (the real one
the tests run) is built without ``kubernetes_sd_configs``, so :class:`PodMonitorDiscovery` stands in for that part
only: it reads the PodMonitor objects the chart installed (their CRD is the Prometheus Operator release's, see
``realcluster_kubeflow.monitor_crds``) and the pods, both from the real API server, and writes what the discovery would
produce into a ``file_sd`` file the real Prometheus reads. It applies each monitor the way the operator does: the
namespace selector (``any`` or ``matchNames``, else the monitor's own namespace), the label selector (``matchLabels``
and ``matchExpressions``), the endpoint's named ``port`` (a declared container port of that name), its
``relabelings`` (``keep``, ``drop`` and ``replace`` over the discovery's ``__meta_kubernetes_pod_*`` labels), its
``interval`` (``__scrape_interval__``), pods that are not Succeeded or Failed, and the target labels ``namespace``,
``pod`` and ``container`` (with ``honorLabels: false`` these win over what a pod exposes).

The pods of the pod runner share this machine's network (as ``hostNetwork`` pods do), so two pods serving the same
port at once would collide: tests give each run a port of its own (``spec.metrics.metricsPort``).
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.k8s.harness import Prometheus

GROUP, VERSION, PLURAL = "monitoring.coreos.com", "v1", "podmonitors"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (``matchLabels`` and ``matchExpressions``) against a pod's labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values, "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op)
        if ok is None:
            raise ValueError(f"unknown selector operator {op!r}")
        if not ok:
            return False
    return True


def _relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus relabelling (the actions the chart uses): ``None`` when a rule drops the target."""
    for rule in rules:
        action = rule.get("action", "replace")
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule.get("sourceLabels") or [])
        regex = re.compile(f"^(?:{rule.get('regex', '(.*)')})$")
        match = regex.match(value)
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            target = rule.get("targetLabel")
            if target:
                labels[target] = match.expand(re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", rule.get("replacement", "$1")))
        elif action not in ("keep", "drop", "replace"):
            raise ValueError(f"relabel action {action!r} is not played here")
    return labels


def targets(monitors: list[dict[str, Any]], pods: list[Any]) -> list[dict[str, Any]]:
    """The ``file_sd`` groups the PodMonitors select among the pods (see the module doc)."""
    out = []
    for mon in monitors:
        spec, mns = mon.get("spec") or {}, mon["metadata"]["namespace"]
        nsel = spec.get("namespaceSelector") or {}
        for pod in pods:
            meta, st = pod.metadata, pod.status
            if not st or not st.pod_ip or st.phase in ("Succeeded", "Failed") or meta.deletion_timestamp:
                continue
            if not nsel.get("any") and meta.namespace not in (nsel.get("matchNames") or [mns]):
                continue
            if not _selects(spec.get("selector") or {}, meta.labels or {}):
                continue
            for ep in spec.get("podMetricsEndpoints") or []:
                for c in pod.spec.containers:
                    ports = c.ports or [None]
                    for port in ports:
                        if ep.get("port") and (port is None or port.name != ep["port"]):
                            continue
                        meta_labels = {
                            "__address__": f"{st.pod_ip}:{port.container_port}" if port else st.pod_ip,
                            "__meta_kubernetes_namespace": meta.namespace, "__meta_kubernetes_pod_name": meta.name,
                            "__meta_kubernetes_pod_ip": st.pod_ip, "__meta_kubernetes_pod_container_name": c.name,
                            "__meta_kubernetes_pod_container_port_name": (port.name or "") if port else "",
                            "__meta_kubernetes_pod_container_port_number": str(port.container_port) if port else "",
                            **{f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v
                               for k, v in (meta.labels or {}).items()}}
                        labels = _relabel(meta_labels, ep.get("relabelings") or [])
                        if labels is None:
                            continue
                        group = {"namespace": meta.namespace, "pod": meta.name, "container": c.name,
                                 "job": f"podMonitor/{mns}/{mon['metadata']['name']}"}
                        if ep.get("interval"):
                            group["__scrape_interval__"] = ep["interval"]
                        out.append({"targets": [labels["__address__"]], "labels": group})
    return out


class PodMonitorDiscovery:
    """Keeps ``<prometheus sd dir>/podmonitors.json`` equal to what the PodMonitors select (module doc), every
    ``interval`` seconds, until closed."""

    def __init__(self, api: client.ApiClient, prom: Prometheus, interval: float = 0.5) -> None:
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.path: Path = prom.sd_dir / "podmonitors.json"
        self.interval, self.errors = interval, []  # type: list[str]
        self.last: list[dict[str, Any]] = []
        self.seen: set[str] = set()  # every pod ever given a target
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="podmonitor-discovery", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as err:  # noqa: BLE001 - discovery keeps going; tests waiting on a scrape report it
                self.errors.append(repr(err))
            self._stop.wait(self.interval)

    def refresh(self) -> None:
        monitors = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
        found = targets(monitors, self.core.list_pod_for_all_namespaces().items)
        if found != self.last:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(found))
            tmp.replace(self.path)
            self.last = found
            self.seen |= {t["labels"]["pod"] for t in found}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
