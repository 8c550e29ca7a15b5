"""Any training command (``framework: command``): a script attune has never heard of, tuned through the knob
declaration its owner writes (:mod:`attune.frameworks.command.declaration`).

The recipe carries the user's launch verbatim (``python train.py --batch_size=1 ...``, ``torchrun ... train.py``, or
any executable) and the declaration (``launch.declaration``). The catalogue is the declaration's: each declared knob
with its domain, semantics and role, the global-batch product as a constraint, and the playbook's rules by role.
:meth:`CommandFramework.render` edits only the declared flags and variables (and the derived accumulation flag), so
an unchanged recipe renders the user's command exactly. The gate refuses a change to a contract flag, to any flag
the declaration does not name (frozen with its value as written), to the declaration itself, and to the global
batch.

Flags are read as argparse and nanoGPT's configurator write them: ``--name value`` and ``--name=value``; a bare
``switch`` is true when present. A flag is matched by its exact spelling (``--batch_size`` is not
``--batch-size``), because attune cannot know the script's parser: declare the spelling the command uses.

nanoGPT's config files are read as its configurator reads them, without running anything: a Python file named on
the command line (``python train.py config/x.py --batch_size=4``) assigns settings in order, and a ``--name=value``
after it overrides it (one before it is overridden by it). So a knob, the accumulation or a contract setting the
file sets has the file's value (:func:`attune.frameworks.command.source.config_assignments`: literal assignments
only; a computed value of a declared setting is an error naming the file and the line).

A trial runs the rendered command with unbuffered output (plus any ``trial_flags`` the declaration names: logging
every step, output in the trial directory) and is ended by attune after the steps its measurement needs; step
records come from the lines matching the declared step pattern (:mod:`attune.frameworks.command.logs`).
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attune import frameworks
from attune.errors import RecipeError
from attune.frameworks.base import (
    ContractField,
    Framework,
    Launch,
    LogParser,
    Rules,
    TrialLaunch,
)
from attune.frameworks.cmdline import (
    ACCELERATE_SWITCHES,
    TORCHRUN_SWITCHES,
    Edit,
    LaunchHead,
    Option,
    last_option,
    process_count,
    scan_flags,
    set_container_argv,
    skip_tokens,
    split_launch,
)
from attune.frameworks.command import declaration as decl
from attune.frameworks.command.declaration import DECLARATION_HINT, Declaration, Hazard, KnobSpec, Role
from attune.frameworks.command.logs import StepLineParser, step_pattern
from attune.frameworks.command.source import SEQUENCE_NAMES, Assigned, config_assignments, read_script
from attune.frameworks.common import (
    compile_rules,
    loader_worker_rules,
    micro_batch_layouts,
    micro_batch_rules,
    process_rules,
    processes_fit_problem,
    recompute_rules,
    recordable_env,
    thread_rules,
)
from attune.recipe.catalogue import Catalogue, Constraint, Knob, KnobValue, Semantics

if TYPE_CHECKING:
    from attune.recipe.model import Recipe
    from attune.trial import TrialRequest

NAME = "command"
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
#: variables of the launch's environment that shape how it runs (threads, collectives, allocator): recorded at
#: import, so every trial and the tuned command run with them
_ENV_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "NCCL_", "TORCH_", "PYTORCH_", "CUDA_")
_ENV_NAMES = ("CUBLAS_WORKSPACE_CONFIG",)


def role_rules(knob: str, role: Role) -> Rules:
    """The playbook's priors for a knob of ``role`` (the same priors the named frameworks give such knobs)."""
    table = {Role.BATCH_PER_PROCESS: micro_batch_rules, Role.PROCESSES: process_rules,
             Role.LOADER_WORKERS: loader_worker_rules, Role.COMPILE: compile_rules, Role.CHECKPOINTING: recompute_rules,
             Role.THREADS: thread_rules}
    return table[role](knob) if role in table else {}


#: what each role means, for ``attune knobs --framework command`` (the roles a declaration may give its knobs)
ROLE_TEXT = {
    Role.BATCH_PER_PROCESS: "samples per forward/backward on each process; the declared accumulation flag is "
                            "derived so the global batch (batch.global) stays. Bigger: fewer, larger kernels.",
    Role.PROCESSES: "data-parallel processes on the node (launcher: processes): torchrun --nproc_per_node; a python "
                    "launch becomes python -m torch.distributed.run --standalone --nproc_per_node N.",
    Role.LOADER_WORKERS: "background data-loading processes (a DataLoader's num_workers): hides data loading.",
    Role.COMPILE: "a graph compiler on or off (torch.compile): fused kernels; the first step pays compilation.",
    Role.CHECKPOINTING: "activation recomputation on or off: saves memory, costs compute.",
    Role.THREADS: "CPU threads per process (OMP_NUM_THREADS).",
    Role.OTHER: "any other setting: no playbook rule; tried when the rules run dry.",
}


def _role_catalogue() -> Catalogue:
    """The catalogue ``attune knobs --framework command`` lists: one entry per role a declaration may use."""
    knobs = {}
    for role, text in ROLE_TEXT.items():
        values: tuple[KnobValue, ...] = (False, True) if role in (Role.COMPILE, Role.CHECKPOINTING) else (1, 2)
        knobs[role.value] = Knob(name=role.value, type="bool" if isinstance(values[0], bool) else "int",
                                 values=values, default=values[0], semantics=Semantics.NUMERICS_DRIFT,
                                 description=f"role: {role.value}. {text} Declare a knob with `role: {role.value}`.")
    return Catalogue(framework=NAME, knobs=knobs, versions="")


