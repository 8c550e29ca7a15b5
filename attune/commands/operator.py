"""``attune operator``: run the Kubernetes operator, or regenerate the CRDs."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

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
                             "agent.endpoint): name, *.suffix, CIDR or 'loopback'; repeatable; default *.svc, "
                             "*.svc.cluster.local, loopback (or $ATTUNE_ALLOWED_HOSTS)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Run the operator until interrupted (standalone, or one of several replicas with ``--peering``)."""
    import kopf

    from attune.operator.handlers import Options, build_registry

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    opts = Options(interval_s=interval, metrics_port=metrics_port or None, webhook_port=webhook_port or None,
                   webhook_addr=webhook_addr, webhook_cert=webhook_cert, webhook_key=webhook_key,
                   allowed_hosts=tuple(allow_host or ()))
    registry = build_registry(opts)
    if peering:
        import random

        asyncio.run(kopf.operator(registry=registry, standalone=False, peering_name=peering,
                                  priority=priority if priority is not None else random.randint(1, 32767),
                                  clusterwide=not namespace, namespaces=namespace or (), liveness_endpoint=liveness))
    else:
        asyncio.run(kopf.operator(registry=registry, standalone=True, clusterwide=not namespace,
                                  namespaces=namespace or (), liveness_endpoint=liveness))


@app.command()
def crds(
    out: Annotated[Path, typer.Option(help="directory of the canonical CRDs")] = Path("crds"),
    chart: Annotated[Path, typer.Option(help="the chart's CRD directory (a copy)")] = Path("charts/attune/crds"),
) -> None:
    """Regenerate the CRD YAML from the pydantic models."""
    from attune.operator.crdgen import write_crds

    for path in write_crds(out, chart):
        typer.echo(str(path))
