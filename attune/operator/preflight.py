"""Start-up checks of the operator (``attune operator run --preflight``, as the chart runs it), before any handler.

* **CRD revision.** The served TuningRun and TuningTrial CRDs must be at least :data:`crdgen.SCHEMA_REVISION`
  (the ``attune.dev/schema-revision`` annotation; a CRD without it is revision 1). Helm never upgrades a chart's
  ``crds/``, so an operator upgraded without its CRDs would write fields the API server prunes: it refuses to run
  and names the fix. A newer CRD is accepted (CRD changes are additive).
* **Peering object.** With ``--peering``, kopf coordinates replicas through a (Cluster)KopfPeering object, which
  must exist: the operator creates its own (the chart cannot: its CRD may be installed by the same release, and Helm
  maps every kind before creating anything). A missing peering CRD is reported with the fix.
* **Webhook certificates.** Without cert-manager, :func:`attune.operator.certs.ensure` (see there).
* **What the runs will need** (never fatal: one readable line each, a warning where something is missing): which
  trial job kinds the cluster serves (PyTorchJob: the Kubeflow training operator; TrainJob: Kubeflow Trainer), and
  whether a Prometheus of the Prometheus Operator selects the chart's PodMonitor (:func:`environment_lines`).

:func:`crd_problems` is pure (over the CRD objects); the rest are thin API calls. Any failure is a
:class:`PreflightError`, which :func:`run` turns into kopf's permanent error so the operator exits with the message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attune.operator.crdgen import REVISION_ANNOTATION, SCHEMA_REVISION
from attune.operator.resources import GROUP, RUN_PLURAL, TRIAL_PLURAL, VERSION

if TYPE_CHECKING:  # certs needs the cryptography package: imported only when certificates are kept
    from attune.operator import certs

log = logging.getLogger(__name__)

CRD_NAMES = (f"{RUN_PLURAL}.{GROUP}", f"{TRIAL_PLURAL}.{GROUP}")
PEERING_GROUP, PEERING_VERSION = "kopf.dev", "v1"
#: ``--force-conflicts``: server-side apply refuses to change a schema another field manager applied (an older chart's
#: Helm, another kubectl field manager) until told to take it over (tests/k8s/test_real_crds.py, on kube-apiserver)
CRD_FIX = ("upgrade the CRDs: `kubectl apply --server-side --force-conflicts -f crds/` from this operator's release, "
           "or `helm upgrade` the chart with crds.install=true")


class PreflightError(RuntimeError):
    """The operator cannot run here; the message says why and what to do."""


@dataclass(frozen=True)
class StartupPlan:
    """What the operator checks and prepares at start-up (from ``attune operator run``'s flags)."""

    check_crds: bool = False
    peering: str | None = None
    namespaces: tuple[str, ...] = ()
    certs: certs.CertPlan | None = None
    #: the labels and namespace of the chart's trial PodMonitor (None: no PodMonitor, nothing to check)
    podmonitor: tuple[dict[str, str], str] | None = None


#: the trial job kinds: API version, plural, kind, what serves it
JOB_KINDS = (("kubeflow.org/v1", "pytorchjobs", "PyTorchJob", "the Kubeflow training operator"),
             ("trainer.kubeflow.org/v1alpha1", "trainjobs", "TrainJob", "Kubeflow Trainer"))


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (``matchLabels``, ``matchExpressions``) selects ``labels``; None selects
    nothing (the Prometheus Operator's reading of an unset podMonitorSelector), ``{}`` everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def _show(selector: dict[str, Any] | None) -> str:
    if selector is None:
        return "none (unset)"
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    parts += [f"{e.get('key')} {e.get('operator')} {e.get('values') or ''}".strip()
              for e in selector.get("matchExpressions") or []]
    return ", ".join(parts) or "every PodMonitor"


def environment_lines(served: dict[str, bool | None], podmonitor: tuple[dict[str, str], str] | None,
                      prometheuses: list[dict[str, Any]] | None) -> list[tuple[bool, str]]:
    """One line per thing the runs need, each ``(ok, line)``: the trial job kinds served (``served``: kind → served,
    None when discovery did not answer), and, for the chart's PodMonitor (its labels and namespace), the Prometheus
    objects that select it (``prometheuses``: None when the cluster serves no Prometheus kind)."""
    out: list[tuple[bool, str]] = []
    kinds = {kind: (api, what) for api, _, kind, what in JOB_KINDS}
    shown = [f"{kind} ({kinds[kind][0]}) " + ("served" if ok else "not served" if ok is False else
                                              "unknown (API discovery did not answer)")
             for kind, ok in served.items()]
    if not any(served.values()):
        out.append((False, "trial jobs: " + "; ".join(shown) + ": every run fails CRDNotInstalled until "
                    "the Kubeflow training operator (PyTorchJob) or Kubeflow Trainer (TrainJob) is installed"))
    else:
        missing = [f"install {kinds[k][1]} for {k} trial templates" for k, ok in served.items() if ok is False]
        out.append((True, "trial jobs: " + "; ".join(shown) + (f" ({'; '.join(missing)})" if missing else "")))
    if podmonitor is None:
        return out
    labels, namespace = podmonitor
    if prometheuses is None:
        out.append((False, f"trial scraping: the cluster serves no Prometheus (monitoring.coreos.com/v1): the chart's "
                    f"PodMonitor in {namespace} is read by nobody; point your Prometheus at the trial pods' "
                    "attune-metrics port, or install the Prometheus Operator (kube-prometheus-stack)"))
        return out
    picked, seen = [], []
    for p in prometheuses:
        meta, spec = p.get("metadata") or {}, p.get("spec") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        nsel = spec.get("podMonitorNamespaceSelector")  # unset: its own namespace only; {}: every namespace
        ns = ("yes" if meta.get("namespace") == namespace else "no") if nsel is None else \
            "maybe" if nsel.get("matchLabels") or nsel.get("matchExpressions") else "yes"
        if selects(spec.get("podMonitorSelector"), labels) and ns != "no":
            picked.append(where + ("" if ns == "yes" else f" (if namespace {namespace}'s labels match {_show(nsel)})"))
        else:
            seen.append(f"{where} selects {_show(spec.get('podMonitorSelector'))}"
                        + (f" in its own namespace {meta.get('namespace')} only" if ns == "no" else ""))
    if picked:
        out.append((True, f"trial scraping: the PodMonitor in {namespace} is selected by Prometheus "
                    + ", ".join(picked)))
    else:
        have = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
        out.append((False, f"trial scraping: no Prometheus selects the chart's PodMonitor in {namespace} (labels "
                    f"{have}): " + ("; ".join(seen) or "there is no Prometheus object") + ": set "
                    "trials.podMonitor.labels to what yours selects, and runs are measured"))
    return out


def served_revision(crd: dict[str, Any]) -> int:
    """The schema revision of a served CRD: its annotation, 1 when absent or unreadable."""
    raw = ((crd.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION)
    try:
        return int(raw) if raw is not None else 1
    except (TypeError, ValueError):
        return 1


def crd_problems(crds: dict[str, dict[str, Any] | None], needed: int = SCHEMA_REVISION) -> list[str]:
    """What is wrong with the served CRDs (name → object, None when not found) for an operator needing
    revision ``needed``; empty when it may run."""
    problems = []
    for name in CRD_NAMES:
        crd = crds.get(name)
        if crd is None:
            problems.append(f"CRD {name} is not installed")
            continue
        versions = {v.get("name"): v for v in (crd.get("spec") or {}).get("versions") or []}
        if not (versions.get(VERSION) or {}).get("served"):
            problems.append(f"CRD {name} does not serve {VERSION}")
        revision = served_revision(crd)
        if revision < needed:
            problems.append(f"CRD {name} is at schema revision {revision}, older than this operator's {needed}")
        elif revision > needed:
            log.warning("CRD %s is at schema revision %d, newer than this operator's %d: fine if additive",
                        name, revision, needed)
    return problems


def check_crds(read: Callable[[str], dict[str, Any] | None], needed: int = SCHEMA_REVISION) -> None:
    """Refuse to run against missing or older CRDs (``read``: name → CRD object or None)."""
    problems = crd_problems({name: read(name) for name in CRD_NAMES}, needed)
    if problems:
        raise PreflightError("; ".join(problems) + f". The operator will not run against them: {CRD_FIX}")


def peering_body(name: str, namespace: str | None) -> dict[str, Any]:
    """The (Cluster)KopfPeering object kopf's replicas meet in (its status is kopf's)."""
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "attune",
                                                     "app.kubernetes.io/managed-by": "attune-operator"}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": f"{PEERING_GROUP}/{PEERING_VERSION}",
            "kind": "KopfPeering" if namespace else "ClusterKopfPeering", "metadata": meta}


def _forbidden(verb: str, resource: str, how: str) -> PreflightError:
    return PreflightError(f"forbidden to {verb} {resource}: the operator's ServiceAccount needs '{verb}' on "
                          f"{resource} ({how})")


class KubePreflightApi:
    """The API calls of the checks, through the official ``kubernetes`` client."""

    def __init__(self, api: Any | None = None) -> None:
        from kubernetes import client

        from attune.operator.kube import api_client

        self.api = api or api_client()
        self.ext = client.ApiextensionsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def read_crd(self, name: str) -> dict[str, Any] | None:
        import json

        from kubernetes.client.exceptions import ApiException

        from attune.operator.kube import api_message

        try:
            resp = self.ext.read_custom_resource_definition(name, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            if err.status == 403:
                raise _forbidden("get", f"customresourcedefinitions.apiextensions.k8s.io/{name}",
                                 "the chart grants it by name; or run without --preflight") from None
            raise PreflightError(f"cannot read CRD {name}: {err.status} {' '.join(api_message(err))}") from None
        return dict(json.loads(resp.data))

    def served(self, api_version: str, plural: str) -> bool | None:
        """Whether discovery lists ``plural`` (None: discovery did not answer)."""
        from attune.operator.kube import DiscoveryUnavailable, Kube

        try:
            return Kube(self.api).served(api_version, plural)
        except DiscoveryUnavailable:
            return None

    def prometheuses(self) -> list[dict[str, Any]] | None:
        """The Prometheus Operator's Prometheus objects in every namespace (None: the kind is not served)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return list(self.custom.list_cluster_custom_object("monitoring.coreos.com", "v1", "prometheuses")["items"])
        except ApiException as err:
            if err.status == 404:
                return None
            if err.status == 403:
                raise _forbidden("list", "prometheuses.monitoring.coreos.com", "the chart grants it with "
                                 "trials.podMonitor.enabled") from None
            raise

    def create_peering(self, name: str, namespace: str | None) -> None:
        from kubernetes.client.exceptions import ApiException

        from attune.operator.kube import api_message

        plural = "kopfpeerings" if namespace else "clusterkopfpeerings"
        try:
            if namespace:
                self.custom.create_namespaced_custom_object(PEERING_GROUP, PEERING_VERSION, namespace, plural,
                                                            peering_body(name, namespace))
            else:
                self.custom.create_cluster_custom_object(PEERING_GROUP, PEERING_VERSION, plural,
                                                         peering_body(name, None))
        except ApiException as err:
            if err.status == 409:
                return  # it exists: the usual case
            where = f" in {namespace}" if namespace else ""
            if err.status == 404:
                raise PreflightError(
                    f"kopf's peering CRD {plural}.{PEERING_GROUP} is not installed, so replicas cannot coordinate: "
                    "install it once per cluster (helm: operator.leaderElection.installPeeringCRDs=true on one "
                    "release), or run one replica without peering (operator.leaderElection.enabled=false)") from None
            if err.status == 403:
                raise _forbidden("create", f"{plural}.{PEERING_GROUP}{where}", "the chart grants it with "
                                 "operator.leaderElection.enabled=true") from None
            raise PreflightError(f"cannot create the peering object {name}{where}: {err.status} "
                                 f"{' '.join(api_message(err))}") from None


def report_environment(plan: StartupPlan, api: Any) -> list[tuple[bool, str]]:
    """:func:`environment_lines` from the API, each logged (a warning where something is missing)."""
    served = {kind: api.served(version, plural) for version, plural, kind, _ in JOB_KINDS}
    prometheuses = api.prometheuses() if plan.podmonitor is not None else None
    lines = environment_lines(served, plan.podmonitor, prometheuses)
    for ok, line in lines:
        (log.info if ok else log.warning)("preflight: %s", line)
    return lines


def prepare(plan: StartupPlan, api: Any = None, cert_api: certs.CertApi | None = None) -> None:
    """Run the checks ``plan`` asks for; raises :class:`PreflightError` or :class:`certs.CertError`."""
    if plan.check_crds or plan.peering:
        api = api or KubePreflightApi()
    if plan.check_crds:
        check_crds(api.read_crd)
        log.info("preflight: CRDs %s at schema revision >= %d", ", ".join(CRD_NAMES), SCHEMA_REVISION)
        try:
            report_environment(plan, api)
        except Exception as err:  # what runs will need is said, never a reason not to start
            log.warning("preflight: could not check the trial job kinds and scraping: %s", err)
    if plan.peering:
        for namespace in plan.namespaces or (None,):
            api.create_peering(plan.peering, namespace)
    if plan.certs is not None:
        from attune.operator import certs

        certs.ensure(plan.certs, cert_api or certs.KubeCertApi())


def run(plan: StartupPlan | None) -> None:
    """:func:`prepare`, a failure made kopf's permanent error: the operator exits, saying why."""
    import kopf

    if plan is None:
        return
    errors: tuple[type[Exception], ...] = (PreflightError,)
    if plan.certs is not None:
        from attune.operator.certs import CertError

        errors = (PreflightError, CertError)
    try:
        prepare(plan)
    except errors as err:
        log.error("preflight failed: %s", err)
        raise kopf.PermanentError(f"preflight failed: {err}") from err