# ---------------------------------------------------------------------------------------------- the launch

@dataclass(frozen=True)
class Parsed:
    """A command line split into its launcher (where attune knows it), flags and positional words."""

    argv: tuple[str, ...]
    head: LaunchHead | None  # None: an executable of its own (./train.sh), no launcher attune can edit
    options: tuple[Option, ...]
    positionals: tuple[tuple[int, str], ...]

    def option(self, flag: str) -> Option | None:
        """The last occurrence of ``flag`` (exact spelling; what argparse keeps when a flag repeats)."""
        found = [o for o in self.options if o.spelling == flag]
        return found[-1] if found else None

    @property
    def args_start(self) -> int:
        return self.head.args_start if self.head is not None else 1

    @property
    def inline_style(self) -> bool:
        """Whether the command writes its flags ``--name=value`` (nanoGPT's configurator reads only that)."""
        inline = sum(o.inline for o in self.options)
        return inline > len(self.options) - inline

    def processes(self) -> int:
        if self.head is None or self.head.launcher == "python":
            return 1
        names = ("nproc_per_node",) if self.head.launcher == "torchrun" else ("num_processes",)
        return process_count(last_option(self.head.options, *names)) or 1

    def config_files(self) -> list[tuple[int, str]]:
        """The positional words that name Python config files (nanoGPT's ``config/x.py``), with their index."""
        return [(i, w) for i, w in self.positionals if w.endswith(".py")]

    def launcher_tokens(self) -> list[str]:
        """The launcher without its process count (frozen: a trial changes only the count)."""
        if self.head is None:
            return list(self.argv[:1])
        counts = [o for o in self.head.options if o.name in ("nproc_per_node", "num_processes")]
        return skip_tokens(self.argv, counts, self.head.script_index + 1)


def parse_argv(argv: Sequence[str]) -> Parsed:
    """Split ``argv``: a python / torchrun / accelerate launch by the launchers' own option tables; anything else
    as one executable followed by its arguments."""
    argv = tuple(str(a) for a in argv)
    if not argv:
        raise RecipeError("the launch command is empty: give it after `--`, e.g. -- python train.py --batch_size=4")
    try:
        head: LaunchHead | None = split_launch(argv, {"torchrun": TORCHRUN_SWITCHES,
                                                      "accelerate": ACCELERATE_SWITCHES}, unknown="")
    except RecipeError as err:
        if not str(err).startswith("unknown launcher"):
            raise
        head = None
    start = head.args_start if head is not None else 1
    options, positionals = scan_flags(argv, start)
    return Parsed(argv, head, tuple(options), tuple(positionals))


def _value(spec: KnobSpec, name: str, token: str | None, present: bool) -> KnobValue:
    """A knob's value from its token(s) on the command line (or the declared default where absent)."""
    if spec.switch:
        return present
    if not present:
        return spec.default
    if token is None:
        raise RecipeError(f"knobs.{name}: {spec.flag} has no value on the command line; write {spec.flag} VALUE "
                          "or declare it as switch: true")
    if spec.type == "bool":
        low = token.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise RecipeError(f"knobs.{name}: {spec.flag} {token} is not true or false")
    if spec.type == "int":
        try:
            return int(token)
        except ValueError:
            raise RecipeError(f"knobs.{name}: {spec.flag} {token} is not a whole number") from None
    for v in spec.values:
        if str(v) == token or (v is None and token.lower() in ("none", "null")):
            return v
    return token


def _token(value: KnobValue, old: str | None) -> str:
    """A knob value as a command-line word, in the spelling the command already uses for it."""
    if isinstance(value, bool):
        if old is not None and old.lower() in _TRUE + _FALSE:
            words = {"true": ("true", "false"), "1": ("1", "0"), "yes": ("yes", "no"), "on": ("on", "off")}
            pair = next((p for p in words.values() if old.lower() in p), ("true", "false"))
            word = pair[0] if value else pair[1]
            return word.capitalize() if old[:1].isupper() else word
        return "True" if value else "False"
    return "None" if value is None else str(value)


@dataclass(frozen=True)
class Source:
    """Where the launch sets a flag: on the command line (``token``: its value word), in a config file (``value``:
    the literal it assigns), or nowhere (the script's own default applies)."""

    kind: str  # option | config | absent
    token: str | None = None
    value: Any = None
    where: str = ""  # "--max_iters=2000", "config/x.py line 3"

    @property
    def python_value(self) -> Any:
        """The value as the script sees it (the command line's word as written)."""
        return self.value if self.kind == "config" else self.token


def flag_source(parsed: Parsed, configured: Mapping[str, Assigned], flag: str) -> Source:
    """Where ``flag`` is set: the last of its command-line occurrence and the config files that assign it wins,
    as nanoGPT's configurator applies its arguments in order."""
    opt = parsed.option(flag)
    conf = configured.get(flag.lstrip("-"))
    if conf is not None and (opt is None or conf.position > opt.start):
        return Source("config", value=conf.value, where=conf.where)
    if opt is not None:
        return Source("option", token=opt.values[0] if opt.values else None,
                      where=" ".join(parsed.argv[opt.start:opt.end]))
    return Source("absent")


