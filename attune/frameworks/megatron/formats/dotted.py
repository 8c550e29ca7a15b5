"""What Megatron-Bridge and NeMo 2 launches share: a config tree named by dotted keys (``model.tensor_model_
parallel_size``), built from a base (a published recipe, or a config file), with ``key=value`` overrides on the
command line taking precedence.

A knob is one or more keys (the first is the one written when the launch has none; Bridge dumps carry some settings
in two places that must agree, e.g. ``ddp.use_distributed_optimizer`` and ``optimizer.use_distributed_optimizer``).
:meth:`DottedFormat.render` changes a knob where the launch sets it — its override token, a command-line option that
stands for the key, or (``in_files``) its line in the config file — and appends one ``key=value`` override where the
launch does not set it, so every other token and byte stays as written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from attune.errors import RecipeError
from attune.frameworks.megatron import argv as av
from attune.frameworks.megatron.formats import (
    Format,
    Native,
    Spelling,
    scalar_text,
    yamledit,
)


@dataclass(frozen=True)
class KnobKeys:
    knob: str
    keys: tuple[str, ...]
    default: Any  # the knob's value when no key is set (the framework's default)
    invert: bool = False  # the key holds the negation (grad_reduce_in_fp32 ↔ grad_reduce_in_bf16)
    none_is: Any = None  # the knob value a native null means (recompute_granularity: "none")
    to_native: dict[Any, Any] | None = None  # knob value → native value, where they differ
    versions: str = ""


@dataclass
class Sources:
    """Where each setting of a dotted launch comes from."""

    launch: av.Launch
    options: list[av.Option]
    overrides: list[av.Override]
    base: dict[str, Any]  # preset or config-file settings (flattened)
    file: str | None  # the config file the base came from, if any
    option_keys: dict[str, av.Option]  # dotted key → the command-line option that sets it


class DottedFormat(Format):
    """A format whose settings are dotted keys with ``key=value`` overrides."""

    KNOBS: tuple[KnobKeys, ...] = ()
    #: dotted keys (or prefixes ending in ``.``) that decide what is learned
    CONTRACT_KEYS: frozenset[str] = frozenset()
    CONTRACT_PREFIXES: tuple[str, ...] = ()
    #: short names ``--set NAME=VALUE`` accepts for a dotted key
    ALIASES: ClassVar[dict[str, str]] = {}
    #: command-line options (normalised name) that stand for a dotted key
    OPTION_KEYS: ClassVar[dict[str, str]] = {}
    programs: tuple[str, ...] = ()
    #: single-dash short options (``-tp 2``) are options of this launch
    short_options: bool = False
    #: flags that take no value
    switches: frozenset[str] = frozenset()

    @property
    def spellings(self) -> dict[str, Spelling]:  # type: ignore[override]
        return {k.knob: Spelling(k.knob, k.keys, k.versions or self.versions) for k in self.KNOBS}

    # -- parsing -------------------------------------------------------------------------------------------
    def sources(self, argv: Sequence[str], files: Mapping[str, str]) -> Sources:
        launch = av.split(argv, programs=self.programs)
        opts, ovs, positionals = av.scan(launch.argv, launch.args_start, overrides=True, short=self.short_options,
                                         switches=self.switches)
        self.check_positionals(launch, positionals)
        base, file = self.base(launch, opts, files)
        option_keys: dict[str, av.Option] = {}
        for o in opts:
            key = self.OPTION_KEYS.get(av.norm(o.name)) or self.OPTION_KEYS.get(o.name)
            if key is not None:
                option_keys[key] = o
        return Sources(launch, opts, ovs, base, file, option_keys)

    def check_positionals(self, launch: av.Launch, positionals: list[int]) -> None:
        if positionals:
            tok = launch.argv[positionals[0]]
            raise RecipeError(f"`{tok}` in the {self.title} is neither an option nor a key=value override")

    def base(self, launch: av.Launch, opts: list[av.Option], files: Mapping[str, str]) -> tuple[dict[str, Any],
                                                                                                str | None]:
        raise NotImplementedError

    def settings(self, src: Sources) -> dict[str, Any]:
        s = dict(src.base)
        for key, opt in src.option_keys.items():
            s[key] = av.to_scalar(opt.raw) if isinstance(opt.raw, str) else opt.raw
        for ov in src.overrides:
            s[ov.key] = av.to_scalar(ov.value)
        return s

    def knob_values(self, s: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self.KNOBS:
            present = [key for key in k.keys if key in s]
            if not present:
                out[k.knob] = k.default
                continue
            v = s[present[0]]
            if k.invert:
                v = not bool(v)
            elif v is None and k.none_is is not None:
                v = k.none_is
            elif k.to_native:
                back = {nv: kv for kv, nv in k.to_native.items()}
                v = back.get(v, v)
            out[k.knob] = v
        return out

    # -- editing -------------------------------------------------------------------------------------------
    def _native_value(self, k: KnobKeys, value: Any) -> Any:
        if k.invert:
            return not bool(value)
        if k.none_is is not None and value == k.none_is:
            return None
        if k.to_native and value in k.to_native:
            return k.to_native[value]
        return value

    def render(self, native: Native, changes: Mapping[str, Any], *, in_files: bool = True,
               extra: Mapping[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
        src = self.sources(native.argv, native.files)
        edit = av.Edit(list(src.launch.argv))
        files = dict(native.files)
        table = {k.knob: k for k in self.KNOBS}
        assignments: dict[str, Any] = {}
        for knob, value in changes.items():
            k = table.get(knob)
            if k is None:
                raise RecipeError(f"knobs.{knob}: the {self.title} has no setting for it")
            present = [key for key in k.keys if key in native.settings]
            for key in present or [k.keys[0]]:
                assignments[key] = self._native_value(k, value)
        for key, value in (extra or {}).items():
            assignments[key] = None if value is av.REMOVE else value
        for key, value in assignments.items():
            self._assign(src, edit, files, key, value, in_files=in_files)
        return edit.result(), files

    def _assign(self, src: Sources, edit: av.Edit, files: dict[str, str], key: str, value: Any, *,
                in_files: bool) -> None:
        text = scalar_text(value)
        if any(ov.key == key for ov in src.overrides):
            edit.set_override(src.overrides, key, text)
        elif key in src.option_keys:
            opt = src.option_keys[key]
            edit.set_option(src.options, [opt.name], [text], spelling=opt.spelling)
        elif in_files and src.file is not None and src.file in files and yamledit.get(
                yamledit.load(src.file, files[src.file]), key)[0]:
            files[src.file] = yamledit.set_value(src.file, files[src.file], key, value)
        else:
            edit.set_override(src.overrides, key, text)

    def set_native(self, native: Native, name: str, value: Any) -> tuple[list[str], dict[str, str]] | None:
        key = self.resolve(name, native.settings)
        if key is None or key in self.knob_keys():
            return None
        src = self.sources(native.argv, native.files)
        edit = av.Edit(list(src.launch.argv))
        files = dict(native.files)
        self._assign(src, edit, files, key, value, in_files=True)
        return edit.result(), files

    def resolve(self, name: str, settings: Mapping[str, Any]) -> str | None:
        """The dotted key ``name`` means: itself when the launch has it or it is a contract key, an alias, or the
        one key of the launch whose last part is ``name``."""
        if name in settings or (self.kind_of(name) == "contract" and "." in name):
            return name
        if name in self.ALIASES:
            return self.ALIASES[name]
        ends = [k for k in settings if k.rsplit(".", 1)[-1] == name]
        return ends[0] if len(ends) == 1 else None

    def knob_keys(self) -> frozenset[str]:
        return frozenset(key for k in self.KNOBS for key in k.keys)

    def known_contract(self) -> frozenset[str]:
        return self.CONTRACT_KEYS

    def kind_of(self, name: str) -> str:
        return "contract" if name in self.CONTRACT_KEYS or name.startswith(self.CONTRACT_PREFIXES) else "frozen"


def number(s: Mapping[str, Any], key: str, default: Any = None, *, what: str = "") -> Any:
    v = s.get(key, default)
    if v is None:
        raise RecipeError(f"{key}: the launch does not set it{what}, and attune needs it for the model the simulator "
                          f"times; add {key}=VALUE to the command")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecipeError(f"{key}={v}: expected a number")
    return v


__all__ = ["DottedFormat", "KnobKeys", "Sources", "number"]
