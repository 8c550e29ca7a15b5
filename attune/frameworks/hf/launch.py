"""The user's own HuggingFace ``Trainer`` launch, read and edited token by token (no transformers import).

A launch is ``LAUNCHER [launcher options] SCRIPT ARGS``:

- launchers: ``python [-u ...] train.py``, ``torchrun [...] train.py`` (also ``python -m torch.distributed.run``)
  and ``accelerate launch [...] train.py`` (also ``python -m accelerate.commands.launch``); ``-m module`` may
  stand for the script;
- ARGS: ``HfArgumentParser`` flags (``--name value``, ``--name=value``, a bare boolean ``--bf16``, ``--flag
  True``, ``--no_flag`` for booleans that default to true, dashes or underscores), or one ``.json`` /
  ``.yaml`` args file (``parse_json_file`` / ``parse_yaml_file``);
- TRL (:mod:`attune.frameworks.hf.trl`): ``trl sft ARGS`` (the ``trl`` console script with a training command; its
  flags that are not TRL's own are ``accelerate launch`` options, kept as :attr:`ParsedLaunch.launcher_options`),
  or a TRL script (``.../trl/scripts/sft.py``, ``-m trl.scripts.sft``) under any launcher above; ``--config
  FILE.yaml`` among ARGS supplies values a flag overrides.

:func:`parse` splits an argument list into these parts, keeping every token's position, so
:func:`edit_options` can change one flag's value in place (same spelling, ``--x=y`` or ``--x y``) and append
the flags a launch did not have. :func:`rewrite_args_file` does the same inside an args file, keeping its text
wherever a change can be made in place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

import yaml

from attune.errors import RecipeError
from attune.frameworks.cmdline import (
    ACCELERATE_SWITCHES,
    REMOVE,
    TORCHRUN_SWITCHES,
    Edit,
    Option,
    last_option,
    node_count,
    norm,
    process_count,
    scan_flags,
    skip_tokens,
    split_launch,
)
from attune.frameworks.hf import trl

ACCEPTED = ("python [-u] train.py ARGS",
            "torchrun [--standalone] [--nproc_per_node N] train.py ARGS (or python -m torch.distributed.run ...)",
            "accelerate launch [--num_processes N] [...] train.py ARGS",
            "trl sft|dpo|grpo|kto|reward|rloo|distillation [--config sft.yaml] ARGS [accelerate launch options] "
            "(or python -m trl.cli.main sft ...; a TRL script: accelerate launch ... trl/scripts/sft.py ARGS)",
            "ARGS: HfArgumentParser flags (--name value, --name=value, --flag) or one args.json / args.yaml file")

#: boolean TrainingArguments fields that default to true: HfArgumentParser also accepts ``--no_<name>``
NO_FORMS = frozenset({"dataloader_pin_memory", "logging_nan_inf_filter", "log_on_each_node",
                      "average_tokens_across_devices", "eval_do_concat_batches", "dataloader_in_order",
                      "remove_unused_columns", "skip_memory_metrics"})
ARGS_FILE_SUFFIXES = (".json", ".yaml", ".yml")
#: the module behind the ``trl`` console script that runs as ``python -m`` (``trl/cli/main.py``; ``trl.cli`` has no
#: ``__main__``)
TRL_CLI_MODULE = "trl.cli.main"
@dataclass(frozen=True)
class ParsedLaunch:
    argv: tuple[str, ...]
    launcher: str  # python | torchrun | accelerate
    script_index: int  # index of the script token (of ``-m`` when the script is a module)
    script: str  # path, or module name when ``module``
    module: bool
    launcher_options: tuple[Option, ...]
    args_start: int  # index of the script's first argument
    options: tuple[Option, ...]  # the script's flags (empty for an args-file launch)
    positionals: tuple[tuple[int, str], ...] = ()
    args_file: str | None = None
    file_args: dict[str, Any] | None = None  # the args file's mapping (when its text was given)
    launcher_config: dict[str, Any] | None = None  # accelerate's --config_file mapping (when its text was given)
    #: ``<script>.args`` beside the script, which ``HfArgumentParser.parse_args_into_dataclasses`` reads by default
    #: before the command line (when its text was given), and the flags it holds (positions in its own tokens)
    default_args_file: str | None = None
    default_args: tuple[Option, ...] = ()
    #: the TRL training command the launch runs (``sft``, ``dpo``, ...; :mod:`attune.frameworks.hf.trl`), else None
    trl: str | None = None
    #: TRL's ``--config FILE.yaml`` option, its file's TRL settings (when its text was given: values a flag
    #: overrides) and its other keys, which TRL hands to ``accelerate launch``
    trl_config: Option | None = None
    trl_config_settings: dict[str, Any] | None = None
    trl_config_launcher: dict[str, Any] | None = None

    # -- settings ------------------------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The script's native settings as written: ``name → raw`` (last occurrence wins, like argparse).

        Raw values: ``None`` for a bare flag, a string (or list of strings) from the command line, the parsed
        value from an args file. ``--no_<name>`` reads as ``name: False``."""
        if self.file_args is not None:
            return dict(self.file_args)
        out: dict[str, Any] = dict(self.trl_config_settings or {})  # TRL: the config's values, flags override
        no_forms = self.no_forms
        for opt in (*self.default_args, *self.options):  # HF puts the .args file's tokens first
            if opt.name.startswith("no_") and opt.name[3:] in no_forms and not opt.values:
                out[opt.name[3:]] = False
            else:
                out[opt.name] = opt.raw
        return out

    @property
    def no_forms(self) -> frozenset[str]:
        """Boolean settings that also read as ``--no_<name>`` (TRL's configs add their own true booleans)."""
        return NO_FORMS | trl.no_forms(self.trl) if self.trl is not None else NO_FORMS

    def has(self, name: str) -> bool:
        return name in self.settings()

    def launcher_option(self, *names: str) -> Option | None:
        return last_option(self.launcher_options, *names)

    def launcher_switch(self, name: str) -> bool:
        return any(o.name == name for o in self.launcher_options)

    def _configured(self, key: str) -> int | None:
        """A count from the TRL config's accelerate keys, else from the accelerate config file."""
        for source in (self.trl_config_launcher or {}, self.launcher_config or {}):
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
            if isinstance(value, str) and value.isdigit() and int(value) > 0:
                return int(value)
        return None

    @property
    def nproc(self) -> int:
        """Processes per node the launcher starts (torchrun ``--nproc_per_node``, accelerate's and ``trl``'s
        ``--num_processes``)."""
        if self.launcher == "python":
            return 1
        opt = self.launcher_option("nproc_per_node") if self.launcher == "torchrun" \
            else self.launcher_option("num_processes")
        n = process_count(opt)
        return n if n is not None else self._configured("num_processes") or 1

    @property
    def nnodes(self) -> int:
        opt = self.launcher_option("nnodes") if self.launcher == "torchrun" else \
            self.launcher_option("num_machines") if self.launcher in ("accelerate", "trl") else None
        if opt is None or not opt.values:
            return self._configured("num_machines") or 1
        return node_count(opt) or 1

    def launcher_tokens(self) -> list[str]:
        """The launcher part of the argument list without the process-count option (for the contract); for
        ``trl``, the command and the accelerate options among its flags."""
        opt = self.launcher_option("nproc_per_node", "num_processes")
        if self.launcher == "trl":
            kept = [o for o in self.launcher_options if o is not opt]
            return [*self.argv[:self.args_start], *(t for o in kept for t in self.argv[o.start:o.end])]
        return skip_tokens(self.argv, [opt] if opt else [], self.script_index)