@dataclass(frozen=True)
class Settings:
    """What attune reads from a ``command`` recipe: its declaration, its parsed command and the values of each knob,
    the accumulation and the global batch as the launch has them, and what its config files assign."""

    declaration: Declaration
    parsed: Parsed
    values: dict[str, KnobValue]  # every declared knob, as the launch has it
    accumulation: int | None
    global_batch: int | None
    configured: dict[str, Assigned]  # what the config files on the command line assign (the last file's wins)

    def source(self, flag: str) -> Source:
        return flag_source(self.parsed, self.configured, flag)

    def config_position(self, flag: str) -> int:
        """The index of the last config file that assigns ``flag``'s setting (-1: none): a flag must follow it to
        take effect."""
        conf = self.configured.get(flag.lstrip("-"))
        return conf.position if conf is not None else -1

    def product(self, knobs: Mapping[str, Any]) -> int:
        """The global-batch product's factors other than the accumulation, at ``knobs``."""
        assert self.declaration.batch is not None
        acc = _flag_name(self.declaration.batch.accumulation.flag)
        out = 1
        for term in self.declaration.batch.factors:
            if isinstance(term, int):
                out *= term
            elif term != acc:
                out *= int(knobs[term])
        return out


def _flag_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _text(value: Any) -> str:
    """A config file's literal as the command line would write it (``True``, ``4``, ``bfloat16``)."""
    return value if isinstance(value, str) else repr(value)


def _configured(declaration: Declaration, parsed: Parsed, files: Mapping[str, str], cwd: Path | None,
                problems: list[str]) -> dict[str, Assigned]:
    """What the command's config files assign, read in command-line order (the carried copy in ``files`` first,
    else the file in ``cwd``)."""
    watched = {k.flag.lstrip("-") for k in declaration.knobs.values() if k.flag}
    if declaration.batch is not None:
        watched.add(declaration.batch.accumulation.flag.lstrip("-"))
    out: dict[str, Assigned] = {}
    for position, word in parsed.config_files():
        text = files.get(word)
        if text is None and cwd is not None:
            try:
                text = (Path(word) if Path(word).is_absolute() else cwd / word).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
        if text is None:
            problems.append(f"launch.files: the config file {word} the command names is neither carried in the "
                            f"recipe nor readable{f' in {cwd}' if cwd else ''}; import the command where it is")
            continue
        try:
            out.update(config_assignments(word, text, position, watched))
        except RecipeError as err:
            problems.extend(err.problems or [str(err)])
    return out


def tokens_problem(declaration: Declaration, parsed: Parsed, configured: Mapping[str, Assigned],
                   cwd: Path | None) -> str | None:
    """Why a trial of this declaration could not be measured (no token count per step), with the fix: the
    sequence length read from the command line, a config file or the script's own default where one shows."""
    if declaration.counts_tokens:
        return None
    field_ = "tokens_per_sample" if declaration.batch is not None else "tokens_per_step"
    found = None
    for name in SEQUENCE_NAMES:
        src = flag_source(parsed, configured, f"--{name}")
        value = src.python_value
        if src.kind != "absent" and str(value).isdigit():
            found = (int(str(value)), f"{src.where}" + (" on the command line" if src.kind == "option" else ""))
            break
    if found is None and cwd is not None:
        script = parsed.head.script if parsed.head is not None and not parsed.head.module else None
        if script is not None:
            source = read_script(Path(script) if Path(script).is_absolute() else cwd / script)
            setting = next((source.settings[n] for n in SEQUENCE_NAMES if n in source.settings
                            and isinstance(source.settings[n].default, int) and source.settings[n].known), None)
            if setting is not None:
                found = (int(setting.default), f"{setting.name} = {setting.default}, {setting.where(source.name)}")
    if field_ == "tokens_per_sample":
        fix = (f"add `tokens_per_sample: {found[0]}` (read from {found[1]})" if found else
               "add `tokens_per_sample: N` (the tokens in one sample: the script's sequence length)")
    else:
        fix = "add `tokens_per_step: N` (the tokens one optimizer step trains on)"
    return (f"{field_}: the knob declaration gives no token count, so no trial could be measured (throughput is "
            f"tokens per second); {fix} to knobs.yaml, or give tokens_per_step, or a tokens group in steps.pattern")


