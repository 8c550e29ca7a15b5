"""``kubectl attune``: the kubectl plugin (the ``kubectl-attune`` command kubectl finds on PATH).

- ``kubectl attune list [-n NS | -A]``: the TuningRuns with their progress (trials, budget, best speedup) and why
  they stand where they stand (the Stalled or Ready condition's reason and message);
- ``kubectl attune trials RUN``: a run's trials (kind, change, outcome, throughput, charge, decision);
- ``kubectl attune report RUN [--dir DIR] [--open]``: the run's report (report.html, result.json, best-recipe.yaml,
  report.md), built from its trials' records the way ``attune tune`` builds a local run's;
- ``kubectl attune export RUN [--dir DIR]``: the tuned manifest, its JSON patch and diff, the tuned recipe and the
  launch command, from the run's ``<run>-tuned`` ConfigMap, as files a team commits (a pull request instead of
  ``kubectl get cm -o jsonpath``).

It reads the cluster as kubectl does: ``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``, ``--context``, and
the namespace of the context unless ``-n`` is given. It only reads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

app = typer.Typer(name="kubectl-attune", help="attune's TuningRuns from kubectl: list, trials, report, export.",
                  no_args_is_help=True, add_completion=False)

GROUP, VERSION = "attune.dev", "v1alpha1"

Namespace = Annotated[Optional[str], typer.Option("--namespace", "-n", help="the runs' namespace (default: the "
                                                                             "context's)")]
Kubeconfig = Annotated[Optional[Path], typer.Option("--kubeconfig", help="the kubeconfig (default: $KUBECONFIG, "
                                                                          "~/.kube/config)")]
Context = Annotated[Optional[str], typer.Option("--context", help="the kubeconfig context")]


class _Cluster:
    """The kubernetes client of the user's kubeconfig, and the namespace kubectl would use."""

    def __init__(self, kubeconfig: Path | None, context: str | None, namespace: str | None) -> None:
        from kubernetes import client, config

        try:
            contexts, active = config.list_kube_config_contexts(config_file=str(kubeconfig) if kubeconfig else None)
            chosen = next((c for c in contexts if c["name"] == context), None) if context else active
            if context and chosen is None:
                raise typer.BadParameter(f"--context {context}: no such context in the kubeconfig")
            cfg = client.Configuration()
            config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, context=context,
                                    client_configuration=cfg)
        except config.ConfigException as err:
            raise typer.BadParameter(f"cannot read the kubeconfig: {err}") from None
        self.api = client.ApiClient(cfg)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.namespace = namespace or ((chosen or {}).get("context") or {}).get("namespace") or "default"

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as err:
            try:
                message = json.loads(err.body)["message"]
            except (TypeError, ValueError, KeyError):
                message = err.reason
            typer.echo(f"error: {message} ({err.status})", err=True)
            raise typer.Exit(1) from None
        except OSError as err:  # the API server unreachable
            typer.echo(f"error: cannot reach the API server: {err}", err=True)
            raise typer.Exit(1) from None

    def run(self, name: str) -> dict[str, Any]:
        return self.call(self.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, "tuningruns", name)

    def trials(self, run: str) -> list[dict[str, Any]]:
        from attune.operator.resources import LABEL_RUN, label_value

        items = self.call(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, "tuningtrials",
                          label_selector=f"{LABEL_RUN}={label_value(run)}")["items"]
        return [t for t in items if (t.get("spec") or {}).get("runRef") == run]


def _table(rows: list[list[str]]) -> str:
    """Columns as kubectl prints them: upper-case headers, left-aligned, three spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _why(status: dict[str, Any]) -> str:
    """Why the run stands where it stands: a True Stalled condition, else Reconciling's, else Ready's."""
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    for ctype, want in (("Stalled", "True"), ("Reconciling", "True"), ("Ready", "True"), ("Ready", "False")):
        c = conds.get(ctype) or {}
        if c.get("status") == want:
            text = f"{c.get('reason', '')}: {c.get('message', '')}".strip(": ")
            return text if len(text) <= 100 else text[:97] + "..."
    return str(status.get("message") or "")


@app.command("list")
def list_runs(namespace: Namespace = None, all_namespaces: Annotated[bool, typer.Option(
        "--all-namespaces", "-A", help="runs of every namespace")] = False,
              kubeconfig: Kubeconfig = None, context: Context = None) -> None:
    """The TuningRuns, their progress, and why they stand where they stand."""
    k = _Cluster(kubeconfig, context, namespace)
    if all_namespaces:
        runs = k.call(k.custom.list_cluster_custom_object, GROUP, VERSION, "tuningruns")["items"]
    else:
        runs = k.call(k.custom.list_namespaced_custom_object, GROUP, VERSION, k.namespace, "tuningruns")["items"]
    if not runs:
        typer.echo("No TuningRuns found" + ("." if all_namespaces else f" in namespace {k.namespace}."), err=True)
        return
    rows = [["NAMESPACE"] * all_namespaces + ["NAME", "PHASE", "TRIALS", "BUDGET (H)", "BEST", "WHY"]]
    for r in sorted(runs, key=lambda r: (r["metadata"]["namespace"], r["metadata"]["name"])):
        st = r.get("status") or {}
        budget = st.get("budget") or {}
        speedup = (st.get("best") or {}).get("speedup")
        rows.append([r["metadata"]["namespace"]] * all_namespaces + [
            r["metadata"]["name"], str(st.get("phase") or "Pending"), str((st.get("trials") or {}).get("total", 0)),
            f"{budget.get('hoursUsed', 0):.3g}/{budget.get('hoursLimit', (r.get('spec') or {}).get('budget', {}).get('acceleratorHours', '?'))}",
            f"{speedup:.2f}x" if isinstance(speedup, int | float) else "-", _why(st)])
    typer.echo(_table(rows))


@app.command()
def trials(run: Annotated[str, typer.Argument(help="the TuningRun")], namespace: Namespace = None,
           kubeconfig: Kubeconfig = None, context: Context = None) -> None:
    """A run's trials, in order: what each changed, how it went, what it cost and what was decided."""
    from attune.operator.reconcile import fold_records

    k = _Cluster(kubeconfig, context, namespace)
    status = k.run(run).get("status") or {}
    records = fold_records(k.trials(run), status)
    if not records:
        typer.echo(f"No trials of {run} yet.", err=True)
        return
    rows = [["ID", "KIND", "CHANGE", "OUTCOME", "TOKENS/S/DEV", "HOURS", "DECISION"]]
    for rec in records:
        m = rec.measurement
        change = ", ".join(f"{key}={value}" for key, value in rec.change.items()) or "(baseline)"
        decision = rec.decision if len(rec.decision) <= 80 else rec.decision[:77] + "..."
        rows.append([str(rec.id), str(rec.kind), change, rec.outcome.value,
                     f"{m.tokens_per_s_per_device:,.0f}" if m is not None and m.tokens_per_s_per_device else "-",
                     f"{rec.charged_hours:.4f}", decision])
    typer.echo(_table(rows))


