"""``attune operator``: run the Kubernetes operator, or regenerate the CRDs."""

from __future__ import annotations

import asyncio
import enum
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer


class LogLevel(str, enum.Enum):
    """The operator's log levels (the chart's ``operator.logLevel`` enum)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def level(self) -> int:
        return int(getattr(logging, self.name))


class LogFormat(str, enum.Enum):
    """The operator's log line format (the chart's ``operator.logFormat``): ``text``, or ``json`` (kopf's own JSON
    lines: one object per record, with the Kubernetes object it concerns under ``object``)."""

    TEXT = "text"
    JSON = "json"


app = typer.Typer(name="operator", help="The Kubernetes operator (TuningRun / TuningTrial).", no_args_is_help=True,
                  add_completion=False)


@app.command()
def run(
    namespace: Annotated[Optional[list[str]], typer.Option("--namespace", "-n", help="watch only these")] = None,
    interval: Annotated[float, typer.Option(help="seconds between reconcile steps of a run")] = 10.0,
    metrics_port: Annotated[int, typer.Option(help="port of the operator's /metrics (0: off)")] = 8080,
    webhook_port: Annotated[int, typer.Option(help="port of the admission webhook (0: off)")] = 0,
    webhook_addr: Annotated[str, typer.Option(help="address the webhook listens on")] = "0.0.0.0",
    webhook_cert: Annotated[Optional[str], typer.Option(help="TLS certificate (e.g. from cert-manager)")] = None,
    webhook_key: Annotated[Optional[str], typer.Option(help="TLS private key")] = None,
    liveness: Annotated[Optional[str], typer.Option(help="e.g. http://0.0.0.0:8081/healthz")] = None,
    peering: Annotated[Optional[str], typer.Option(
        help="kopf peering object to coordinate replicas through (hot standby); none: standalone")] = None,
    priority: Annotated[Optional[int], typer.Option(
        help="peering priority of this replica (default: random, so replicas never tie)")] = None,
    allow_host: Annotated[Optional[list[str]], typer.Option(
        "--allow-host", help="host pattern the operator may fetch user-supplied URLs from (prometheusUrl, "
                             "agent.endpoint): name, *.suffix, CIDR, 'namespace' (a Service of the run's own "
                             "namespace) or 'loopback'; repeatable; default: namespace and loopback (or "
                             "$ATTUNE_ALLOWED_HOSTS)")] = None,
    trial_writer: Annotated[Optional[list[str]], typer.Option(
        "--trial-writer", help="user who may write TuningTrials and TuningRuns' status (repeatable; default: the "
                               "operator's own service account, from its token); the webhook refuses everybody "
                               "else's")] = None,
    prometheus_org: Annotated[Optional[list[str]], typer.Option(
        "--prometheus-org", help="NAMESPACE=ORG: the Prometheus organisation (X-Scope-OrgID: Cortex, Mimir, Thanos "
                                 "Receive) the operator sends for runs of NAMESPACE; * for every other namespace; "
                                 "repeatable; default: no header. A run cannot name another")] = None,
    podmonitor_label: Annotated[Optional[list[str]], typer.Option(
        "--podmonitor-label", help="KEY=VALUE: a label of the trials' PodMonitor (the chart's); with --preflight, "
                                   "the start-up says whether a Prometheus selects it; repeatable")] = None,
    podmonitor_namespace: Annotated[Optional[str], typer.Option(
        envvar="POD_NAMESPACE", help="namespace of the trials' PodMonitor (the operator's)")] = None,
    hours_quota: Annotated[Optional[list[str]], typer.Option(
        "--hours-quota", help="NAMESPACE=HOURS/PERIOD: the accelerator-hours runs of NAMESPACE may spend a UTC day, "
                              "week or month (e.g. ml=200/month); * for every other namespace; repeatable; counted "
                              "in the ConfigMap attune-hours-ledger of --ledger-namespace")] = None,
    ledger_namespace: Annotated[Optional[str], typer.Option(
        envvar="POD_NAMESPACE", help="namespace of the accelerator-hours ledger (the operator's own; needed with "
                                     "--hours-quota)")] = None,
    allow_insecure_credentials: Annotated[bool, typer.Option(
        help="send Prometheus credentials over plain http too (default: https or loopback only)")] = False,
    preflight: Annotated[bool, typer.Option(
        "--preflight/--no-preflight", help="at start-up, refuse older served CRDs (needs get on the CRDs) and, with "
                                           "--peering, create the peering object (needs create on it)")] = False,
    webhook_cert_secret: Annotated[Optional[str], typer.Option(
        help="keep the webhook's self-signed CA and serving pair in this Secret (created, reused, rotated) and "
             "write the pair to --webhook-cert/--webhook-key; none: the files come from elsewhere (cert-manager)")
    ] = None,
    webhook_cert_namespace: Annotated[Optional[str], typer.Option(
        envvar="POD_NAMESPACE", help="namespace of --webhook-cert-secret and --webhook-service (the operator's)")
    ] = None,
    webhook_service: Annotated[Optional[str], typer.Option(
        help="the webhook's Service: the serving certificate is for NAME.NAMESPACE.svc[.cluster.local]")] = None,
    webhook_host: Annotated[Optional[list[str]], typer.Option(
        help="another name or IP address the API server reaches the webhook at, added to its self-signed serving "
             "certificate (an operator outside the cluster, behind the chart's webhook.url); repeatable")] = None,
    webhook_config: Annotated[Optional[str], typer.Option(
        help="ValidatingWebhookConfiguration whose caBundle the operator sets (with --webhook-cert-secret)")] = None,
    log_level: Annotated[LogLevel, typer.Option(help="the operator's log level (the chart's operator.logLevel)")
                         ] = LogLevel.INFO,
    log_format: Annotated[LogFormat, typer.Option(help="text, or json: one JSON object per line, for log "
                                                       "collectors (the chart's operator.logFormat)")] = LogFormat.TEXT,
    verbose: Annotated[bool, typer.Option("--verbose", help="the same as --log-level=debug")] = False,
) -> None:
    """Run the operator until interrupted (standalone, or one of several replicas with ``--peering``)."""
    import kopf

    from attune.operator.handlers import Options, build_registry
    from attune.operator.preflight import StartupPlan

    level = logging.DEBUG if verbose else log_level.level
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        force=True)  # the CLI's own WARNING default would silence an operator's INFO log
    if log_format is LogFormat.JSON:
        logging.getLogger().handlers.clear()
        kopf.configure(log_format=kopf.LogFormat.JSON, log_refkey="object")
        logging.getLogger().setLevel(level)
    import os

    missing = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p and not Path(p).is_file()]
    if missing:  # kopf would retry its login every minute, a traceback each time
        raise typer.BadParameter(f"KUBECONFIG names {', '.join(missing)}, which is not a file: point it at your "
                                 "kubeconfig, or unset it (in a pod the ServiceAccount's token is used)")
    try:  # refused before anything starts, naming the item
        from attune.operator.orgs import parse as parse_orgs

        parse_orgs(prometheus_org or ())
        from attune.operator.quota import parse as parse_quotas

        parse_quotas(hours_quota or ())
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if hours_quota and not ledger_namespace:
        raise typer.BadParameter("--hours-quota needs --ledger-namespace (or $POD_NAMESPACE): the namespace whose "
                                 "ConfigMap attune-hours-ledger counts what each namespace spent")
    cert_plan = None
    if webhook_host and not webhook_cert_secret:
        raise typer.BadParameter("--webhook-host names hosts of the self-signed certificate the operator keeps: it "
                                 "needs --webhook-cert-secret (with cert-manager, list the names in its Certificate)")
    if webhook_cert_secret:
        from attune.operator.certs import CertPlan

        missing = [flag for flag, value in (("--webhook-cert-namespace (or $POD_NAMESPACE)", webhook_cert_namespace),
                                            ("--webhook-service", webhook_service), ("--webhook-cert", webhook_cert),
                                            ("--webhook-key", webhook_key)) if not value]
        if missing:
            raise typer.BadParameter(f"--webhook-cert-secret needs {', '.join(missing)}")
        assert webhook_cert_namespace and webhook_service and webhook_cert and webhook_key  # for mypy
        cert_plan = CertPlan(secret_name=webhook_cert_secret, namespace=webhook_cert_namespace,
                             service=webhook_service, cert_file=webhook_cert, key_file=webhook_key,
                             webhook_config=webhook_config, hosts=tuple(webhook_host or ()))
    labels = dict(item.partition("=")[::2] for item in podmonitor_label or ())
    if podmonitor_label and (not podmonitor_namespace or any(not k for k in labels)):
        raise typer.BadParameter("--podmonitor-label takes KEY=VALUE, and needs --podmonitor-namespace (or "
                                 "$POD_NAMESPACE)")
    startup = StartupPlan(check_crds=preflight, peering=peering if preflight else None,
                          namespaces=tuple(namespace or ()), certs=cert_plan,
                          podmonitor=(labels, podmonitor_namespace) if labels and podmonitor_namespace else None)
    opts = Options(interval_s=interval, metrics_port=metrics_port or None, webhook_port=webhook_port or None,
                   webhook_addr=webhook_addr, webhook_cert=webhook_cert, webhook_key=webhook_key,
                   allowed_hosts=tuple(allow_host or ()), insecure_credentials=allow_insecure_credentials,
                   trial_writers=tuple(trial_writer or ()), prometheus_orgs=tuple(prometheus_org or ()),
                   hours_quotas=tuple(hours_quota or ()), ledger_namespace=ledger_namespace, startup=startup)
    registry = build_registry(opts)
    if peering:
        import random

        main = kopf.operator(registry=registry, standalone=False, peering_name=peering,
                             priority=priority if priority is not None else random.randint(1, 32767),
                             clusterwide=not namespace, namespaces=namespace or (), liveness_endpoint=liveness)
    else:
        main = kopf.operator(registry=registry, standalone=True, clusterwide=not namespace,
                             namespaces=namespace or (), liveness_endpoint=liveness)
    from kopf._core.engines.activities import ActivityError  # kopf does not re-export it

    try:
        asyncio.run(main)
    except ActivityError as err:  # a start-up check refused to run here: its message, not kopf's traceback
        from attune.commands import fail
        from attune.errors import AttuneError

        cause: BaseException | None = err
        while cause is not None and cause.__cause__ is not None:
            cause = cause.__cause__
        fail(AttuneError(str(cause or err)), code=1)


@app.command()
def crds(
    out: Annotated[Path, typer.Option(help="directory of the canonical CRDs")] = Path("crds"),
    chart: Annotated[Path, typer.Option(help="the chart's CRD template (crds.install)")] = Path(
        "charts/attune/templates/crds.yaml"),
) -> None:
    """Regenerate the CRD YAML from the pydantic models (the canonical crds/ and the chart's template)."""
    from attune.operator.crdgen import write_crds

    for path in write_crds(out, chart):
        typer.echo(str(path))