def read_launch(declaration: Declaration, argv: Sequence[str], env: Mapping[str, str], *,
                files: Mapping[str, str] | None = None, cwd: Path | str | None = None) -> Settings:
    """Every declared knob's value in ``argv`` / ``env`` and the config files ``argv`` names (``files``: their
    carried text; else read in ``cwd``); :class:`RecipeError` names a knob it cannot read, and a declaration that
    could not measure a trial."""
    parsed = parse_argv(argv)
    where_from = Path(cwd) if cwd else None
    values: dict[str, KnobValue] = {}
    problems: list[str] = []
    configured = _configured(declaration, parsed, files or {}, where_from, problems)
    for name, spec in declaration.knobs.items():
        try:
            if spec.launcher is not None:
                if parsed.head is None:
                    raise RecipeError(f"knobs.{name}: `{parsed.argv[0]}` is no launcher attune can set a process "
                                      "count on; start the script with python or torchrun, or drop this knob")
                values[name] = parsed.processes()
            elif spec.env is not None:
                values[name] = env.get(spec.env, spec.default)
            else:
                assert spec.flag is not None
                src = flag_source(parsed, configured, spec.flag)
                if src.kind == "absent" and spec.default is None and not spec.switch:
                    raise RecipeError(f"knobs.{name}: {spec.flag} is not on the command line and the declaration "
                                      "gives no default; add `default:` (the script's own value) to the knob, or "
                                      "write the flag in the command")
                if src.kind == "config":
                    values[name] = bool(src.value) if spec.switch else _value(spec, name, _text(src.value), True)
                else:
                    values[name] = _value(spec, name, src.token, src.kind == "option")
            problem = Knob(name=name, type=spec.type, values=spec.values, default=spec.values[0],
                           semantics=spec.semantics, description="...").check_value(values[name])
            if problem:
                where = spec.flag or spec.env or "the launcher's process count"
                raise RecipeError(f"knobs.{name}: the launch has {where} = {values[name]!r}, outside the declared "
                                  f"values: {problem}; widen values in the declaration or change the command")
        except RecipeError as err:
            problems.append(str(err))
    accumulation = total = None
    if declaration.batch is not None and not problems:
        spec_acc = declaration.batch.accumulation
        src = flag_source(parsed, configured, spec_acc.flag)
        raw = src.python_value
        if src.kind == "absent" and spec_acc.default is None:
            problems.append(f"batch.accumulation: {spec_acc.flag} is not on the command line and the declaration "
                            "gives no default; add `default:` (the script's own value) or write the flag")
        elif src.kind == "absent":
            accumulation = spec_acc.default
        elif (isinstance(raw, int) and not isinstance(raw, bool)) or str(raw).isdigit():
            accumulation = int(str(raw))
        else:
            problems.append(f"batch.accumulation: {spec_acc.flag} {raw} ({src.where}) is not a whole number")
    problem = tokens_problem(declaration, parsed, configured, where_from)
    if problem:
        problems.append(problem)
    if problems:
        raise RecipeError("the command and its knob declaration have problems:", problems)
    s = Settings(declaration, parsed, values, accumulation, None, configured)
    if accumulation is not None:
        total = s.product(values) * accumulation
    return Settings(declaration, parsed, values, accumulation, total, configured)


@functools.lru_cache(maxsize=64)
def _declaration_of(text: str) -> Declaration:
    return decl.parse(json.loads(text))


def declaration_of(launch: Any) -> Declaration | None:
    """The declaration a launch (a :class:`NativeLaunch` or its mapping) carries; None when it has none.
    :class:`RecipeError` when it is malformed."""
    data = launch.get("declaration") if isinstance(launch, Mapping) else getattr(launch, "declaration", None)
    if data is None:
        return None
    return _declaration_of(json.dumps(data, sort_keys=True, default=str))


def settings(recipe: Recipe) -> Settings:
    if recipe.launch is None:
        raise RecipeError("launch: required for framework command")
    declaration = declaration_of(recipe.launch)
    if declaration is None:
        raise RecipeError(f"launch.declaration: a command recipe needs its knob declaration; {DECLARATION_HINT}")
    return read_launch(declaration, recipe.launch.argv, recipe.launch.env, files=recipe.launch.files,
                       cwd=recipe.launch.cwd)


# ---------------------------------------------------------------------------------------------- the catalogue

def _compiling_values(values: tuple[KnobValue, ...]) -> tuple[KnobValue, ...]:
    """The values of a ``role: compile`` knob that turn the compiler on: all but an off value (false, 0, none)."""
    return tuple(v for v in values if v not in (False, None) and str(v).lower() not in ("0", "none", "off", "no"))


def build_catalogue(declaration: Declaration) -> Catalogue:
    """The catalogue of one declaration: its knobs, the global-batch and process constraints, the rules by role."""
    knobs = {}
    rules: Rules = {}
    for name, spec in declaration.knobs.items():
        default = spec.default if spec.default in spec.values else spec.values[0]
        where = spec.flag or (f"${spec.env}" if spec.env else "the launcher's process count")
        text = spec.description or ROLE_TEXT[spec.role]
        knobs[name] = Knob(name=name, type=spec.type, values=spec.values, default=default, semantics=spec.semantics,
                           numerics_class=spec.numerics_class, description=f"{where}: {text}",
                           group="batch_split" if spec.role in (Role.BATCH_PER_PROCESS, Role.PROCESSES) else "",
                           compiles=_compiling_values(spec.values) if spec.role is Role.COMPILE else ())
        rules.update(role_rules(name, spec.role))
    constraints = []
    if declaration.batch is not None:
        batch_knobs = tuple(t for t in declaration.batch.factors if isinstance(t, str) and t in declaration.knobs)
        constraints.append(Constraint("global_batch_divisible", batch_knobs, _batch_divisible,
                                      f"global batch = {declaration.batch.global_}, accumulation derived"))
    procs = declaration.processes_knob
    if procs is not None:
        constraints.append(Constraint("processes_fit_devices", (procs,), _procs_fit, "one process per device slot"))
    threads = declaration.role_knob(Role.THREADS)
    if threads is not None:
        constraints.append(Constraint("threads_fit_cores", (threads, *((procs,) if procs else ())), _threads_fit,
                                      "threads × processes within twice the CPU slots"))
    return Catalogue(framework=NAME, knobs=knobs, constraints=constraints, rules=rules)


def _settings_or_none(r: Recipe) -> Settings | None:
    try:
        return settings(r)
    except RecipeError:
        return None  # Framework.check reports why; constraints stay quiet


