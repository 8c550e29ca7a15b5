"""A ``LightningCLI`` launch read the way jsonargparse reads it, and edited token by token.

Accepted form: ``python [-u ...] SCRIPT [--config TOP.yaml] [SUBCOMMAND] [ARGS]`` (or ``python -m MODULE ...``),
where SUBCOMMAND is ``fit`` (a CLI built with ``run=False`` has none). Lightning starts its own processes
(``--trainer.devices N``: its ddp strategy re-runs the script in N-1 more processes), so no torchrun.

What the CLI reads, in order (later wins, as in jsonargparse):

1. a top-level ``--config`` / ``-c`` before the subcommand: its ``fit:`` section;
2. the subcommand's arguments, left to right: ``--a.b VALUE`` and ``--a.b=VALUE`` set one setting, ``--config
   FILE`` / ``-c FILE`` merges the file's settings *at its position* (a flag before it is overridden by the file, one
   after it overrides the file), ``--a.b+=VALUE`` appends to a list (``--trainer.callbacks+=...``).

Values are YAML, as jsonargparse loads them (``true``, ``null``, ``[0, 1]``). Setting names are dotted paths; an
``init_args`` segment (``--data.init_args.batch_size``, ``class_path``/``init_args`` mappings in a config file)
names the same setting as without it, and a class path given to a section (``--data my.DataModule``) is its
``class_path``. A scalar replaces the whole subtree it names (``--trainer.logger false``); a mapping merges.

Config files are read from ``launch.files`` (their text, recorded at import), never from disk here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from attune.errors import RecipeError
from attune.frameworks.cmdline import Edit, LaunchHead, split_launch

SUBCOMMANDS = ("fit", "validate", "test", "predict")
CONFIG_FLAGS = ("--config", "-c")
#: options that take no value (LightningCLI's own; ``--print_config`` takes an optional one)
SWITCHES = ("--help", "-h", "--print_config")
ACCEPTED = [
    "python train.py fit --trainer.devices 1 --data.batch_size 2 --trainer.accumulate_grad_batches 8 ...",
    "python train.py fit --config config.yaml --data.batch_size=2 ...",
    "python train.py --config top.yaml fit ...      (a top-level config with a fit: section)",
]
_CLASS_PATH = re.compile(r"^([A-Za-z_]\w*\.)*[A-Z]\w*$")
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class Arg:
    """One option occurrence on the command line: ``argv[start:end]`` are its tokens."""

    key: str  # the setting it names (dotted, ``init_args`` removed; ``config`` for a config file)
    spelling: str  # the option as written, without any ``=value``
    start: int
    end: int
    inline: bool  # written ``--name=value``
    raw: str | None  # the value as written (None for a switch)
    append: bool = False  # ``--name+=value``
    top: bool = False  # before the subcommand


@dataclass(frozen=True)
class ParsedLaunch:
    """A LightningCLI launch: its head, subcommand, option occurrences and the effective settings."""

    argv: tuple[str, ...]
    head: LaunchHead
    subcommand: str | None
    subcommand_index: int | None
    args: tuple[Arg, ...]
    positionals: tuple[tuple[int, str], ...]
    configs: tuple[str, ...]  # config files, in the order the CLI reads them
    settings: dict[str, Any]  # dotted name → value (YAML-loaded), in the order last set
    setter: dict[str, int | str]  # dotted name → index into ``args`` of the flag that set it last, or the config path

    def cli_arg(self, key: str) -> Arg | None:
        """The command-line occurrence that decides ``key`` (None when a config file has the last word, or none)."""
        who = self.setter.get(key)
        return self.args[who] if isinstance(who, int) else None


def split(argv: Sequence[str]) -> LaunchHead:
    return split_launch(argv, {}, unknown="attune imports LightningCLI launches run by python (Lightning starts "
                        "its own processes: --trainer.devices N, no torchrun)", accepted=ACCEPTED)


def load_value(raw: str | None) -> Any:
    """A command-line value as jsonargparse loads it (YAML; text that is no YAML stays text)."""
    if raw is None:
        return None
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw
    return raw if isinstance(value, (list, dict)) and not raw.lstrip().startswith(("[", "{")) else value


def norm_key(name: str) -> str:
    """``--data.init_args.batch_size`` → ``data.batch_size``."""
    parts = [p for p in name.lstrip("-").split(".") if p != "init_args"]
    return ".".join(parts)


def canonical(value: Any) -> Any:
    """A setting's value for comparison: numbers written as text read as numbers (``1e-3`` is ``0.001``, ``3.0``
    is ``3``), everything else as loaded."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        value = float(value)
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


def format_value(value: Any) -> str:
    """A value as a LightningCLI flag takes it (``true``, ``null``, ``4``, text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def load_config(path: str, text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as err:
        raise RecipeError(f"the config file {path} is no YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"the config file {path} must be a mapping of settings (trainer:, model:, data: ...)")
    return data


def flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A nested config mapping as ``(dotted name, value)`` leaves; ``init_args`` levels are transparent."""
    out: list[tuple[str, Any]] = []
    for k, v in data.items():
        key = prefix if str(k) == "init_args" else (f"{prefix}.{k}" if prefix else str(k))
        if isinstance(v, Mapping) and v:
            out.extend(flatten(v, key))
        else:
            out.append((key, v))
    return out


