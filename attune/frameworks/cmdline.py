"""Launch command lines read and edited token by token: the parts every framework's launch shares.

A launch is ``LAUNCHER [launcher options] SCRIPT ARGS``. The launchers (``python``, ``torchrun``, ``accelerate
launch``, ``deepspeed``) are read here with the option tables of their installed parsers; each framework reads its
own ARGS (``HfArgumentParser`` flags, Megatron's argparse flags, Hydra overrides, TOML overrides) with
:func:`scan_flags` or its own scanner, and writes changes through :class:`Edit`, which keeps every untouched token
where it was.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

from attune.errors import RecipeError

PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
#: python interpreter options without a value / with one value
PY_FLAGS = frozenset({"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-q", "-b", "-bb", "-v", "-d", "-P"})
PY_VALUE_FLAGS = frozenset({"-X", "-W"})
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
ACCELERATE_MODULES = ("accelerate.commands.launch",)
#: launcher options that take no value (everything else takes one); from the installed parsers' option tables
TORCHRUN_SWITCHES = frozenset({"h", "help", "standalone", "m", "module", "no_python", "run_path",
                               "virtual_local_rank"})
ACCELERATE_SWITCHES = frozenset({"h", "help", "quiet", "q", "cpu", "multi_gpu", "tpu", "enable_cpu_affinity",
                                 "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation",
                                 "use_deepspeed", "use_fsdp", "use_parallelism_config", "use_megatron_lm",
                                 "same_network", "m", "module", "no_python", "tpu_cluster", "no_tpu_cluster",
                                 "tpu_use_sudo", "downcast_bf16", "fp8_use_autocast_during_eval", "debug"})
REMOVE = object()  # edit marker: drop the setting (its value becomes the framework default)

#: launchers whose parser takes abbreviated options (argparse's default ``allow_abbrev``), and where its source lies in
#: the installed package (``accelerate launch`` sets ``allow_abbrev=False``: it refuses abbreviations itself)
ABBREVIATING = {"torchrun": ("torch", "distributed/run.py"), "deepspeed": ("deepspeed", "launcher/runner.py")}
#: their long options (normalised) in the pinned versions, for machines without them installed
PINNED_LAUNCHER_OPTIONS = {
    "torchrun": ("torch 2.13.0", frozenset(["duplicate_stderr_filters", "duplicate_stdout_filters", "event_log_handler", "help", "local_addr", "local_ranks_filter", "log_dir", "logs_specs", "master_addr", "master_port", "max_restarts", "module", "monitor_interval", "nnodes", "no_python", "node_rank", "nproc_per_node", "numa_binding", "rdzv_backend", "rdzv_conf", "rdzv_endpoint", "rdzv_id", "redirects", "role", "run_path", "shutdown_timeout", "signals_to_handle", "standalone", "start_method", "tee", "virtual_local_rank"])),
    "deepspeed": ("deepspeed 0.19.8", frozenset(["autotuning", "bind_core_list", "bind_cores_to_rank", "enable_each_rank_log", "exclude", "force_multi", "help", "hostfile", "include", "launcher", "launcher_args", "log_level", "master_addr", "master_port", "module", "no_local_rank", "no_python", "no_ssh", "no_ssh_check", "node_rank", "num_accelerators", "num_gpus", "num_nodes", "quiet", "save_pid", "ssh_port", "venv_script"])),
}


class AbbreviatedOption(RecipeError):
    """A launcher option written as an abbreviation of one of the launcher's own (refused, whatever else the launch
    is: the framework that reads it must not take it for another form)."""


@cache
def launcher_options(launcher: str) -> frozenset[str] | None:
    """The long options (normalised) of an abbreviating launcher's parser: read from the installed package's own
    source with :mod:`ast` (nothing is imported), else the pinned version's; None for other launchers."""
    if launcher not in ABBREVIATING:
        return None
    package, rel = ABBREVIATING[launcher]
    try:
        spec = importlib.util.find_spec(package)
        origin = spec.origin if spec is not None else None
        tree = ast.parse((Path(origin).parent / rel).read_text(encoding="utf-8")) if origin else None
    except (ImportError, ValueError, OSError, SyntaxError, UnicodeDecodeError):
        tree = None
    names = {"help"}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            names.update(norm(a.value) for a in node.args
                         if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"))
    return frozenset(names) if len(names) > 1 else PINNED_LAUNCHER_OPTIONS[launcher][1]


def abbreviation(launcher: str, spelling: str) -> str | None:
    """A message when ``spelling`` (an option as written) is not one of the launcher's options but an abbreviation
    of one, which its argparse parser would expand (or refuse as ambiguous); None otherwise."""
    known = launcher_options(launcher)
    name = norm(spelling)
    if known is None or not spelling.startswith("--") or not name or name in known:
        return None
    expands = sorted(o for o in known if o.startswith(name))
    if not expands:
        return None
    full = " or ".join(f"--{o}" for o in expands)
    return (f"launcher option {spelling} is an abbreviation: {launcher} reads it as {full}; write the full option "
            "name so attune reads the launch the way the launcher does")


def norm(option: str) -> str:
    """``--nproc-per-node`` → ``nproc_per_node``."""
    return option.lstrip("-").replace("-", "_")


def as_written(option: str) -> str:
    """``--nproc-per-node`` → ``nproc-per-node`` (dashes and underscores kept)."""
    return option.lstrip("-")


@dataclass(frozen=True)
class Option:
    """One option occurrence: ``argv[start]`` is the option, ``argv[start+1:end]`` its value tokens."""

    name: str  # normalised by the scanner that read it (:func:`norm` or :func:`as_written`)
    start: int
    end: int
    spelling: str  # the option as written, without any ``=value``
    inline: bool  # written ``--name=value``
    values: tuple[str, ...]

    @property
    def raw(self) -> Any:
        """``None`` for a bare flag, the value for one token, the list for several."""
        if not self.values:
            return None
        return self.values[0] if len(self.values) == 1 else list(self.values)

    @property
    def dashed(self) -> bool:
        return "-" in self.spelling.lstrip("-")


def scan_launcher(argv: Sequence[str], i: int, switches: frozenset[str], *, name: Callable[[str], str] = norm,
                  accepted: Sequence[str] = (), launcher: str = "") -> tuple[list[Option], int, bool]:
    """Launcher options from ``argv[i]`` up to the script; returns (options, script index, script-is-module).
    ``switches`` (normalised names) take no value; every other option takes one. An abbreviated option of an
    abbreviating ``launcher`` (``torchrun --nproc_per 2``) is refused, naming it and its full name."""
    opts: list[Option] = []
    module = False
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            i += 1
            break
        if not tok.startswith("-") or tok == "-":
            break
        spelling, eq, value = tok.partition("=")
        problem = abbreviation(launcher, spelling) if launcher else None
        if problem:
            raise AbbreviatedOption(problem, list(accepted))
        if eq:
            opts.append(Option(name(spelling), i, i + 1, spelling, True, (value,)))
            i += 1
        elif norm(spelling) in switches:
            opts.append(Option(name(spelling), i, i + 1, spelling, False, ()))
            i += 1
            module = module or norm(spelling) in ("m", "module")
        else:
            if i + 1 >= len(argv):
                raise RecipeError(f"launcher option {tok} has no value", list(accepted))
            opts.append(Option(name(spelling), i, i + 2, spelling, False, (argv[i + 1],)))
            i += 2
    return opts, i, module


def scan_flags(argv: Sequence[str], start: int) -> tuple[list[Option], list[tuple[int, str]]]:
    """argparse-style flags (``HfArgumentParser`` among them): each ``--option`` owns the tokens up to the next
    ``--option``; a ``--`` makes the rest positional. Returns (options, positionals with their index)."""
    opts: list[Option] = []
    positionals: list[tuple[int, str]] = []
    i = start
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            positionals.extend((j, argv[j]) for j in range(i, len(argv)))
            break
        if tok.startswith("--") and len(tok) > 2:
            spelling, eq, value = tok.partition("=")
            if eq:
                opts.append(Option(norm(spelling), i, i + 1, spelling, True, (value,)))
                i += 1
                continue
            j = i + 1
            while j < len(argv) and not (argv[j].startswith("--") and len(argv[j]) > 2) and argv[j] != "--":
                j += 1
            opts.append(Option(norm(spelling), i, j, spelling, False, tuple(argv[i + 1:j])))
            i = j
        else:
            positionals.append((i, tok))
            i += 1
    return opts, positionals


def skip_tokens(argv: Sequence[str], options: Sequence[Option], end: int) -> list[str]:
    """``argv[:end]`` without the tokens of ``options`` (the launcher without its process count, for the
    contract)."""
    skip = {i for o in options for i in range(o.start, o.end)}
    return [t for i, t in enumerate(argv[:end]) if i not in skip]


def last_option(options: Sequence[Option], *names: str, key: Callable[[str], str] = str) -> Option | None:
    """The last occurrence of an option called any of ``names`` (as ``key`` normalises a scanned name)."""
    found = [o for o in options if key(o.name) in names]
    return found[-1] if found else None


def process_count(opt: Option | None, *, example: int = 2) -> int | None:
    """The processes per node an ``--nproc_per_node``-style option gives (``None`` when absent or valueless)."""
    if opt is None or not opt.values:
        return None
    value = opt.values[0]
    if not value.isdigit() or int(value) < 1:
        raise RecipeError(f"{opt.spelling} {value}: attune needs the number of processes per node as a number; "
                          f"write e.g. {opt.spelling} {example}")
    return int(value)


def node_count(opt: Option | None) -> int | None:
    """The fixed node count an ``--nnodes``-style option gives (``None`` when absent); an elastic range is an
    error (attune tunes fixed-size jobs)."""
    if opt is None or not opt.values:
        return None
    lo, _, hi = opt.values[0].partition(":")
    if lo.isdigit() and (not hi or hi == lo):
        return max(1, int(lo))
    raise RecipeError(f"{opt.spelling} {opt.values[0]}: attune tunes fixed-size jobs; give one node count")


@dataclass
class Edit:
    """Token edits of one argument list, applied at once: untouched tokens keep their place."""

    argv: list[str]
    replace: dict[int, tuple[int, list[str]]] = field(default_factory=dict)  # start → (end, new tokens)
    insert: dict[int, list[str]] = field(default_factory=dict)  # before index → tokens
    append: list[str] = field(default_factory=list)

    def result(self) -> list[str]:
        out: list[str] = []
        i, n = 0, len(self.argv)
        while i <= n:
            out.extend(self.insert.get(i, []))
            if i == n:
                break
            if i in self.replace:
                end, tokens = self.replace[i]
                out.extend(tokens)
                i = end
                continue
            out.append(self.argv[i])
            i += 1
        return out + self.append


_EXPORT = re.compile(r"^\s*export\s+([A-Za-z_]\w*)=(.*)$")
_SHELL_SETUP = ("set ", "cd ", "source ", ". ", "ulimit ", "module ", "echo ", "if ", "fi", "then", "else", "}")


def read_launch_script(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """The launch of a shell launch script, as the launcher receives it: (argument list, environment it exports).

    The command is the script's ``exec`` line, or else its last command line that is not shell set-up; ``export
    NAME=value`` lines are its environment, and ``$NAME`` / ``${NAME}`` of those exports are expanded in the
    command. Continuation lines (``\\``) are joined. :class:`RecipeError` names what could not be read."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RecipeError(f"cannot read the launch script {path}: {getattr(err, 'strerror', None) or err}") from None
    lines = [ln.strip() for ln in re.sub(r"\\\r?\n", " ", text).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    env: dict[str, str] = {}
    commands: list[str] = []
    for ln in lines:
        m = _EXPORT.match(ln)
        if m:
            try:
                value = shlex.split(m.group(2))
            except ValueError as err:
                raise RecipeError(f"{path}: cannot read `{ln}`: {err}") from None
            env[m.group(1)] = value[0] if value else ""
        elif ln.startswith("exec "):
            commands = [ln[5:]]
            break
        elif not ln.startswith(_SHELL_SETUP) and not ln.startswith("#!"):
            commands.append(ln)
    if not commands:
        raise RecipeError(f"{path} has no launch command: write it as the script's `exec ...` line")

    def expand(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            raise RecipeError(f"{path}: ${name} in the launch command is not exported by the script; export it "
                              "there or write its value in the command")
        return env[name]

    try:
        argv = [re.sub(r"\$\{(\w+)\}|\$(\w+)", expand, tok) for tok in shlex.split(commands[-1])]
    except ValueError as err:
        raise RecipeError(f"{path}: cannot split the launch command: {err}") from None
    if not argv:
        raise RecipeError(f"{path} has an empty launch command")
    return argv, env


#: ``python -m MODULE`` forms of the launchers
LAUNCHER_MODULES = {**dict.fromkeys(TORCHRUN_MODULES, "torchrun"), **dict.fromkeys(ACCELERATE_MODULES, "accelerate"),
                    "deepspeed.launcher.runner": "deepspeed"}


@dataclass(frozen=True)
class LaunchHead:
    """Where a launch's launcher ends: ``argv[script]`` is the script (``argv[script + 1]`` the module name after
    ``python -m``), its arguments start at ``args_start``."""

    launcher: str  # python | torchrun | accelerate | deepspeed
    options: tuple[Option, ...]
    script_index: int  # index of the script token (of ``-m`` for ``python -m module``)
    script: str  # the script path, or module name
    module: bool
    args_start: int


def split_launch(argv: Sequence[str], launchers: dict[str, frozenset[str]], *, unknown: str,
                 accepted: Sequence[str] = (), name: Callable[[str], str] = norm) -> LaunchHead:
    """Split ``argv`` after its launcher. ``launchers`` maps the launchers a framework accepts (``torchrun``,
    ``accelerate``, ``deepspeed``; ``python`` always) to their switches; ``unknown`` is the message for any other
    program. :class:`RecipeError` (with ``accepted`` forms) names what is wrong."""
    argv = tuple(argv)
    tail = list(accepted)
    if not argv:
        raise RecipeError("the launch command is empty" + ("; accepted forms:" if tail else ""), tail)
    head = PurePosixPath(argv[0]).name
    opts: list[Option] = []
    module = False
    if head in ("torchrun", "deepspeed") and head in launchers:
        launcher = head
        opts, i, module = scan_launcher(argv, 1, launchers[head], name=name, accepted=accepted, launcher=head)
    elif head == "accelerate" and "accelerate" in launchers and len(argv) > 1 and argv[1] == "launch":
        launcher = "accelerate"
        opts, i, module = scan_launcher(argv, 2, launchers[launcher], name=name, accepted=accepted,
                                        launcher=launcher)
    elif PYTHON.match(head):
        i = 1
        while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
            tok = argv[i]
            if tok in PY_FLAGS or (tok[:2] in PY_VALUE_FLAGS and len(tok) > 2):
                i += 1
            elif tok in PY_VALUE_FLAGS:
                i += 2
            else:
                raise RecipeError(f"python option {tok} is not supported in a launch attune imports (it runs a "
                                  "training script)" + ("; accepted forms:" if tail else ""), tail)
        via = LAUNCHER_MODULES.get(argv[i + 1]) if i < len(argv) - 1 and argv[i] == "-m" else None
        if via in launchers:
            launcher = via
            opts, i, module = scan_launcher(argv, i + 2, launchers[via], name=name, accepted=accepted, launcher=via)
        elif i < len(argv) and argv[i] == "-m":
            launcher, module = "python", True
            i += 1  # the module name follows
        else:
            launcher = "python"
    else:
        hint = ("; a launch script is read by `attune import --framework NAME --script FILE -o recipe.yaml`, then "
                "`attune tune recipe.yaml`" if argv[0] == "--script" else "")
        raise RecipeError(f"unknown launcher {argv[0]!r}: {unknown}{hint}" + ("; accepted forms:" if tail else ""),
                          tail)
    if i >= len(argv):
        raise RecipeError(f"no training script in `{' '.join(argv)}`: name the script after the launcher"
                          + ("; accepted forms:" if tail else ""), tail)
    # ``python -m mod``: the script is the pair (-m, mod); a launcher's own -m switch sits among its options
    script_index = i - 1 if (module and launcher == "python") else i
    return LaunchHead(launcher, tuple(opts), script_index, argv[i], module, i + 1)


# -- a Kubernetes training container's launch (plain mappings: no Kubernetes client here) ----------------------

def container_launch(container: Mapping[str, Any], *, forms: str = "the launch") -> tuple[list[str], dict[str, str],
                                                                                          Path]:
    """A training container's (argument list, literal environment, working directory); :class:`RecipeError` when
    it sets no command (``forms`` names what the command should be)."""
    command = [str(c) for c in container.get("command") or []]
    if not command:
        raise RecipeError(f"the training container sets no command: give {forms} as command and args")
    argv = command + [str(a) for a in container.get("args") or []]
    env = {str(e["name"]): str(e["value"]) for e in container.get("env") or [] if "name" in e and "value" in e}
    return argv, env, Path(str(container.get("workingDir") or "/"))


def set_container_argv(container: dict[str, Any], argv: Sequence[str]) -> None:
    """Write ``argv`` into ``container``, keeping the user's ``command`` where the argument list still starts with
    it (only ``args`` change), else as ``command: [argv[0]]`` and ``args: argv[1:]``."""
    argv = list(argv)
    command = [str(c) for c in container.get("command") or []]
    if command and argv[:len(command)] == command:
        container["args"] = argv[len(command):]
    else:
        container["command"], container["args"] = argv[:1], argv[1:]