def _batch_divisible(r: Recipe) -> str | None:
    s = _settings_or_none(r)
    if s is None or s.global_batch is None:
        return None
    batch = s.declaration.batch
    assert batch is not None
    knobs = r.effective_knobs
    other = s.product(knobs)
    if s.global_batch % other:
        return (f"the global batch {batch.global_} = {s.global_batch} must be divisible by the other factors "
                f"({other} here) so {batch.accumulation.flag} can keep it")
    procs = s.declaration.processes_knob
    acc = s.global_batch // other
    if batch.accumulation.divided_by_processes and procs is not None and acc % int(str(knobs[procs])):
        return (f"{batch.accumulation.flag} ({acc}) must be divisible by the process count ({knobs[procs]}): the "
                "script divides it among its processes")
    return None


def _procs_fit(r: Recipe) -> str | None:
    s = _settings_or_none(r)
    procs = s.declaration.processes_knob if s is not None else None
    return None if procs is None else processes_fit_problem(r, procs)


def _threads_fit(r: Recipe) -> str | None:
    s = _settings_or_none(r)
    if s is None or r.resources.accelerator != "cpu":
        return None
    threads, procs = s.declaration.role_knob(Role.THREADS), s.declaration.processes_knob
    t = r.knob(threads) if threads else None
    n = int(r.knob(procs)) if procs else 1
    if t in (None, "") or not str(t).isdigit() or int(str(t)) * n <= 2 * r.resources.devices_per_node:
        return None
    return (f"{threads} ({t}) × {n} processes oversubscribes the {r.resources.devices_per_node} CPU slots more than "
            "twice; lower it")


# ---------------------------------------------------------------------------------------------- render

def render_launch(recipe: Recipe, *, trial_flags: Mapping[str, str] | None = None) -> Launch:
    """The recipe's command with its knobs applied: each declared flag's value edited where it stands (appended in
    the command's own style where it was absent and moves off the default; a switch added or removed), the
    accumulation flag re-derived, declared variables set, the process count set on the launcher."""
    s = settings(recipe)
    assert recipe.launch is not None
    d, p = s.declaration, s.parsed
    knobs = recipe.effective_knobs
    edit = Edit(list(p.argv))
    env = dict(recipe.launch.env)
    changes: dict[str, str | None] = {}  # flag → new token (None: remove the flag)
    for name, spec in d.knobs.items():
        new, own = knobs[name], s.values[name]
        if spec.env is not None:  # set whatever its value: what the user runs is what each trial ran with
            if new is None:
                env.pop(spec.env, None)
            else:
                env[spec.env] = str(new)
            continue
        if spec.launcher is not None or (new == own and type(new) is type(own)):
            continue
        assert spec.flag is not None
        opt = p.option(spec.flag)
        if spec.switch:
            changes[spec.flag] = "" if new else None
        else:
            changes[spec.flag] = _token(new, opt.values[0] if opt and opt.values else None)
    if d.batch is not None and s.global_batch is not None:
        acc = s.global_batch // s.product(knobs)
        if acc != s.accumulation:
            changes[d.batch.accumulation.flag] = str(acc)
    changes.update(dict((trial_flags or {}).items()))
    for flag, token in changes.items():
        _edit_flag(edit, p, flag, token, after=s.config_position(flag))
    procs = d.processes_knob
    if procs is not None:
        _edit_processes(edit, p, int(str(knobs[procs])))
    return Launch(argv=tuple(edit.result()), env=env, files=dict(recipe.launch.files), cwd=recipe.launch.cwd)


def _edit_flag(edit: Edit, p: Parsed, flag: str, token: str | None, *, after: int = -1) -> None:
    """Set ``flag`` to ``token`` (``""``: a bare switch; None: remove it) in every place the command has it.
    ``after``: the index of a config file that assigns the setting; the flag must follow it to take effect, so
    an occurrence before it moves to the end."""
    found = [o for o in p.options if o.spelling == flag]
    words = [] if token is None else [flag] if token == "" else [f"{flag}={token}"] if (
        found[-1].inline if found else p.inline_style) else [flag, token]
    if found and found[-1].start < after:
        for o in found:
            edit.replace[o.start] = (o.end, [])
        found = []
    if not found:
        if words:
            edit.append.extend(words)
        return
    for o in found[:-1]:
        edit.replace[o.start] = (o.end, [])
    edit.replace[found[-1].start] = (found[-1].end, words)


def _edit_processes(edit: Edit, p: Parsed, n: int) -> None:
    if p.head is None or n == p.processes():
        return
    head = p.head
    if head.launcher == "python":
        edit.insert.setdefault(head.script_index, []).extend(["-m", "torch.distributed.run", "--standalone",
                                                              "--nproc_per_node", str(n)])
        return
    name = "nproc_per_node" if head.launcher == "torchrun" else "num_processes"
    opt = last_option(head.options, name)
    if opt is not None:
        edit.replace[opt.start] = (opt.end, [f"{opt.spelling}={n}"] if opt.inline else [opt.spelling, str(n)])
    else:
        edit.insert.setdefault(head.script_index, []).extend([f"--{name}", str(n)])


# ---------------------------------------------------------------------------------------------- the seam