# ---------------------------------------------------------------------------------------------- parsing

def parse(argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedLaunch:
    """Split a launch into launcher, script and the script's flags; :class:`RecipeError` naming what is wrong."""
    argv = tuple(str(a) for a in argv)
    if argv and PurePosixPath(argv[0]).name == "trl":
        return _parse_trl(argv, files)
    h = split_launch(argv, {"torchrun": TORCHRUN_SWITCHES, "accelerate": ACCELERATE_SWITCHES}, accepted=ACCEPTED,
                     unknown="attune's hf framework imports a HuggingFace Trainer script started by python, torchrun "
                             "or accelerate launch")
    launcher, launcher_opts, module, script_index, i = h.launcher, list(h.options), h.module, h.script_index, \
        h.args_start - 1
    if launcher == "python" and module and argv[i] == TRL_CLI_MODULE:  # python -m trl.cli.main sft ...
        return _parse_trl(argv, files, at=i + 1)
    start = i + 1
    common: dict[str, Any] = {"argv": argv, "launcher": launcher, "script_index": script_index, "script": argv[i],
                              "module": module, "launcher_options": tuple(launcher_opts), "args_start": start}
    config = next((o for o in reversed(launcher_opts) if o.name == "config_file" and o.values), None)
    if launcher == "accelerate" and config is not None and files is not None and config.values[0] in files:
        try:
            loaded = yaml.safe_load(files[config.values[0]])
        except yaml.YAMLError as err:
            raise RecipeError(f"accelerate config file {config.values[0]} does not parse: {err}") from None
        common["launcher_config"] = loaded if isinstance(loaded, dict) else None
    rest = argv[start:]
    command = trl.command_of(launcher, argv[i], module)
    if command is not None:  # a TRL script: its flags (with --config) as TrlParser reads them, no .args file
        opts, positionals = scan_flags(argv, start)
        return _with_trl_config(ParsedLaunch(**common, options=tuple(opts), positionals=tuple(positionals),
                                             trl=command), files)
    if len(rest) == 1 and not rest[0].startswith("-") and rest[0].lower().endswith(ARGS_FILE_SUFFIXES):
        path = rest[0]
        file_args = load_args_file(path, files[path]) if files is not None and path in files else None
        return ParsedLaunch(**common, options=(), args_file=path, file_args=file_args)
    opts, positionals = scan_flags(argv, start)
    default = None if module else default_args_path(argv[i])
    if files is not None and default is not None and default in files:
        common["default_args_file"] = default
        common["default_args"] = tuple(scan_flags(files[default].split(), 0)[0])
    return ParsedLaunch(**common, options=tuple(opts), positionals=tuple(positionals))


def _parse_trl(argv: tuple[str, ...], files: Mapping[str, str] | None, at: int = 1) -> ParsedLaunch:
    """``trl COMMAND ARGS`` (``COMMAND`` at ``argv[at]``; also ``python -m trl.cli.main COMMAND ARGS``): ARGS's TRL
    fields are the settings, its other options accelerate's (trl 1.16 ``TrainingCommand.run``: what the command's
    ``TrlParser`` does not know goes to ``accelerate launch``)."""
    commands = ", ".join(trl.COMMANDS)
    if len(argv) <= at or argv[at].startswith("-"):
        raise RecipeError(f"`{' '.join(argv)}`: name the TRL training command after trl (one of {commands})",
                          list(ACCEPTED))
    if argv[at] not in trl.COMMANDS:
        raise RecipeError(f"trl {argv[at]}: attune tunes TRL's training commands ({commands}); `trl {argv[at]}` "
                          "does not train", list(ACCEPTED))
    command = argv[at]
    opts, positionals = scan_flags(argv, at + 1)
    own = tuple(o for o in opts if o.name == trl.CONFIG_FLAG or trl.is_field(command, o.name))
    accel = tuple(o for o in opts if o not in own)
    parsed = ParsedLaunch(argv=argv, launcher="trl", script_index=at, script=command, module=False,
                          launcher_options=accel, args_start=at + 1, options=own, positionals=tuple(positionals),
                          trl=command)
    parsed = _with_trl_config(parsed, files)
    config = last_option(parsed.launcher_options, *trl.ACCELERATE_CONFIG_FLAGS)
    if config is not None and config.values:
        name = config.values[0]
        text = (files or {}).get(name)
        loaded: Any = None
        if text is not None:
            try:
                loaded = yaml.safe_load(text)
            except yaml.YAMLError as err:
                raise RecipeError(f"accelerate config file {name} does not parse: {err}") from None
        elif config.name == "accelerate_config" and "/" not in name and not name.endswith((".yaml", ".yml")):
            loaded = trl.packaged_accelerate_config(name)
        if isinstance(loaded, dict):
            parsed = replace(parsed, launcher_config=loaded)
    return parsed


def _with_trl_config(parsed: ParsedLaunch, files: Mapping[str, str] | None) -> ParsedLaunch:
    """``parsed`` with its ``--config`` file read (when ``files`` holds its text): TRL fields are settings, other
    keys accelerate options (``trl`` only; a script run directly ignores them), ``env`` the environment TRL sets."""
    assert parsed.trl is not None
    config_opts = [o for o in parsed.options if o.name == trl.CONFIG_FLAG]
    if not config_opts:
        return parsed
    first = config_opts[0]  # TrlParser takes the first `--config` (args.index), exactly that spelling
    if first.spelling != "--config" or first.inline or len(first.values) != 1:
        raise RecipeError(f"{first.spelling}{'=' if first.inline else ' '}{' '.join(first.values)}: TRL reads its "
                          "config file only as `--config FILE.yaml` (two tokens, that spelling); write it so")
    if len(config_opts) > 1:
        raise RecipeError("the launch gives --config more than once; TRL reads the first and hands the rest to its "
                          "parser, which refuses them: keep one")
    options = tuple(o for o in parsed.options if o is not first)
    path = first.values[0]
    if files is None or path not in files:
        return replace(parsed, options=options, trl_config=first)
    data = trl.load_config(path, files[path])
    command = parsed.trl
    own = {k: v for k, v in data.items() if k != "env" and trl.is_field(command, k)}
    # keys TRL's parser does not know: accelerate options for `trl COMMAND`; ignored by a script run directly
    # (``parse_args_and_config(fail_with_unknown_args=False)`` in ``trl/scripts/<command>.py``)
    other = {k: v for k, v in data.items() if k != "env" and k not in own} if parsed.launcher == "trl" else {}
    return replace(parsed, options=options, trl_config=first, trl_config_settings=own, trl_config_launcher=other)


def default_args_path(script: str) -> str:
    """The args file ``HfArgumentParser`` looks for: the script's path with the suffix ``.args``."""
    return str(PurePosixPath(script).with_suffix(".args"))


# ---------------------------------------------------------------------------------------------- args files

def load_args_file(path: str, text: str) -> dict[str, Any]:
    """The mapping an args file holds (as ``HfArgumentParser.parse_json_file`` / ``parse_yaml_file`` read it)."""
    try:
        data = json.loads(text) if path.lower().endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise RecipeError(f"args file {path} does not parse: {err}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"args file {path} must hold a mapping of argument names to values, "
                          f"got {type(data).__name__}")
    return data


def rewrite_args_file(path: str, text: str, changes: Mapping[str, Any]) -> str:
    """``text`` of args file ``path`` with ``changes`` (name → value, or :data:`REMOVE`) applied.

    Values are replaced in place where each key appears once, so the rest of the file (comments, order,
    layout) is kept; otherwise the mapping is written out again. Unchanged content gives ``text`` itself."""
    data = load_args_file(path, text)
    new = dict(data)
    for key, value in changes.items():
        if value is REMOVE:
            new.pop(key, None)
        else:
            new[key] = value
    if new == data:
        return text
    is_json = path.lower().endswith(".json")
    out = text
    in_place = True
    for key, value in changes.items():
        if value is REMOVE:
            if key in data:
                in_place = False
            continue
        if key in data and data[key] == value:
            continue
        scalar = json.dumps(value)  # a JSON scalar is also YAML
        if is_json:
            pattern = re.compile(r'("' + re.escape(key) + r'"\s*:\s*)("(?:[^"\\]|\\.)*"|[^,\s}\]]+)')
        else:
            pattern = re.compile(r"^(" + re.escape(key) + r"\s*:[ \t]*)([^#\n]*?)([ \t]*(#.*)?)$", re.MULTILINE)
        if key in data:
            matches = pattern.findall(out)
            if len(matches) != 1:
                in_place = False
                continue
            def _replace(m: re.Match[str], s: str = scalar) -> str:
                return m.group(1) + s + (m.group(3) if not is_json and m.group(3) else "")
            out = pattern.sub(_replace, out, count=1)
        elif not is_json:
            out = out + ("" if out.endswith("\n") or not out else "\n") + f"{key}: {scalar}\n"
        else:
            in_place = False
    if in_place:
        try:
            if load_args_file(path, out) == new:
                return out
        except RecipeError:
            pass
    if is_json:
        return json.dumps(new, indent=2) + "\n"
    return str(yaml.safe_dump(new, sort_keys=False))


# ---------------------------------------------------------------------------------------------- editing

def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def edit_options(edit: Edit, options: Sequence[Option], changes: Mapping[str, Any], *,
                 aliases: Mapping[str, Sequence[str]] | None = None, no_forms: frozenset[str] = NO_FORMS) -> None:
    """Set script flags: ``changes`` maps a flag name to its new value (or :data:`REMOVE`).

    A flag the launch has keeps its position and spelling (the last occurrence, which argparse uses, is
    edited); one it lacks is appended as ``--name value``; ``aliases`` lists other names of the same setting
    (e.g. ``gradient_checkpointing`` for ``activation_checkpointing``), every present one is edited."""
    aliases = aliases or {}
    multi_word = [o for o in options if "_" in o.name]
    dashed = bool(multi_word) and all(o.dashed for o in multi_word)  # the launch writes --flag-name
    for name, value in changes.items():
        names = (name, *aliases.get(name, ()))
        found = False
        for n in names:
            occ = [o for o in options if o.name == n or (o.name == f"no_{n}" and n in no_forms)]
            if not occ:
                continue
            found = True
            last = occ[-1]
            if value is REMOVE:
                for o in occ:
                    edit.replace[o.start] = (o.end, [])
                continue
            if last.name != n:  # --no_flag → --flag VALUE, same dash style
                spelling = "--" + (n.replace("_", "-") if last.dashed else n)
                edit.replace[last.start] = (last.end, [spelling, format_value(value)])
            elif last.inline:
                edit.replace[last.start] = (last.end, [f"{last.spelling}={format_value(value)}"])
            else:
                edit.replace[last.start] = (last.end, [last.spelling, format_value(value)])
        if not found and value is not REMOVE:
            spelling = "--" + (name.replace("_", "-") if dashed else name)
            edit.append.extend([spelling, format_value(value)])


__all__ = ["ACCEPTED", "ARGS_FILE_SUFFIXES", "NO_FORMS", "REMOVE", "Edit", "Option", "ParsedLaunch",
           "default_args_path", "edit_options", "format_value", "load_args_file", "norm", "parse", "rewrite_args_file"]