class _Settings:
    """The effective settings as they are built up, with who set each last."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.setter: dict[str, int | str] = {}

    def _clear(self, key: str) -> None:
        for k in [k for k in self.values if k.startswith(key + ".") or key.startswith(k + ".")]:
            del self.values[k]
            self.setter.pop(k, None)

    def put(self, key: str, value: Any, who: int | str) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in flatten(value, key):
                self.put(k, v, who)
            return
        if isinstance(value, str) and _CLASS_PATH.match(value) and \
                ("." not in key or (key.startswith("trainer.") and key.count(".") == 1)):
            key = f"{key}.class_path"  # ``--data my.DataModule``: the section's class, its arguments kept
        else:
            self._clear(key)
        self.values.pop(key, None)  # re-insert: the order is the order last set
        self.values[key] = value
        self.setter[key] = who

    def append(self, key: str, value: Any, who: int | str) -> None:
        old = self.values.get(key)
        items = list(old) if isinstance(old, list) else ([] if old is None else [old])
        self.put(key, [*items, value], who)


def parse(argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedLaunch:
    """Read a LightningCLI launch; config files come from ``files`` (path as written → text). A config file not in
    ``files`` is a :class:`RecipeError` naming it."""
    argv = tuple(str(a) for a in argv)
    files = files or {}
    head = split(argv)
    args: list[Arg] = []
    positionals: list[tuple[int, str]] = []
    subcommand: str | None = None
    sub_index: int | None = None
    i = head.args_start
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("-") and not _NUMBER.match(tok) and tok != "-":
            spelling, eq, value = tok.partition("=")
            append = spelling.endswith("+")
            spelling = spelling.rstrip("+")
            if eq:
                args.append(Arg(_key(spelling), spelling, i, i + 1, True, value, append, sub_index is None))
                i += 1
                continue
            takes = spelling not in SWITCHES and i + 1 < len(argv) and \
                (not argv[i + 1].startswith("-") or bool(_NUMBER.match(argv[i + 1])))
            if not takes and spelling not in SWITCHES:
                raise RecipeError(f"{spelling} has no value in `{' '.join(argv)}`: LightningCLI options take one "
                                  f"value each ({spelling} VALUE or {spelling}=VALUE)", ACCEPTED)
            end = i + 2 if takes else i + 1
            args.append(Arg(_key(spelling), spelling, i, end, False, argv[i + 1] if takes else None, append,
                            sub_index is None))
            i = end
        elif sub_index is None and tok in SUBCOMMANDS and not positionals:
            subcommand, sub_index = tok, i
            i += 1
        else:
            positionals.append((i, tok))
            i += 1
    if any(a.spelling in SWITCHES for a in args):
        bad = next(a.spelling for a in args if a.spelling in SWITCHES)
        raise RecipeError(f"the launch passes {bad}, which prints and exits instead of training; remove it", ACCEPTED)
    if subcommand is not None and subcommand != "fit":
        raise RecipeError(f"the launch runs LightningCLI's `{subcommand}` subcommand; attune tunes training: run "
                          "`fit`", ACCEPTED)
    if subcommand is None:
        args = [Arg(a.key, a.spelling, a.start, a.end, a.inline, a.raw, a.append, False) for a in args]
    state = _Settings()
    configs: list[str] = []
    for n, a in enumerate(args):
        if a.key == "config":
            if a.raw is None:
                raise RecipeError(f"{a.spelling} needs a config file", ACCEPTED)
            configs.append(a.raw)
            if a.raw not in files:
                raise RecipeError(f"cannot read the config file {a.raw} the launch names ({a.spelling} {a.raw})")
            data = load_config(a.raw, files[a.raw])
            if a.top and subcommand is not None:
                section = data.get(subcommand) or {}
                if not isinstance(section, Mapping):
                    raise RecipeError(f"the config file {a.raw}: its {subcommand}: section must be a mapping")
                data = dict(section)
            for k, v in flatten(data):
                state.put(k, v, a.raw)
        elif a.top and subcommand is not None:
            raise RecipeError(f"{a.spelling} before the `{subcommand}` subcommand: LightningCLI reads only --config "
                              f"there; move it after `{subcommand}`", ACCEPTED)
        elif a.append:
            state.append(a.key, load_value(a.raw), n)
        else:
            state.put(a.key, load_value(a.raw), n)
    return ParsedLaunch(argv=argv, head=head, subcommand=subcommand, subcommand_index=sub_index, args=tuple(args),
                        positionals=tuple(positionals), configs=tuple(configs), settings=state.values,
                        setter=state.setter)


def _key(spelling: str) -> str:
    return "config" if spelling in CONFIG_FLAGS else norm_key(spelling)


def edit_settings(p: ParsedLaunch, changes: Mapping[str, Any]) -> list[str]:
    """The launch's argument list with ``changes`` (setting name → value) applied: a setting the command line
    decides is edited in place (its spelling and ``=`` form kept); one a config file decides, or that is not set, is
    appended as ``--name value``, which the CLI reads last. Every other token stays where it was."""
    edit = Edit(list(p.argv))
    for key, value in changes.items():
        text = format_value(value)
        arg = p.cli_arg(key)
        if arg is not None and not arg.append:
            tokens = [f"{arg.spelling}={text}"] if arg.inline else [arg.spelling, text]
            edit.replace[arg.start] = (arg.end, tokens)
        else:
            edit.append.extend([f"--{key}", text])
    return edit.result()


__all__ = ["ACCEPTED", "Arg", "ParsedLaunch", "canonical", "edit_settings", "flatten", "format_value", "load_value",
           "norm_key", "parse"]
