"""YAML-configured front ends over the HF ``Trainer`` (LLaMA-Factory, axolotl): what the two framework packages share.

Both tools take one YAML file of settings (``llamafactory-cli train cfg.yaml``, ``axolotl train cfg.yml``), let the
command line override single keys, and hand the result to a HF ``Trainer``. So their recipes look the same to attune:

- the recipe carries the user's launch verbatim, the YAML's text in ``launch.files`` (path as the command names it),
  and the knobs as the launch has them (file value, command-line override applied the tool's way);
- :func:`rewrite_yaml` changes only the lines of the keys that change (comments, order and every other line kept:
  an unchanged recipe renders the user's file byte for byte); a key the command line overrides is changed in its
  override token instead, since the command line wins in both tools;
- every key of the file (and every override) is contract (the tool's defaults where absent: the tool package lists
  them) or frozen verbatim; the per-device batch, the accumulation and the process count are knobs, the accumulation
  derived so the global batch (per-device × accumulation × processes) stays;
- trials run a copy of the YAML in the trial directory with logging instrumentation that changes nothing learned,
  ended by attune after the request's steps (:class:`YamlTrainerFramework.trial_launch`);
- the output is the HF Trainer's per-step dicts (:class:`~attune.frameworks.hf.logs.HFLogParser`) behind the tool's
  own log prefixes (:class:`YamlTrainerLogParser`).

The tool packages (:mod:`attune.frameworks.llamafactory`, :mod:`attune.frameworks.axolotl`) say how their command
lines read (:meth:`YamlTrainerFramework.parse`), which keys are knobs and contract, and how the process count is set.
Nothing here imports either tool, transformers or torch.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from attune.errors import RecipeError
from attune.frameworks.base import ContractField, Framework, Launch, LogParser, Signature, TrialLaunch
from attune.frameworks.cmdline import REMOVE, Edit
from attune.frameworks.common import micro_batch_layouts, recordable_env, same_value
from attune.frameworks.hf.logs import HF_SIGNATURES, HFLogParser
from attune.trial import FailureKind

if TYPE_CHECKING:
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import Recipe
    from attune.trial import TrialRequest

__all__ = ["REMOVE", "ConfigLaunch", "Override", "Settings", "YamlTrainerFramework", "YamlTrainerLogParser",
           "format_scalar", "head_process_count", "head_process_edit", "load_yaml", "omegaconf_loader",
           "rewrite_yaml"]


# ------------------------------------------------------------------------------------------------ YAML text

def omegaconf_loader() -> type[yaml.SafeLoader]:
    """PyYAML's safe loader as OmegaConf 2.3 reads YAML (``omegaconf/_utils.py`` ``get_yaml_loader``, what
    LLaMA-Factory's ``read_args`` uses): ``1e-4`` is a float (YAML 1.1 wants ``1.0e-4``), timestamps stay strings."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
                                      for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                       |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                       |\.[0-9_]+(?:[eE][-+][0-9]+)?
                       |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
                       |[-+]?\.(?:inf|Inf|INF)
                       |\.(?:nan|NaN|NAN))$""", re.X),
        list("-+0123456789."))
    return Loader


def load_yaml(path: str, text: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> dict[str, Any]:
    """The mapping a YAML config holds; :class:`RecipeError` naming the file when it is no mapping."""
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise RecipeError(f"the config file {path} does not parse as YAML: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise RecipeError(f"the config file {path} must hold a mapping of setting names to values, got "
                          f"{type(data).__name__}")
    return data


def format_scalar(value: Any, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> str:
    """A scalar as YAML text that ``loader`` reads back as the same value (``1.0e-05``, not ``1e-05``, which
    YAML 1.1 reads as a string; strings quoted only where a plain scalar would read otherwise)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:
            text = f"{mantissa}.0e{exponent}"
        return text
    text = str(value)
    try:
        plain_ok = yaml.load(text, Loader=loader) == text and "#" not in text and ": " not in text  # noqa: S506
    except yaml.YAMLError:
        plain_ok = False
    return text if plain_ok and text.strip() == text and text else json.dumps(text)


_TOP_KEY = re.compile(r"^([A-Za-z_][\w.\-]*)\s*:(?:\s|$)")