@app.command()
def report(run: Annotated[str, typer.Argument(help="the TuningRun")], namespace: Namespace = None,
           out: Annotated[Optional[Path], typer.Option("--dir", help="where to write it (default: ./<run>-report)")]
           = None,
           open_: Annotated[bool, typer.Option("--open", help="open report.html in a browser")] = False,
           kubeconfig: Kubeconfig = None, context: Context = None) -> None:
    """The run's report (report.html and result.json), from its trials' records."""
    from attune.errors import RecipeError
    from attune.operator.reconcile import fold_records, load_state
    from attune.operator.resources import TuningRunSpec
    from attune.recipe.io import parse_recipe
    from attune.report.result import write_outputs

    k = _Cluster(kubeconfig, context, namespace)
    obj = k.run(run)
    status = obj.get("status") or {}
    if not status.get("baselineRecipe"):
        typer.echo(f"error: {run} has not started (no baseline recipe yet): nothing to report", err=True)
        raise typer.Exit(1)
    try:
        spec = TuningRunSpec.model_validate(status.get("acceptedSpec") or obj.get("spec") or {})
        recipe = parse_recipe(status["baselineRecipe"], f"status.baselineRecipe of {run}")
    except (RecipeError, ValueError) as err:
        typer.echo(f"error: cannot read {run}: {err}", err=True)
        raise typer.Exit(1) from None
    state = load_state(spec, recipe, fold_records(k.trials(run), status), status)
    paths = write_outputs(state, out or Path(f"{run}-report"))
    for key in ("html", "result", "best_recipe", "report"):
        if key in paths:
            typer.echo(f"wrote {paths[key]}")
    if open_ and "html" in paths:
        import webbrowser

        webbrowser.open(paths["html"].resolve().as_uri())


@app.command()
def export(run: Annotated[str, typer.Argument(help="the TuningRun")], namespace: Namespace = None,
           out: Annotated[Optional[Path], typer.Option("--dir", help="where to write the files (default: "
                                                                     "./<run>-tuned)")] = None,
           force: Annotated[bool, typer.Option("--force", help="overwrite files already there")] = False,
           kubeconfig: Kubeconfig = None, context: Context = None) -> None:
    """The tuned manifest, its patch and diff, the tuned recipe and the launch, as files to commit."""
    from attune.operator.results import tuned_configmap_name

    k = _Cluster(kubeconfig, context, namespace)
    k.run(run)  # a clear "not found" for a wrong run name
    cm = k.call(k.core.read_namespaced_config_map, tuned_configmap_name(run), k.namespace)
    data: dict[str, str] = dict(cm.data or {})
    problem = (cm.metadata.annotations or {}).get("attune.dev/manifest-error")
    if not data:
        typer.echo(f"error: ConfigMap {tuned_configmap_name(run)} holds nothing yet", err=True)
        raise typer.Exit(1)
    folder = out or Path(f"{run}-tuned")
    clashes = [name for name in data if (folder / name).exists()]
    if clashes and not force:
        typer.echo(f"error: {', '.join(str(folder / n) for n in sorted(clashes))} already exist(s): pass --force to "
                   "overwrite, or --dir for another folder", err=True)
        raise typer.Exit(1)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(data.items()):
        if "/" in name or name.startswith("."):  # a ConfigMap key is a file name; never a path
            continue
        (folder / name).write_text(text)
        typer.echo(f"wrote {folder / name}")
    if problem:
        typer.echo(f"note: no tuned manifest: {problem}", err=True)
    manifests = sorted(n for n in data if n.endswith(".yaml") and n not in ("recipe.yaml", "summary.yaml"))
    if manifests:
        typer.echo(f"next: review {folder / 'tuned.diff'}, then commit {folder / manifests[0]} on a branch and open "
                   "a pull request (kubectl apply -f it once merged, or let your GitOps tool)")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