class CommandFramework(Framework):
    name = NAME
    title = "any training command, through the knob declaration you write beside it (knobs.yaml)"
    versions = ""
    distribution = None
    launch_based = True
    declared_knobs = True
    backends = ("local",)
    rules = {(role.value, direction): rule for role in Role for (_, direction), rule in
             role_rules(role.value, role).items()}

    def catalogue(self) -> Catalogue:
        return _role_catalogue()

    def launch_catalogue(self, launch: Any) -> Catalogue | None:
        try:
            declaration = declaration_of(launch)
        except RecipeError:
            return None
        return None if declaration is None else _catalogue(declaration)

    def launch_problems(self, launch: Any) -> list[str]:
        try:
            if declaration_of(launch) is None:
                return [f"launch.declaration: a command recipe needs its knob declaration; {DECLARATION_HINT}"]
        except RecipeError as err:
            return [f"launch.declaration.{p}" for p in err.problems] or [f"launch.declaration: {err}"]
        return []

    # -- import ------------------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The command and its declaration (``options["knobs"]``: the declaration file; or ``options
        ["declaration"]``: its mapping) → a recipe mapping with every declared knob's value as the command has it.
        Positional words that name files in ``cwd`` (a config file) are carried in ``launch.files``."""
        options = dict(options or {})
        env = dict(env or {})
        if options.get("declaration") is not None:
            declaration = decl.parse(options["declaration"])
        elif options.get("knobs"):
            path = Path(str(options["knobs"]))
            declaration, _ = decl.load(path if path.is_absolute() else Path(cwd) / path)
        else:
            raise RecipeError(f"the command framework needs to know what it may change: {DECLARATION_HINT}")
        argv = [str(a) for a in argv]
        names = {k.env for k in declaration.knobs.values() if k.env} | {c for c in declaration.contract
                                                                      if not c.startswith("-")}
        kept_env = {**recordable_env(env, _ENV_PREFIXES, _ENV_NAMES), **{k: v for k, v in env.items() if k in names}}
        s = read_launch(declaration, argv, kept_env, cwd=cwd)
        files = {}
        for _, word in s.parsed.positionals:
            path = Path(word) if Path(word).is_absolute() else Path(cwd) / word
            if path.is_file() and path.stat().st_size < 1_000_000:
                try:
                    files[word] = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
        script = s.parsed.head.script if s.parsed.head is not None else argv[0]
        procs = declaration.processes_knob
        nproc = int(s.values[procs]) if procs else 1  # type: ignore[arg-type]
        return {
            "name": options.get("name") or f"{Path(str(cwd)).name or 'command'}-{Path(script).stem}".strip("-"),
            "framework": NAME,
            "launch": {"argv": argv, "env": kept_env, "cwd": str(cwd), "files": files,
                       "declaration": declaration.to_data()},
            "resources": {"accelerator": options.get("accelerator") or "cpu",
                          "devices_per_node": options.get("devices_per_node") or nproc, "nodes": 1},
            "knobs": dict(s.values),
        }

    # -- contract ----------------------------------------------------------------------------------------
    def check(self, recipe: Recipe) -> list[str]:
        try:
            settings(recipe)
        except RecipeError as err:
            return [str(err) if str(err).startswith(("launch", "knobs")) else f"launch: {err}"]
        return []

    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        """The declared contract flags and variables, the global batch (derived), the declaration itself, and
        every undeclared flag, positional word, variable and file, frozen as written."""
        try:
            s = settings(recipe)
        except RecipeError:
            return {}
        assert recipe.launch is not None
        d, p = s.declaration, s.parsed
        out: dict[str, ContractField] = {}
        for name in d.contract:
            where = ""
            if name.startswith("-"):
                src = s.source(name)
                value: Any = src.value if src.kind == "config" else (src.token if src.token is not None else True) \
                    if src.kind == "option" else None
                where = src.where if src.kind == "config" else ""
            else:
                value = recipe.launch.env.get(name)
            out[f"command.{name.lstrip('-')}"] = ContractField(
                value, "contract", fix=f"{name} is declared contract (it decides what the model learns): attune "
                                       "never changes it", explain=_contract_refusal(name, where))
        if d.batch is not None and s.global_batch is not None:
            knobs = recipe.effective_knobs
            factors = s.product(knobs)
            acc = s.global_batch // factors if s.global_batch % factors == 0 else s.global_batch / factors
            out["command.global_batch"] = ContractField(
                factors * acc, "derived", depends_on=tuple(f"knobs.{t}" for t in d.batch.factors if t in d.knobs),
                fix=f"The global batch ({d.batch.global_}) must stay {s.global_batch}: move the knobs in it so their "
                    f"product divides it ({d.batch.accumulation.flag} is derived)")
        fix = "attune changes only the declared knobs of a command; declare a flag in the knob declaration to let it " \
              "change"
        out["launch.declaration"] = ContractField(recipe.launch.declaration, "frozen",
                                                  fix="the knob declaration is the owner's: a trial cannot change it")
        out["launch.launcher"] = ContractField(p.launcher_tokens(), "frozen", fix=fix)
        owned = {k.flag for k in d.knobs.values() if k.flag} | set(d.contract)
        if d.batch is not None:
            owned.add(d.batch.accumulation.flag)
        frozen = sorted({o.spelling for o in p.options} - owned)
        out["launch.options"] = ContractField(frozen, "frozen", fix=fix, explain=_undeclared_flags)
        for flag in frozen:
            opt = p.option(flag)
            assert opt is not None
            out[f"launch.args.{flag.lstrip('-')}"] = ContractField(opt.raw, "frozen", fix=fix,
                                                                    explain=_undeclared_value(flag))
        out["launch.positionals"] = ContractField([t for _, t in p.positionals], "frozen", fix=fix)
        knob_env = {k.env for k in d.knobs.values() if k.env}
        out["launch.env"] = ContractField({k: v for k, v in sorted(recipe.launch.env.items()) if k not in knob_env},
                                          "frozen", fix=fix)
        out["launch.cwd"] = ContractField(recipe.launch.cwd, "frozen", fix=fix)
        out["launch.files"] = ContractField(dict(sorted(recipe.launch.files.items())), "frozen",
                                            fix="files the command names are carried verbatim")
        return out

    def report_problems(self, recipe: Recipe, reported: Mapping[str, Any]) -> list[str]:
        """The script's own count of tokens per step (nanoGPT's ``tokens per iteration will be: N`` line, a
        ``tokens`` group of the step lines) against the one attune believes: the global batch it read × the
        declared tokens per sample. A mismatch means a setting attune did not read decides the work per step."""
        expected = self.tokens_per_step(recipe)
        s = _settings_or_none(recipe)
        if expected is None or s is None:
            return []
        d = s.declaration
        how = (f"global batch {d.batch.global_ if d.batch else ''} = {s.global_batch} × tokens_per_sample "
               f"{d.tokens_per_sample}" if d.tokens_per_sample is not None else f"tokens_per_step {d.tokens_per_step}")
        problems = []
        for key, what in (("tokens_per_iteration", "\"tokens per iteration will be: {n:,}\""),
                          ("tokens_per_step_line", "{n:,} tokens in its step line")):
            got = reported.get(key)
            if isinstance(got, int) and got != expected:
                problems.append(f"the script printed {what.format(n=got)}, but attune counts {expected:,} tokens per "
                                f"optimizer step ({how}): a setting attune did not read (the script's own default, "
                                "a config file, a wrong declared value) changes the work per step; make the knob "
                                "declaration and the command say what the script does")
        return problems

    def declared_hazards(self, recipe: Recipe) -> list[Hazard]:
        """The hazards the recipe's knob declaration states (loss_is_step_mean: false, eval_shares_generator: true,
        dropout: true), for the loss check: each makes two runs learn differently beyond rounding."""
        s = _settings_or_none(recipe)
        return s.declaration.hazards() if s is not None else []

    def random_stream_hazards(self, recipe: Recipe) -> list[str]:
        return [h.why for h in self.declared_hazards(recipe)]

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        s = _settings_or_none(recipe)
        if s is None:
            return None
        if s.declaration.tokens_per_step is not None:
            return s.declaration.tokens_per_step
        if s.declaration.tokens_per_sample is not None and s.global_batch is not None:
            return s.global_batch * s.declaration.tokens_per_sample
        return None

    def equivalent_layouts(self, recipe: Recipe, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
        s = _settings_or_none(recipe)
        knob = s.declaration.role_knob(Role.BATCH_PER_PROCESS) if s is not None else None
        if knob is None or s is None or s.declaration.batch is None:
            return []
        return micro_batch_layouts(recipe, knob, avoid=avoid)

    def loss_resolution(self, recipe: Recipe, loss: float, reported: Mapping[str, Any] | None = None) -> float | None:
        """Half the last printed decimal of the losses (``loss 4.3128``: 0.00005); None when they were not
        printed with a fixed number of decimals."""
        decimals = (reported or {}).get("loss_decimals")
        if not isinstance(decimals, int) or not math.isfinite(loss):
            return None
        return 0.5 * 10.0 ** -decimals

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        problems = super().preflight(recipe, backend)
        if problems or recipe.launch is None:
            return problems
        import shutil

        cwd = Path(recipe.launch.cwd or ".")
        if not cwd.is_dir():
            return [f"launch.cwd: {cwd} does not exist here"]
        first = recipe.launch.argv[0]
        if ("/" in first and not (cwd / first).exists()) or ("/" not in first and shutil.which(first) is None):
            problems.append(f"launch.argv: {first} is not found here (PATH or {cwd})")
        s = _settings_or_none(recipe)
        if s is not None and s.parsed.head is not None and not s.parsed.head.module:
            script = Path(s.parsed.head.script)
            if not (script if script.is_absolute() else cwd / script).is_file():
                problems.append(f"launch.argv: the script {script} does not exist in {cwd}")
        return problems

    def set_native(self, recipe_data: dict[str, Any], name: str, value: Any) -> bool:
        """``--set learning_rate=1e-3``: set the command's own flag ``--learning_rate`` (``--set --lr=...`` for
        another spelling) in place, where ``name`` is no declared knob; the gate then judges the change."""
        launch = recipe_data.get("launch")
        if not isinstance(launch, dict) or "." in name:
            return False
        try:
            declaration = declaration_of(launch)
            parsed = parse_argv(launch.get("argv") or [])
        except RecipeError:
            return False
        if declaration is None or name in declaration.knobs:
            return False
        flag = name if name.startswith("-") else f"--{name}"
        edit = Edit(list(parsed.argv))
        token = None if value is None else "" if value is True and parsed.option(flag) is None else \
            _token(value, (parsed.option(flag) or Option("", 0, 0, "", False, ())).raw)
        _edit_flag(edit, parsed, flag, token if isinstance(token, str) or token is None else str(token))
        launch["argv"] = edit.result()
        return True

    # -- render and trials -------------------------------------------------------------------------------
    def render(self, recipe: Recipe) -> Launch:
        return render_launch(recipe)

    def trial_launch(self, recipe: Recipe, request: TrialRequest, trial_dir: Path, *, python: str = sys.executable,
                     metrics_port: int | None = None) -> TrialLaunch:
        """``render`` with unbuffered output (so each step line arrives when it is printed) and the declaration's
        ``trial_flags``; attune ends it after ``request.steps`` step lines."""
        flags = {flag: value.replace("{trial_dir}", str(trial_dir))
                 for flag, value in settings(recipe).declaration.trial_flags.items()}
        launch = render_launch(recipe, trial_flags=flags)
        env = {**launch.env, "PYTHONUNBUFFERED": "1"}
        notes = ("PYTHONUNBUFFERED=1", *(f"{flag} {value}" for flag, value in flags.items()))
        return TrialLaunch(Launch(argv=launch.argv, env=env, files=launch.files, cwd=launch.cwd),
                           stop_after_steps=request.steps, instrumentation=notes)

    # -- Kubernetes --------------------------------------------------------------------------------------
    k8s = True

    def patch_job(self, recipe: Recipe, job: dict[str, Any], container: dict[str, Any], *, steps: int,
                  metrics_port: int, linger_s: float) -> None:
        """The user's container running the rendered command (its ``command`` kept where the argument list still
        starts with it), the declared variables set, output unbuffered, and for a PyTorchJob the declared process
        count as ``nprocPerNode``. Trials are read from the pod log; the operator ends them after ``steps`` steps.
        (A ``spec.recipe.inline`` command recipe carries its declaration; an imported container needs one.)"""
        s = settings(recipe)
        flags = dict(s.declaration.trial_flags)
        if any("{trial_dir}" in v for v in flags.values()):
            flags = {k: v.replace("{trial_dir}", "/tmp/attune-trial") for k, v in flags.items()}
        launch = render_launch(recipe, trial_flags=flags)
        set_container_argv(container, launch.argv)
        procs = s.declaration.processes_knob
        if procs is not None and job.get("kind") in (None, "PyTorchJob"):
            job.setdefault("spec", {})["nprocPerNode"] = str(recipe.knob(procs))
        values = {k: v for k, v in launch.env.items() if recipe.launch is None or recipe.launch.env.get(k) != v}
        values["PYTHONUNBUFFERED"] = "1"
        env = [e for e in container.get("env") or [] if e.get("name") not in values]
        container["env"] = env + [{"name": k, "value": v} for k, v in sorted(values.items())]

    def parser(self, recipe: Recipe) -> LogParser:
        s = settings(recipe)
        steps = s.declaration.steps
        return StepLineParser(step_pattern(steps.preset, steps.pattern), tokens_per_step=self.tokens_per_step(recipe))


def _had(value: Any) -> str:
    return "no value for it (the script's own default applies)" if value is None else \
        "it as a bare switch" if value is True else f"{value}"


def _would(value: Any) -> str:
    return "remove it (the script's own default would apply)" if value is None else \
        "add it as a bare switch" if value is True else f"set it to {value}"


def _contract_refusal(flag: str, where: str) -> Callable[[Any, Any], str]:
    """The refusal of a change to contract ``flag``, in the script's own name and with its real value (``where``:
    the config file and line that sets it)."""
    name = flag.lstrip("-")

    def explain(old: Any, new: Any) -> str:
        at = f" ({where})" if where and old is not None else ""
        return (f"{name} is a contract setting of this script (it decides what the model learns): attune never "
                f"changes it. The launch has {_had(old)}{at}; this change would {_would(new)}. Restore it; if it "
                "truly cannot change what is learned, its owner can move it from contract to a knob in the knob "
                "declaration")
    return explain


def _undeclared_flags(old: Any, new: Any) -> str:
    """The refusal of a flag added to (or removed from) the command that the declaration does not name."""
    old_set, new_set = set(old or []), set(new or [])
    parts = [f"{f} is not declared in the knob declaration (neither a knob nor contract), and this change would add "
             "it" for f in sorted(new_set - old_set)]
    parts += [f"{f} is not declared in the knob declaration, and this change would remove it from the command"
              for f in sorted(old_set - new_set)]
    return ("; ".join(parts) + ": attune cannot know what it does to what the model learns, so it never changes an "
            "undeclared flag. If it cannot change what is learned, declare it as a knob in knobs.yaml; if it can, "
            "list it under contract")


def _undeclared_value(flag: str) -> Callable[[Any, Any], str]:
    def explain(old: Any, new: Any) -> str:
        return (f"{flag} is not declared in the knob declaration (neither a knob nor contract): attune cannot know "
                f"what it does to what the model learns, so it keeps it as the command writes it ({old}; this "
                f"change would make it {new}). If it cannot change what is learned, declare it as a knob in "
                "knobs.yaml; if it can, list it under contract")
    return explain


@functools.lru_cache(maxsize=64)
def _catalogue_cached(key: str) -> Catalogue:
    return build_catalogue(_declaration_of(key))


def _catalogue(declaration: Declaration) -> Catalogue:
    return _catalogue_cached(json.dumps(declaration.to_data(), sort_keys=True, default=str))


FRAMEWORK = frameworks.register(CommandFramework())

__all__ = ["FRAMEWORK", "CommandFramework", "Parsed", "Settings", "build_catalogue", "declaration_of", "parse_argv",
           "read_launch", "render_launch", "settings"]
