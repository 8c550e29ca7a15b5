"""The ``attune`` command. Each command parses its options and makes one call into :mod:`attune.api`."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from attune import commands
from attune.commands import console, err_console, fail, print_listing
from attune.engine.journal import Event
from attune.errors import AttuneError

app = typer.Typer(name="attune", help="Tune the throughput of LLM training recipes, safely.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _framework_help() -> str:
    try:
        from attune import frameworks

        return " | ".join(frameworks.names())
    except Exception:  # noqa: BLE001 - help text only
        return "torch | megatron | hf"


_FRAMEWORK_HELP = _framework_help()


_fail = fail


class Progress:
    """Progress of a tuning run. On a terminal: a live panel (current trial and its elapsed time, best so far,
    a budget bar, the noise floor) above one line per finished trial; elsewhere (CI logs, pipes): plain lines."""

    def __init__(self, budget_hours: float | None, *, live: bool | None = None) -> None:
        self.budget_hours = budget_hours
        self.live_enabled = console.is_terminal if live is None else live
        self.live: Live | None = None
        self.current = ""
        self.t0 = 0.0
        self.state: Any = None

    # -- the live panel ---------------------------------------------------------------------------------
    def _panel(self) -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column()
        elapsed = time.monotonic() - self.t0 if self.current else 0.0
        grid.add_row("trial", f"{self.current or 'between trials'}" + (f"  [dim]{elapsed:,.0f} s[/]" if self.current
                                                                       else ""))
        st = self.state
        if st is not None:
            best, ratio = st.best_throughput(), st.search_speedup()
            speed = f"  ({ratio:.2f}× the baseline)" if ratio is not None else ""
            grid.add_row("best", f"{best:,.0f} tokens/s per device{speed}" if best else "—")
            budget = st.budget()
            frac = min(1.0, budget.used / budget.limit_hours) if budget.limit_hours else 0.0
            bar = "█" * round(frac * 30) + "░" * (30 - round(frac * 30))
            grid.add_row("budget", f"{bar} {budget.used:.3f} / {budget.limit_hours:g} accelerator-hours")
            if st.baselines():
                grid.add_row("noise floor", f"{st.floor():.1%}")
        return grid

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._panel())

    def __call__(self, kind: Event, payload: dict[str, Any]) -> None:
        if kind is Event.TRIAL_STARTED:
            change = ", ".join(f"{k}={v}" for k, v in payload["change"].items()) or "baseline"
            self.t0 = time.monotonic()
            self.current = f"#{payload['trial']} {payload['kind']}: {change}"
            if self.live_enabled and self.live is None:
                self.live = Live(self._panel(), console=console, refresh_per_second=2, transient=True,
                                 get_renderable=self._panel)
                self.live.start()
            elif not self.live_enabled:
                console.print(f"[dim]… trial {self.current}[/]")
            self._refresh()
        elif kind is Event.TRIAL_FINISHED:
            rec, self.state = payload["record"], payload["state"]
            self.current = ""
            tp = f"{rec.throughput:,.0f} tok/s/dev" if rec.throughput else "—"
            ok = {"succeeded": "green", "refused": "yellow"}.get(rec.outcome.value, "red")
            mark = "[bold green]kept[/]" if rec.accepted else ""
            budget = self.state.budget()
            # the decision is text, not markup: "numerics_opt_in: [random_stream]" must reach the reader as written
            console.print(f"[dim]#{rec.id:<3}[/] {rec.kind:<10} {escape(rec.label()):<28} [{ok}]{rec.outcome.value:<9}[/] "
                          f"{tp:>18}  {escape(rec.decision)} {mark}  [dim]budget {budget.used:.3f}/{budget.limit_hours:g} h[/]")
            console.file.flush()
            self._refresh()
        elif kind is Event.SETUP:
            state = "done" if payload.get("ok") else f"failed ({payload.get('message')})"
            console.print(f"[dim]set-up before the first trial:[/] {payload['what']}: {state} in "
                          f"{payload['wall_s']:.0f} s (outside every trial)")
        elif kind is Event.RUN_FINISHED:
            self.close()
            console.print(f"[bold]stopped:[/] {payload['reason']}")

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


EXIT_NOT_MEASURED = 3  # the run ended without a measured baseline (it failed, or was told to launch nothing)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def tune(
    args: Annotated[Optional[list[str]], typer.Argument(
        help="recipe YAML, or with --framework the launch command after `--`", show_default=False)] = None,
    budget: Annotated[Optional[float], typer.Option("--budget", help="accelerator-hours to spend")] = None,
    framework: Annotated[Optional[str], typer.Option(
        help="tune a launch command (after `--`) of this framework: " + _FRAMEWORK_HELP)] = None,
    backend: Annotated[Optional[str], typer.Option(help="local (default) | sim; a resumed run keeps its own")] = None,
    policy: Annotated[Optional[str], typer.Option(
        help="playbook (default) | llm | hybrid | coordinate | random; a resumed run keeps its own")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="run directory (default runs/NAME-TIME)")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="continue the run in this directory")] = None,
    seed: Annotated[int, typer.Option(help="seed of randomised policies")] = 0,
    max_trials: Annotated[Optional[int], typer.Option(help="stop after this many launched trials", min=0)] = None,
    tokens_per_sample: Annotated[Optional[int], typer.Option(
        help="with --framework: tokens in one sample (sequence length) where the framework's log has no count",
        min=1)] = None,
    devices_per_node: Annotated[Optional[int], typer.Option(
        help="with --framework: accelerators (CPU slots) the job may use per node, charged for each trial "
             "(default: the processes the launch starts)", min=1)] = None,
    knobs_file: Annotated[Optional[Path], typer.Option(
        "--knobs", help="with --framework command: the knob declaration (knobs.yaml) of your script")] = None,
) -> None:
    """Measure a recipe (or your own launch), change one setting at a time, keep what is faster, within BUDGET
    accelerator-hours. `attune tune RECIPE.yaml --budget 0.2` or `attune tune --framework hf --budget 0.2 --
    torchrun --nproc_per_node 1 train.py ...`."""
    from attune import api

    recipe: Any = None
    try:
        if framework is not None:
            recipe = api.import_launch(framework, list(args or []),
                                       options={"tokens_per_sample": tokens_per_sample,
                                                "devices_per_node": devices_per_node, "knobs": knobs_file})
        elif args:
            if len(args) > 1:
                raise AttuneError(f"give one recipe file, or --framework NAME -- COMMAND...; got {' '.join(args)}")
            recipe = Path(args[0])
    except AttuneError as err:
        _fail(err)
    progress = Progress(budget)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        state, paths = api.tune(recipe, budget_hours=budget, backend=backend, policy=policy, out_dir=out,
                                resume=resume, on_event=progress, seed=seed, max_trials=max_trials)
    except AttuneError as err:
        _fail(err)
    except KeyboardInterrupt:
        progress.close()
        err_console.print("[yellow]interrupted[/]: the journal is safe; continue with `attune tune --resume DIR`")
        raise typer.Exit(130) from None
    finally:
        progress.close()
    from attune.report import build_result

    res = build_result(state)
    console.print(summary_table(res))
    for knob, why in res["kept_without_mechanism"].items():
        err_console.print(f"[bold yellow]warning:[/] kept {knob} has no mechanism here: {why}; its gain was noise")
    console.print(f"report: [bold]{paths.get('html', paths['report'])}[/]   result: {paths['result']}   "
                  f"best recipe: {paths['best_recipe']}")
    if state.baseline.launch is not None:
        console.print(f"tuned launch: [bold]attune render {paths['best_recipe']}[/]")
    if not state.baselines():  # nothing was measured: the run failed, whatever else happened
        err_console.print(f"[bold red]error:[/] the baseline could not be measured: {state.finished}")
        raise typer.Exit(EXIT_NOT_MEASURED)


def summary_table(res: dict[str, Any]) -> Table:
    """The table `attune tune` prints at the end of a run, from its ``result.json`` document."""
    table = Table(title=f"attune: {res['recipe']}", show_header=False)
    if res["baseline_throughput"]:  # figures only where a baseline was measured
        table.add_row("baseline", f"{res['baseline_throughput']:,.0f} {res['throughput_unit']}")
        table.add_row("best", f"{res['best_throughput'] or res['baseline_throughput']:,.0f} {res['throughput_unit']}")
        table.add_row("speedup", res["certification"] if res["certified"] else
                      f"{res['speedup'] or 1.0:.2f}× ({res['certification']})")
    else:
        table.add_row("baseline", "not measured")
        table.add_row("speedup", res["certification"])
    own = {tuple(sorted(t["change"].items())): t for t in res["trials"] if t["accepted"] and t.get("gain")}
    table.add_row("kept", ", ".join(f"{k}={v}" for k, v in res["best_changes"].items()) or "nothing")
    for change, t in own.items():  # each kept change's own decision and its interval, beside the certified headline
        why = str(t["decision"] or "").removeprefix("accepted: ").split("; loss curve")[0]
        table.add_row("", f"{', '.join(f'{k}={v}' for k, v in change)}: {why or format(t['gain'], '+.1%')} "
                          "when it was kept")
    table.add_row("budget", f"{res['budget_used_hours']:.4f} / {res['budget_hours']:g} accelerator-hours")
    for s in res["setup"]:
        table.add_row("set-up", f"{s['what']}: {s['wall_s']:.0f} s before the first trial, outside the trials"
                      + ("" if s["ok"] else f" (failed: {s['message']})"))
    faults = res.get("trials_mismeasured") or 0
    table.add_row("trials", f"{res['trials_launched']} launched, {res['trials_failed']} failed, "
                            f"{res['trials_refused']} refused"
                            + (f", {faults} measurement faults (not used; run again)" if faults else ""))
    return table


@app.command("import", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def import_(
    framework: Annotated[str, typer.Option(help=_FRAMEWORK_HELP)],
    command: Annotated[Optional[list[str]], typer.Argument(help="the launch command, after `--`",
                                                           show_default=False)] = None,
    script: Annotated[Optional[Path], typer.Option(
        help="a shell launch script instead of a command: its `exec` line, `export`s and directory")] = None,
    name: Annotated[Optional[str], typer.Option(help="the recipe's name (default: from the script)")] = None,
    tokens_per_sample: Annotated[Optional[int], typer.Option(
        help="tokens in one sample (sequence length) where the framework's log has no token count")] = None,
    devices_per_node: Annotated[Optional[int], typer.Option(
        help="accelerators (CPU slots) the job may use per node, charged for each trial (default: the processes "
             "the launch starts)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="write the recipe here (default: stdout)")] = None,
    knobs_file: Annotated[Optional[Path], typer.Option(
        "--knobs", help="framework command: the knob declaration (knobs.yaml) of your script: what attune may "
                        "change, the contract flags, the global batch, how steps appear in its output")] = None,
) -> None:
    """Turn your own launch command into an attune recipe (YAML on stdout):
    `attune import --framework hf -- python train.py --per_device_train_batch_size 1 ...`, or your launch script:
    `attune import --framework megatron --script pretrain.sh`."""
    import yaml

    from attune import api
    from attune.recipe.io import recipe_to_dict

    opts = {"tokens_per_sample": tokens_per_sample, "devices_per_node": devices_per_node, "knobs": knobs_file}
    try:
        if script is not None and command:
            raise AttuneError("give either --script or a command after `--`, not both")
        recipe = api.import_script(framework, script, name=name, options=opts) if script is not None else \
            api.import_launch(framework, list(command or []), name=name, options=opts)
    except AttuneError as err:
        _fail(err)
    text = yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text)
    except OSError as err:
        _fail(AttuneError(f"cannot write {out}: {err.strerror}"))
    err_console.print(f"wrote {out}: tune it with `attune tune {out} --budget 0.2`")


@app.command()
def render(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML (e.g. a run's best-recipe.yaml)")],
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", "-s", metavar="KNOB=VALUE", help="render with this knob changed (gate-checked); repeatable")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="argument list, environment and files as JSON")] = False,
    k8s: Annotated[bool, typer.Option("--k8s", help="the Kubernetes trial container patch instead")] = False,
) -> None:
    """Print the exact launch a recipe renders to: the command line to paste (and any files it needs)."""
    import shlex

    from attune import api
    from attune.recipe.io import load_recipe

    try:
        target, launch = api.render(load_recipe(recipe), set_)
        if k8s:
            container: dict[str, Any] = {"name": "trainer", "image": "IMAGE",
                                         "command": list(launch.argv[:1]), "args": list(launch.argv[1:])}
            job: dict[str, Any] = {"spec": {}}
            target.framework_impl.patch_job(target, job, container, steps=8, metrics_port=9464, linger_s=30)
            console.print_json(json.dumps({"job_spec": job["spec"], "container": container}))
            return
    except AttuneError as err:
        _fail(err)
    if as_json:
        console.print_json(json.dumps(launch.to_dict()))
        return
    for path, text in launch.files.items():
        err_console.print(f"[dim]# file {path}:[/]")
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if launch.cwd:
        err_console.print(f"[dim]# in {launch.cwd}[/]")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()))
    sys.stdout.write((env + " " if env else "") + shlex.join(launch.argv) + "\n")


@app.command()
def validate(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML")],
    backend: Annotated[Optional[str], typer.Option(
        help="also check it can run on this backend here (default: the framework's first)")] = None,
) -> None:
    """Check a recipe and print every problem with its field path, including what would fail before a trial ran."""
    from attune import api
    from attune.recipe.io import load_recipe

    try:
        r = load_recipe(recipe)
        problems = api.preflight(r, backend or r.framework_impl.backends[0])
        if problems:
            from attune.errors import RecipeError

            raise RecipeError(f"{recipe} is valid but cannot run on the {backend or r.framework_impl.backends[0]} "
                              "backend here:", problems)
    except AttuneError as err:
        _fail(err, 1)
    console.print(f"[green]ok[/]: {r.name} ({r.framework}, {r.resources.devices} × {r.resources.accelerator})")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def knobs(
    command: Annotated[Optional[list[str]], typer.Argument(
        help="with --suggest: your launch command, after `--`", show_default=False)] = None,
    framework: Annotated[str, typer.Option(help=_FRAMEWORK_HELP)] = "torch",
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    discover: Annotated[bool, typer.Option(
        "--discover", help="every setting the installed framework version defines, with its type, default and "
                           "classification (curated knob, derived, contract, or unclassified: frozen unless "
                           "tuning.explore names it)")] = False,
    suggest: Annotated[bool, typer.Option(
        "--suggest", help="framework command: propose a knob declaration for the command after `--` (from its "
                          "flags, config files and source, read without running it), every guess marked")] = False,
    knobs_file: Annotated[Optional[Path], typer.Option(
        "--knobs", help="framework command: list the knobs this declaration (knobs.yaml) gives")] = None,
) -> None:
    """List the knob catalogue of a framework (with --discover: every setting its installed version defines;
    framework command: the roles a declaration may give, the knobs of --knobs FILE, or --suggest -- COMMAND)."""
    from attune import frameworks as registry
    from attune.recipe.catalogue import get_catalogue

    if framework not in registry.names():
        _fail(AttuneError(registry.unknown_message(framework)))
    fw = registry.get(framework)
    if (suggest or knobs_file is not None) and framework != "command":
        _fail(AttuneError(f"--suggest and --knobs are for --framework command (a script attune has never heard of); "
                          f"the {framework} catalogue is fixed: `attune knobs --framework {framework}`"))
    if command and not suggest:
        _fail(AttuneError(f"unexpected arguments {' '.join(command)}: a command after `--` is read with --suggest"))
    if suggest:
        from attune.frameworks.command.suggest import suggest as suggest_declaration

        if not command:
            _fail(AttuneError("give the command after `--`: attune knobs --framework command --suggest -- python "
                              "train.py --batch_size=4 ..."))
        try:
            sys.stdout.write(suggest_declaration(list(command or []), Path.cwd()))
        except AttuneError as err:
            _fail(err)
        return
    if knobs_file is not None:
        from attune.frameworks.command import declaration as declared

        try:
            _, data = declared.load(knobs_file)
        except AttuneError as err:
            _fail(err)
        launch: Any = {"declaration": data}
    else:
        launch = None
    if discover:
        from attune.frameworks.discover import discover as discover_settings

        try:
            found = discover_settings(fw)
        except (NotImplementedError, AttuneError) as err:
            _fail(err if isinstance(err, AttuneError) else AttuneError(str(err)))
        if as_json:
            console.print_json(json.dumps(found.to_dict()))
        else:
            console.print(found.table())
        return
    cat = get_catalogue(framework, launch)
    if as_json:
        console.print_json(json.dumps(cat.describe()))
        return
    if launch is None and fw.declared_knobs:
        # its recipes declare their own knobs: what it lists without a declaration are the roles a knob may have
        print_listing(f"{framework}: {fw.title}. A declaration gives each knob one of these roles (its playbook "
                      f"rules); `attune knobs --framework {framework} --knobs knobs.yaml` lists a declaration's "
                      f"knobs, `--suggest -- COMMAND` proposes one", ("role", "what it is"),
                      [(k.name, k.description.split(". ", 1)[1].rsplit(" Declare", 1)[0]) for k in cat.knobs.values()])
        return
    title = f"{framework} knobs ({fw.title}; versions {cat.versions or fw.versions or 'any'})"
    rows = [(k.name, ", ".join(map(str, k.values)), str(k.default), k.semantics.value, k.description)
            for k in cat.knobs.values()]
    print_listing(title, ("knob", "values", "default", "semantics", "description"), rows)


_MOUNTED = False


def _mount_optional() -> None:
    """Sub-commands of subsystems (gate, lessons, sim, bench, operator) that may be absent from a build."""
    global _MOUNTED
    if _MOUNTED:
        return
    _MOUNTED = True

    commands.mount(app)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _mount_optional()
    try:
        app(args=argv if argv is not None else sys.argv[1:], prog_name="attune")
    except AttuneError as err:  # pragma: no cover - commands catch their own
        err_console.print(f"[bold red]error:[/] {err}")
        sys.exit(2)
    except OSError as err:  # a full disk, a read-only run directory, a vanished file: a message, never a traceback
        err_console.print(f"[bold red]error:[/] {os_error_message(err)}")
        sys.exit(EXIT_OS_ERROR)


EXIT_OS_ERROR = 4  # the machine refused a read or write (full disk, read-only file system, permissions)


def os_error_message(err: OSError) -> str:
    """What the machine refused, where, and what to do; the journal is append-only, so a run can resume."""
    import errno

    where = f" {err.filename}" if err.filename else ""
    what = err.strerror or str(err)
    advice = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space (disk quota)",
              errno.EROFS: "the file system is read-only: give a writable directory (--out) or copy the run first",
              errno.EACCES: "no permission: give a directory you can write to (--out)",
              errno.EPERM: "no permission: give a directory you can write to (--out)"}.get(err.errno or 0,
                                                                                       "check the path")
    return (f"cannot read or write{where}: {what}; {advice}. Nothing written before is lost: a tuning run's journal "
            "is append-only, continue it with `attune tune --resume DIR`")