def _key_spans(lines: list[str]) -> dict[str, list[tuple[int, int]]]:
    """Top-level keys → the line ranges ``[start, end)`` their entries span (a block value's indented lines and
    ``- item`` lines belong to the key above them)."""
    spans: dict[str, list[tuple[int, int]]] = {}
    current: tuple[str, int] | None = None
    for i, line in enumerate(lines):
        m = _TOP_KEY.match(line)
        if m is not None:
            if current is not None:
                spans.setdefault(current[0], []).append((current[1], i))
            current = (m.group(1), i)
        elif current is not None and line.strip() and not line.startswith((" ", "\t", "-")):
            spans.setdefault(current[0], []).append((current[1], i))  # a top-level comment or document marker
            current = None
    if current is not None:
        spans.setdefault(current[0], []).append((current[1], len(lines)))
    return spans


def rewrite_yaml(path: str, text: str, changes: Mapping[str, Any],
                 loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> str:
    """``text`` of YAML config ``path`` with top-level ``changes`` (key → value, or :data:`REMOVE`) applied.

    Each changed key's own line is rewritten (a trailing comment kept; a block value replaced by the inline scalar),
    a removed key's lines dropped, a new key appended; every other byte stays. The result is read back and must hold
    exactly the expected mapping; where the in-place edit cannot give it (a key written twice, flow style, anchors) the
    mapping is written out again (comments then lost). Unchanged content gives ``text`` itself."""
    data = load_yaml(path, text, loader)
    new = dict(data)
    for key, value in changes.items():
        if value is REMOVE:
            new.pop(key, None)
        else:
            new[key] = value
    if _same_mapping(new, data):
        return text
    lines = text.splitlines(keepends=True)
    spans = _key_spans(lines)
    replace: dict[int, tuple[int, list[str]]] = {}
    appended: list[str] = []
    in_place = True
    for key, value in changes.items():
        if key in data and value is not REMOVE and _same_value(data[key], value):
            continue
        where = spans.get(key, [])
        if len(where) > 1 or (key in data) != bool(where):
            in_place = False
            break
        if value is REMOVE:
            if where:
                replace[where[0][0]] = (where[0][1], [])
            continue
        if not where:
            appended.append(f"{key}: {format_scalar(value, loader)}\n")
            continue
        start, end = where[0]
        first = lines[start]
        body = first.rstrip("\r\n")
        newline = first[len(body):] or "\n"
        m = re.match(r"^(" + re.escape(key) + r"\s*:[ \t]*)(.*?)([ \t]+#.*)?$", body)
        if m is None:
            in_place = False
            break
        comment = m.group(3) or ""
        prefix = m.group(1) if m.group(1).endswith((" ", "\t")) else m.group(1) + " "
        stop = start + 1
        while stop < end and lines[stop].strip() and lines[stop].startswith((" ", "\t", "-")):
            stop += 1  # the lines of a block value
        replace[start] = (stop, [f"{prefix}{format_scalar(value, loader)}{comment}{newline}"])
    if in_place:
        out: list[str] = []
        i = 0
        while i < len(lines):
            if i in replace:
                end, new_lines = replace[i]
                out.extend(new_lines)
                i = end
                continue
            out.append(lines[i])
            i += 1
        if appended and out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        result = "".join(out + appended)
        try:
            if _same_mapping(load_yaml(path, result, loader), new):
                return result
        except RecipeError:
            pass
    return str(yaml.safe_dump(new, sort_keys=False))


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return same_value(a, b) if not isinstance(a, (dict, list)) else bool(a == b)


def _same_mapping(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return set(a) == set(b) and all(_same_value(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------ launches

@dataclass(frozen=True)
class Override:
    """One command-line override of a config key: ``argv[start:end]`` are its tokens, ``value`` what the tool makes
    of them, ``write(value)`` the tokens that set another value in the same spelling."""

    key: str
    start: int
    end: int
    value: Any
    write: Callable[[Any], list[str]] = field(compare=False, repr=False)


@dataclass(frozen=True)
class ConfigLaunch:
    """A launch read the tool's way: the launcher (frozen, without the process count), the config path's token,
    the command-line overrides, and the process count where the launch states it."""

    argv: tuple[str, ...]
    launcher: str  # the tool's own CLI, torchrun, accelerate or python
    launcher_tokens: tuple[str, ...]  # the launch without the config, its overrides and the process count
    config_index: int
    overrides: tuple[Override, ...] = ()
    nproc: int | None = None  # None: the launch does not say (the tool's default applies)
    nnodes: int = 1
    process_env: tuple[str, ...] = ()  # environment variables that set the process count (LLaMA-Factory's)

    @property
    def config_path(self) -> str:
        return self.argv[self.config_index]

    def override(self, key: str) -> Override | None:
        found = [o for o in self.overrides if o.key == key]
        return found[-1] if found else None


@dataclass(frozen=True)
class Settings:
    """What a recipe's launch says: the config file's mapping, the mapping the tool trains with (overrides applied),
    the process layout and the batch split."""

    launch: ConfigLaunch
    data: dict[str, Any]
    effective: dict[str, Any]
    nproc: int
    nnodes: int
    per_device: int
    accumulation: int

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def global_batch(self) -> int:
        return self.per_device * self.accumulation * self.world


# ------------------------------------------------------------------------------------------------ logs

#: a logging prefix before the message: transformers' explicit format (which LLaMA-Factory turns on:
#: ``[INFO|trainer.py:2081] 2024-06-11 11:55:22,961 >> ``), LLaMA-Factory's own (``[INFO|2024-12-08 01:09:59]
#: llamafactory.train.callbacks:157 >> ``), axolotl's (``[2024-07-26 04:39:42,866] [INFO] [axolotl.x:185] [PID:1]
#: [RANK:0] ``) and torchrun's ``[rank0]:``
_PREFIX = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?:\[(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\|[^\]]*\][^>]*>>\s?"
                     r"|(?:\[[^\]]*\]\s*){2,}(?=\S))")


class YamlTrainerLogParser(HFLogParser):
    """HF Trainer output behind a YAML front end's log prefixes.

    - a tool's own echo of a step's numbers (``echo``: LLaMA-Factory's ``llamafactory.train.callbacks`` line
      ``{'loss': 0.0000, 'learning_rate': 4.9985e-05, 'epoch': 0.03}``, printed next to HF's dict in the web UI mode
      and by 0.9.1) is not a step of its own;
    - the Trainer's start-up lines are read behind the logging prefix the tool sets;
    - a non-finite ``grad_norm`` is a diverged run (the tools' users meet NaN as ``'loss': 0.0, 'grad_norm': nan``,
      the loss printed as 0) unless the run uses fp16, whose dynamic loss scaling skips such steps by design.
    """

    echo: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, global_batch: int, tokens_per_sample: int | None = None, t0: float | None = None,
                 fp16: bool = False, signatures: Sequence[Signature] = ()) -> None:
        super().__init__(global_batch=global_batch, tokens_per_sample=tokens_per_sample, t0=t0)
        self.fp16 = fp16
        self.signatures = (*HF_SIGNATURES, *signatures)

    def parse_line(self, line: str, t: float) -> None:
        if any(e in line for e in self.echo):
            return
        stripped = _PREFIX.sub("", line, count=1)
        before = len(self.steps)
        super().parse_line(stripped, t)
        if len(self.steps) > before and not self.fp16 and "diverged" not in self._error_kinds:
            grad = self.steps[-1].get("grad_norm")
            if grad is not None and not math.isfinite(grad):
                self._error_kinds.add("diverged")
                self.errors.append({"kind": FailureKind.DIVERGED,
                                    "message": f"grad_norm became {grad} at step {self.steps[-1]['step']} (loss "
                                               f"{self.steps[-1]['loss']})"})


# ------------------------------------------------------------------------------------------------ the framework

class YamlTrainerFramework(Framework):
    """A YAML-configured HF Trainer front end. Subclasses set the keys and implement :meth:`parse`,
    :meth:`process_edit` and :meth:`build_catalogue`."""

    launch_based = True
    backends = ("local",)
    #: the tool as messages name it
    tool: ClassVar[str] = ""
    #: the config keys of the per-device batch and the accumulation, with the tool's defaults
    per_device_key: ClassVar[str] = ""
    per_device_default: ClassVar[int] = 1
    accumulation_key: ClassVar[str] = "gradient_accumulation_steps"
    #: knob name of the process count (set on the launcher, not in the file)
    nproc_knob: ClassVar[str] = "nproc_per_node"
    #: knobs that are config keys (knob name = key), with the value an absent key means
    key_knobs: ClassVar[dict[str, Any]] = {}
    #: contract keys with the tool's defaults (the value an absent key means)
    contract_keys: ClassVar[dict[str, Any]] = {}
    #: keys every trial sets (logging, no saves, no trackers): instrumentation only
    trial_keys: ClassVar[dict[str, Any]] = {}
    #: where a trial writes the tool's output (the config key)
    output_key: ClassVar[str] = "output_dir"
    env_prefixes: ClassVar[tuple[str, ...]] = ("NCCL_", "TORCH_NCCL_", "ACCELERATE_", "PET_")
    env_names: ClassVar[tuple[str, ...]] = ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF")
    #: the YAML loader the tool reads its config with
    loader: ClassVar[type[yaml.SafeLoader]] = yaml.SafeLoader
    accepted: ClassVar[tuple[str, ...]] = ()
    log_signatures: ClassVar[tuple[Signature, ...]] = ()
    parser_class: ClassVar[type[YamlTrainerLogParser]] = YamlTrainerLogParser

    # -- what the tool package provides ------------------------------------------------------------------
    def parse(self, argv: Sequence[str], data: Mapping[str, Any] | None = None) -> ConfigLaunch:
        """The launch read the tool's way (``data``: the config file's mapping, which guides override types)."""
        raise NotImplementedError

    def process_count(self, launch: ConfigLaunch, env: Mapping[str, str], *, accelerator: str,
                      devices_per_node: int | None) -> int:
        """Processes per node the launch starts (its own statement, else the tool's default)."""
        return launch.nproc or 1

    def process_edit(self, launch: ConfigLaunch, edit: Edit, env: dict[str, str], nproc: int, *, cpu: bool) -> None:
        """Set the process count to ``nproc`` in the launch's tokens (``edit``) or environment (``env``)."""
        raise NotImplementedError

    def resolve(self, effective: dict[str, Any]) -> dict[str, Any]:
        """The contract values the tool derives from others (e.g. LLaMA-Factory's ``packing`` default), in place."""
        return effective

    def build_catalogue(self) -> Catalogue:
        raise NotImplementedError

    # -- reading ---------------------------------------------------------------------------------------------
    def catalogue(self) -> Catalogue:
        return self.build_catalogue()

    def read(self, recipe: Recipe) -> Settings:
        """The settings of ``recipe``'s launch (:class:`RecipeError` when it does not read)."""
        if recipe.launch is None:
            raise RecipeError(f"framework: {self.name} recipes carry the user's launch (launch.argv and the config "
                              "file's text in launch.files); import one with `attune import`")
        return self.read_launch(recipe.launch.argv, recipe.launch.files, recipe.launch.env,
                                accelerator=recipe.resources.accelerator,
                                devices_per_node=recipe.resources.devices_per_node)

    def read_launch(self, argv: Sequence[str], files: Mapping[str, str], env: Mapping[str, str], *,
                    accelerator: str, devices_per_node: int | None) -> Settings:
        launch = self.parse(argv)
        path = launch.config_path
        if path not in files:
            raise RecipeError(f"launch.files: the launch reads {path}, whose text the recipe does not carry; "
                              f"re-import the launch (attune import --framework {self.name}) so it is read")
        data = load_yaml(path, files[path], self.loader)
        launch = self.parse(argv, data)
        effective = self.apply_overrides(data, launch)
        nproc = self.process_count(launch, env, accelerator=accelerator, devices_per_node=devices_per_node)
        per_device = self._int(effective, self.per_device_key, self.per_device_default)
        accumulation = self.accumulation(effective, per_device)
        return Settings(launch=launch, data=data, effective=effective, nproc=nproc, nnodes=launch.nnodes,
                        per_device=per_device, accumulation=accumulation)

    def apply_overrides(self, data: Mapping[str, Any], launch: ConfigLaunch) -> dict[str, Any]:
        """The mapping the tool trains with: the file's, each override setting its key (the last one wins)."""
        out = dict(data)
        for o in launch.overrides:
            out[o.key] = o.value
        return out

    def accumulation(self, effective: Mapping[str, Any], per_device: int) -> int:
        return self._int(effective, self.accumulation_key, 1)

    def _int(self, effective: Mapping[str, Any], key: str, default: int) -> int:
        value = effective.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise RecipeError(f"{key}: {value!r} is no whole number; write it as one in the config file")
        try:
            number_ = float(value)
        except ValueError:
            raise RecipeError(f"{key}: {value!r} is no whole number; write it as one in the config file") from None
        if number_ != int(number_) or number_ < 1:
            raise RecipeError(f"{key}: {value!r} must be a whole number of at least 1")
        return int(number_)

    def knob_values(self, s: Settings) -> dict[str, Any]:
        out: dict[str, Any] = {self.per_device_key: s.per_device, self.nproc_knob: s.nproc}
        for knob, default in self.key_knobs.items():
            value = s.effective.get(knob, default)
            out[knob] = default if value is None else value
        return out

    # -- import ----------------------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The user's launch → a recipe mapping: argv verbatim, the config file's text, the installed tool's
        version, and every knob's value as the launch has it (file value, command-line override applied).

        ``options``: ``tokens_per_sample``, ``devices_per_node``, ``accelerator`` (default ``cpu``), ``name``,
        ``framework_version``."""
        from attune.frameworks.discover import installed_version

        options = dict(options or {})
        env = dict(env or {})
        argv = [str(a) for a in argv]
        launch = self.parse(argv)
        path = launch.config_path
        full = Path(path) if Path(path).is_absolute() else Path(cwd) / path
        try:
            text = full.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise RecipeError(f"cannot read the {self.tool} config {path} (in {cwd}): "
                              f"{getattr(err, 'strerror', None) or err}") from None
        files = {path: text}
        kept_env = recordable_env(env, self.env_prefixes, self.env_names)
        accelerator = options.get("accelerator") or "cpu"
        dpn = options.get("devices_per_node")
        s = self.read_launch(argv, files, kept_env, accelerator=accelerator,
                             devices_per_node=int(dpn) if dpn else None)
        knobs = self.knob_values(s)
        catalogue = self.catalogue()
        problems = [f"knobs.{k}: the launch has {v!r}, outside the {self.name} catalogue's domain "
                    f"({', '.join(map(repr, catalogue[k].values))}); change it in your "
                    f"{'command' if k == self.nproc_knob else 'config file'} to one of those values before importing"
                    for k, v in knobs.items() if catalogue[k].check_value(v)]
        if problems:
            raise RecipeError(f"cannot import `{' '.join(argv)}`:", problems)
        version = options.get("framework_version") or (installed_version(self.distribution)
                                                        if self.distribution else None)
        name = options.get("name") or f"{Path(str(cwd)).name or self.name}-{Path(path).stem}".strip("-")
        return {
            "name": name,
            "framework": self.name,
            "launch": {"argv": argv, "env": kept_env, "cwd": str(cwd), "files": files,
                       "framework_version": version, "tokens_per_sample": options.get("tokens_per_sample")},
            "resources": {"accelerator": accelerator, "devices_per_node": int(dpn or s.nproc), "nodes": s.nnodes},
            "knobs": knobs,
        }

    # -- contract --------------------------------------------------------------------------------------------
    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        """Contract keys (the tool's defaults where absent, derived defaults resolved), the derived global batch,
        and every other key of the config and the command line frozen verbatim, with the launcher and
        environment."""
        try:
            s = self.read(recipe)
        except RecipeError:
            return {}  # check() reports why
        out: dict[str, ContractField] = {}
        resolved = self.resolve(dict(s.effective))
        for key, default in self.contract_keys.items():
            value = resolved.get(key, default)
            out[f"{self.name}.{key}"] = ContractField(
                default if value is None and key not in s.effective else value, "contract",
                fix=f"{key} is the config's own setting ({self.tool} default {default!r} where it is not given); "
                    "attune never changes it")
        pd, nproc = int(recipe.knob(self.per_device_key)), int(recipe.knob(self.nproc_knob))
        acc = self.derived_accumulation(s, pd, nproc)
        out[f"{self.name}.global_batch_size"] = ContractField(
            pd * acc * nproc * s.nnodes, "derived",
            depends_on=(f"knobs.{self.per_device_key}", f"knobs.{self.nproc_knob}", "launch.argv", "launch.files"),
            fix=f"The global batch ({self.per_device_key} × {self.accumulation_key} × processes) must stay "
                f"{s.global_batch}: pick {self.per_device_key} and {self.nproc_knob} whose product divides it (the "
                f"accumulation is derived), and keep the config's own {self.per_device_key} / {self.accumulation_key}")
        frozen_fix = f"attune only changes the knob-controlled keys of a {self.tool} config"
        controlled = {self.per_device_key, self.accumulation_key, *self.key_knobs, *self.batch_keys()}
        frozen = sorted(k for k in s.effective if k not in controlled and k not in self.contract_keys)
        out[f"{self.name}.keys"] = ContractField(frozen, "frozen", fix="the config's other keys (names) must stay as "
                                                 "they are; " + frozen_fix)
        for k in frozen:
            out[f"{self.name}.{k}"] = ContractField(s.effective[k], "frozen", fix=frozen_fix)
        out["launch.launcher"] = ContractField(list(s.launch.launcher_tokens), "frozen", fix=frozen_fix)
        out["launch.config"] = ContractField(s.launch.config_path, "frozen", fix=frozen_fix)
        assert recipe.launch is not None
        env = {k: v for k, v in recipe.launch.env.items() if k not in s.launch.process_env}
        out["launch.env"] = ContractField(dict(sorted(env.items())), "frozen", fix=frozen_fix)
        out["launch.cwd"] = ContractField(recipe.launch.cwd, "frozen", fix=frozen_fix)
        return out

    def settings_or_none(self, r: Recipe) -> Settings | None:
        """The recipe's settings, or None where its launch cannot be read (:meth:`check` reports why; constraints
        stay quiet)."""
        try:
            return self.read(r)
        except Exception:  # noqa: BLE001 - reported by Framework.check
            return None

    def batch_divisible_problem(self, r: Recipe) -> str | None:
        """The constraint that keeps the global batch: per-device batch × processes must divide it, so the
        accumulation can be derived."""
        s = self.settings_or_none(r)
        if s is None:
            return None
        knob = self.per_device_key
        pd, world = int(r.knob(knob)), int(r.knob(self.nproc_knob)) * s.nnodes
        if s.global_batch % (pd * world) == 0:
            return None
        legal = [m for m in r.catalogue[knob].values if isinstance(m, int) and s.global_batch % (m * world) == 0]
        return (f"the config's global batch ({s.global_batch} = {s.per_device} {knob} × {s.accumulation} "
                f"{self.accumulation_key} × {s.world} processes) must be divisible by {knob} ({pd}) × processes "
                f"({world}) so {self.accumulation_key} can keep it; legal {knob} here: {legal}")

    def batch_keys(self) -> tuple[str, ...]:
        """Other keys the batch split controls (axolotl's ``batch_size``)."""
        return ()

    def derived_accumulation(self, s: Settings, per_device: int, nproc: int) -> int:
        """Accumulation that keeps the launch's global batch (rounded down where it does not divide: the
        constraint and the contract then refuse the layout)."""
        return max(1, s.global_batch // (per_device * nproc * s.nnodes))

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        if recipe.launch is None or recipe.launch.tokens_per_sample is None:
            return None
        try:
            return self.read(recipe).global_batch * recipe.launch.tokens_per_sample
        except RecipeError:
            return None

    def equivalent_layouts(self, recipe: Recipe, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
        return micro_batch_layouts(recipe, self.per_device_key, avoid=avoid)

    def check(self, recipe: Recipe) -> list[str]:
        try:
            self.read(recipe)
        except RecipeError as err:
            text = str(err)
            return [text if text.startswith("launch") else f"launch.argv: {text}"]
        return []

    # -- render ----------------------------------------------------------------------------------------------
    def changes(self, recipe: Recipe, s: Settings) -> dict[str, Any]:
        """Config keys the recipe's knobs change (the accumulation re-derived), as key → new value."""
        knobs: dict[str, Any] = dict(recipe.effective_knobs)
        own = self.knob_values(s)
        out: dict[str, Any] = {}
        for knob in self.key_knobs:
            if not same_value(knobs[knob], own[knob]):
                out[knob] = knobs[knob]
        pd, nproc = int(knobs[self.per_device_key]), int(knobs[self.nproc_knob])
        if pd != s.per_device or nproc != s.nproc:
            world = pd * nproc * s.nnodes
            if s.global_batch % world:
                raise RecipeError(f"{self.per_device_key} {pd} × {nproc} processes × {s.nnodes} nodes does not divide "
                                  f"the launch's global batch {s.global_batch}")
            if pd != s.per_device:
                out[self.per_device_key] = pd
            out.update(self.batch_changes(s, pd, nproc))
        return out

    def batch_changes(self, s: Settings, per_device: int, nproc: int) -> dict[str, Any]:
        acc = self.derived_accumulation(s, per_device, nproc)
        return {self.accumulation_key: acc} if acc != s.accumulation else {}

    def render_launch(self, recipe: Recipe, *, instrumentation: Mapping[str, Any] | None = None,
                      trial_dir: Path | None = None) -> Launch:
        """The recipe's launch with its knobs applied (and ``instrumentation`` keys set): a key the command line
        overrides is changed in its override token, any other in the config's text; with ``trial_dir`` the config
        is written there and the command points at the copy, so a trial never touches the user's file."""
        s = self.read(recipe)
        assert recipe.launch is not None
        changes = {**self.changes(recipe, s), **dict(instrumentation or {})}
        edit = Edit(list(s.launch.argv))
        to_file: dict[str, Any] = {}
        for key, value in changes.items():
            o = s.launch.override(key)
            if o is None:
                to_file[key] = value
            elif value is REMOVE:
                for occ in (x for x in s.launch.overrides if x.key == key):
                    edit.replace[occ.start] = (occ.end, [])
            else:
                edit.replace[o.start] = (o.end, o.write(value))
        path = s.launch.config_path
        files = dict(recipe.launch.files)
        files[path] = rewrite_yaml(path, files[path], to_file, self.loader)
        env = dict(recipe.launch.env)
        nproc = int(recipe.knob(self.nproc_knob))
        if nproc != s.nproc:
            self.process_edit(s.launch, edit, env, nproc, cpu=recipe.resources.accelerator == "cpu")
        argv = edit.result()
        if trial_dir is not None:
            copy = str(trial_dir / f"{self.name}-config" / Path(path).name)
            argv = [copy if i == s.launch.config_index and tok == path else tok for i, tok in enumerate(argv)]
            files = {copy if name == path else name: text for name, text in files.items()}
        return Launch(argv=tuple(argv), env=env, files=files, cwd=recipe.launch.cwd)

    def set_native(self, recipe_data: dict[str, Any], name: str, value: Any) -> bool:
        """``--set cutoff_len=4096``: set a config key that is no knob, in the tool's own name: in its command-line
        override where the command has one (that wins over the file), else in the config file's text; the gate then
        judges the change. False for a knob's name, or a launch that cannot be read."""
        launch = recipe_data.get("launch")
        if not isinstance(launch, dict) or name in self.catalogue().knobs:
            return False
        argv = [str(a) for a in launch.get("argv") or []]
        files = dict(launch.get("files") or {})
        try:
            first = self.parse(argv)
            data = load_yaml(first.config_path, files[first.config_path], self.loader)
            parsed = self.parse(argv, data)
        except (RecipeError, KeyError):
            return False
        o = parsed.override(name)
        if o is not None and value is not None:
            edit = Edit(argv)
            edit.replace[o.start] = (o.end, o.write(value))
            launch["argv"] = edit.result()
            return True
        path = parsed.config_path
        files[path] = rewrite_yaml(path, files[path], {name: REMOVE if value is None else value}, self.loader)
        launch["files"] = files
        return True

    def render(self, recipe: Recipe) -> Launch:
        """The user's launch with only the knob-controlled keys changed (an unchanged recipe: argv and file as
        imported)."""
        return self.render_launch(recipe)

    def trial_instrumentation(self, s: Settings, trial_dir: Path) -> dict[str, Any]:
        return {**self.trial_keys, self.output_key: str(trial_dir / f"{self.name}-output")}

    def trial_env(self) -> dict[str, str]:
        return {"PYTHONUNBUFFERED": "1"}

    def trial_launch(self, recipe: Recipe, request: TrialRequest, trial_dir: Path, *, python: str = sys.executable,
                     metrics_port: int | None = None) -> TrialLaunch:
        """``render`` plus logging instrumentation in a copy of the config under the trial directory, ended by
        attune after ``request.steps`` logged steps (the config's ``max_steps`` stays: it sets the schedule)."""
        s = self.read(recipe)
        keys = self.trial_instrumentation(s, trial_dir)
        launch = self.render_launch(recipe, instrumentation=keys, trial_dir=trial_dir)
        notes = [f"{k}: {'(removed)' if v is REMOVE else format_scalar(v, self.loader)}" for k, v in keys.items()]
        notes.append(f"(in a copy of {s.launch.config_path} under the trial directory)")
        env = {**launch.env, **self.trial_env()}
        return TrialLaunch(Launch(argv=launch.argv, env=env, files=launch.files, cwd=launch.cwd),
                           stop_after_steps=request.steps, instrumentation=tuple(notes))

    # -- logs ------------------------------------------------------------------------------------------------
    def loss_resolution(self, recipe: Recipe, loss: float, reported: Mapping[str, Any] | None = None) -> float | None:
        """Half the last printed unit of a loss: trials read the Trainer's printed dicts, which transformers 5 rounds
        to four significant digits and 4.x to four decimals; the tool's environment may hold either (LLaMA-Factory
        0.9.5 allows transformers 4.55-5.6, axolotl 0.19.0 pins 5.16.1), so the coarser of the two."""
        if not loss or not math.isfinite(loss):
            return 0.5e-4
        return max(0.5 * 10 ** (math.floor(math.log10(abs(loss))) - 3), 0.5e-4)

    def parser(self, recipe: Recipe) -> LogParser:
        try:
            s = self.read(recipe)
            gbs, fp16 = s.global_batch, bool(s.effective.get("fp16") is True or s.effective.get("float16") is True)
        except RecipeError:
            gbs, fp16 = 1, False
        return self.parser_class(global_batch=gbs, fp16=fp16, signatures=self.log_signatures,
                                 tokens_per_sample=recipe.launch.tokens_per_sample if recipe.launch else None)

    def report_problems(self, recipe: Recipe, reported: Mapping[str, Any]) -> list[str]:
        """The Trainer's own batch layout (its start-up lines) against what attune read from the config."""
        from attune.frameworks.base import reported_mismatches

        try:
            s = self.read(recipe)
        except RecipeError:
            return []
        pd, nproc = int(recipe.knob(self.per_device_key)), int(recipe.knob(self.nproc_knob))
        expected = {"per_device_train_batch_size": pd,
                    "gradient_accumulation_steps": self.derived_accumulation(s, pd, nproc),
                    "total_train_batch_size": s.global_batch}
        return reported_mismatches(f"{self.tool}'s Trainer", expected, reported, spaced=True)


# ------------------------------------------------------------------------------------------------ launchers

def head_process_edit(edit: Edit, head: Any, nproc: int, *, cpu: bool, env: dict[str, str]) -> None:
    """Set a ``torchrun`` / ``accelerate launch`` / ``python`` head's process count (a
    :class:`~attune.frameworks.cmdline.LaunchHead`): its own option edited in place (else added before the script, or
    before a launcher's ``-m`` switch); a ``python`` launch with several processes becomes ``python -m
    torch.distributed.run --standalone --nproc_per_node N``. On CPU, several accelerate processes need its multi-GPU
    (torchrun-based) launcher and ``ACCELERATE_USE_CPU`` (as :mod:`attune.frameworks.hf` renders them)."""
    if head.launcher == "python":
        edit.insert.setdefault(head.script_index, []).extend(
            ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)])
    else:
        names = ("nproc_per_node",) if head.launcher == "torchrun" else ("num_processes",)
        opt = next((o for o in reversed(head.options) if o.name.replace("-", "_") in names), None)
        switch = next((o for o in head.options if o.name in ("m", "module")), None)
        at = switch.start if switch is not None else head.script_index
        if opt is not None:
            edit.replace[opt.start] = (opt.end, [f"{opt.spelling}={nproc}"] if opt.inline else [opt.spelling, str(nproc)])
        else:
            edit.insert.setdefault(at, []).extend([f"--{names[0]}", str(nproc)])
        if head.launcher == "accelerate" and cpu and nproc > 1:
            if not any(o.name in ("multi_gpu", "use_deepspeed", "use_fsdp", "use_megatron_lm") for o in head.options):
                edit.insert.setdefault(at, []).insert(0, "--multi_gpu")
            cpu_switch = next((o for o in head.options if o.name == "cpu"), None)
            if cpu_switch is not None:
                edit.replace[cpu_switch.start] = (cpu_switch.end, [])
    if cpu and nproc > 1:
        env.setdefault("ACCELERATE_USE_CPU", "true")


def head_process_count(head: Any) -> tuple[int | None, int]:
    """(processes per node, nodes) a launcher head states: torchrun's ``--nproc_per_node`` / ``--nnodes``,
    accelerate's ``--num_processes`` (all processes: divided by ``--num_machines``) / ``--num_machines``; None
    where it states none."""
    from attune.frameworks.cmdline import last_option, node_count, process_count

    if head.launcher == "torchrun":
        nproc = process_count(last_option(head.options, "nproc_per_node", key=lambda n: n.replace("-", "_")))
        nnodes = node_count(last_option(head.options, "nnodes")) or 1
        return nproc, nnodes
    if head.launcher == "accelerate":
        total = process_count(last_option(head.options, "num_processes", key=lambda n: n.replace("-", "_")))
        machines = node_count(last_option(head.options, "num_machines", key=lambda n: n.replace("-", "_"))) or 1
        return (None if total is None else max(1, total // machines)), machines
    return None, 1
