"""Settings beyond a fixed list: read a framework's own definitions of every setting it accepts, and classify each.

A framework that supports discovery has a ``discover()`` method (or a ``discover`` module in its package with a
``discover(framework)`` function) returning a :class:`Discovery`: every setting the *installed* version defines
(HF ``TrainingArguments`` dataclass fields, DeepSpeed's config pydantic models and the keys its config reader
looks up), with its type, default and where it is defined, classified against the framework's catalogue and
contract:

- ``knob``: a curated catalogue knob (its semantics class is the catalogue's);
- ``derived``: computed from knobs (e.g. the gradient accumulation that keeps the global batch);
- ``contract``: decides what is learned; the gate refuses any change;
- ``unclassified``: everything else. Frozen by default (the gate refuses a change, since attune cannot vouch for
  it); an owner may list such a setting in ``tuning.explore``, and where the setting has a finite domain
  (:func:`explore_domain`) the tuner may then move it: each such change is classed ``numerics_changing``
  (numerics class :data:`EXPLORATORY`) and owes the loss-equivalence check.

Only the standard library is imported here; the framework's modules import their framework.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import importlib.util
import inspect
import itertools
import json
import math
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: the numerics class of every exploratory knob (an unclassified setting the owner lets the tuner move)
EXPLORATORY = "exploratory"
#: the default of a setting that has none (a required field)
REQUIRED = "<required>"

CLASSES = ("knob", "derived", "contract", "unclassified")


@dataclass(frozen=True)
class Setting:
    """One setting a framework version defines, and what attune makes of it."""

    name: str  # as the user writes it: a flag name, or a dotted config key path
    type: str  # e.g. int, bool, float, str, Optional[int], Literal['a', 'b'], dict, section
    default: Any = None
    source: str = ""  # where it is defined, e.g. transformers.TrainingArguments
    description: str = ""
    choices: tuple[Any, ...] = ()  # the legal values of an enum / Literal type
    minimum: float | None = None  # a lower bound the definition states (ge / gt)
    aliases: tuple[str, ...] = ()  # other names the framework accepts for it
    classification: str = "unclassified"  # knob | derived | contract | unclassified
    semantics: str | None = None  # the catalogue's semantics class (knobs), "contract" for contract settings
    knob: str | None = None  # the curated knob that sets it, where one does

    @property
    def explorable(self) -> bool:
        return self.classification == "unclassified" and explore_domain(self) is not None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["default"] = jsonable(self.default)
        out["choices"] = [jsonable(c) for c in self.choices]
        out["aliases"] = list(self.aliases)
        out["explorable"] = self.explorable
        out["explore_values"] = [jsonable(v) for v in explore_domain(self) or ()] if self.explorable else []
        return out


@dataclass(frozen=True)
class Discovery:
    """Every setting one installed framework version defines, classified."""

    framework: str
    version: str | None
    sources: tuple[str, ...]  # the definitions that were read
    settings: tuple[Setting, ...]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(CLASSES, 0)
        for s in self.settings:
            out[s.classification] += 1
        out["curated"] = out["knob"] + out["derived"] + out["contract"]
        out["total"] = len(self.settings)
        out["explorable"] = sum(1 for s in self.settings if s.explorable)
        return out

    def get(self, name: str) -> Setting | None:
        return next((s for s in self.settings if s.name == name or name in s.aliases), None)

    def to_dict(self) -> dict[str, Any]:
        return {"framework": self.framework, "version": self.version, "sources": list(self.sources),
                "counts": self.counts(), "settings": [s.to_dict() for s in self.settings]}

    def title(self) -> str:
        c = self.counts()
        return (f"{self.framework} {self.version or '(version unknown)'}: {c['total']} settings, {c['curated']} curated "
                f"({c['knob']} knobs, {c['derived']} derived, {c['contract']} contract), {c['unclassified']} "
                f"unclassified ({c['explorable']} explorable: name them in tuning.explore to let the tuner try them)")

    def table(self) -> Any:
        """A rich table of every setting (what ``attune knobs --discover`` prints)."""
        from rich.table import Table

        table = Table(title=self.title())
        for col in ("setting", "type", "default", "classification", "defined in"):
            table.add_column(col, overflow="fold")
        for s in self.settings:
            cls = s.classification + (f" ({s.semantics})" if s.classification == "knob" and s.semantics else "")
            cls += " · explorable" if s.explorable else ""
            default = s.default if isinstance(s.default, str) else json.dumps(jsonable(s.default))
            table.add_row(s.name, s.type, default, cls, s.source)
        return table


# ------------------------------------------------------------------------------------------- types

def jsonable(value: Any) -> Any:
    """A default as JSON can hold it (enums by value, tuples as lists, other objects by repr)."""
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)  # int subclasses (DeepSpeed's pretty-printing pp_int) as plain ints
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def type_name(tp: Any) -> str:
    """A readable name of a type annotation (``Optional[int]``, ``Literal['a', 'b']``, ``list[str]``)."""
    if isinstance(tp, str):
        return tp
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if _is_union(tp):
        rest = [a for a in args if a is not type(None)]
        inner = " | ".join(type_name(a) for a in rest)
        return f"Optional[{inner}]" if len(rest) < len(args) else inner
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(jsonable(a)) for a in args) + "]"
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return f"{tp.__name__}({', '.join(repr(jsonable(m.value)) for m in tp)})"
    return getattr(tp, "__name__", str(tp))


def choices_of(tp: Any) -> tuple[Any, ...]:
    """The legal values of an enum or ``Literal`` annotation (through ``Optional``); empty for open types."""
    if _is_union(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return choices_of(rest[0]) if len(rest) == 1 else ()
    if typing.get_origin(tp) is typing.Annotated:
        return choices_of(typing.get_args(tp)[0])
    if typing.get_origin(tp) is typing.Literal:
        return tuple(jsonable(a) for a in typing.get_args(tp))
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return tuple(jsonable(m.value) for m in tp)
    return ()


def base_type(tp: Any) -> Any:
    """``Optional[X]`` → ``X``; ``Annotated[X, ...]`` → ``X``."""
    if typing.get_origin(tp) is typing.Annotated:
        return base_type(typing.get_args(tp)[0])
    if _is_union(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return base_type(rest[0]) if len(rest) == 1 else tp
    return tp


def _scalar_kind(setting: Setting) -> str:
    t = setting.type
    for kind in ("bool", "int", "float"):
        if t == kind or t == f"Optional[{kind}]":
            return kind
    return ""


def explore_domain(setting: Setting) -> tuple[Any, ...] | None:
    """The values the tuner may try for an explored setting; ``None`` where its type has no finite domain.

    Booleans: false, true. Enums and ``Literal``: their members. Integers and floats: a ladder around the
    version's default (÷10, ÷2, ×1, ×2, ×10, within a stated lower bound); no ladder for a ``None`` or negative
    (sentinel) default or a huge one. Strings, lists, mappings and sections: none."""
    if setting.choices:
        return tuple(setting.choices)
    kind = _scalar_kind(setting)
    d = setting.default
    if kind == "bool":
        return (False, True)
    if kind in ("int", "float") and isinstance(d, (int, float)) and not isinstance(d, bool):
        if d < 0 or d >= 2**53 or not math.isfinite(d):
            return None
        lo = setting.minimum if setting.minimum is not None else -math.inf
        if kind == "int":
            d = int(d)
            ladder: list[float] = [d // 10, d // 2, d, d * 2, d * 10] if d > 0 else [0, 1, 10, 100, 1000]
        else:
            if d == 0:
                return None
            ladder = [d / 10, d / 2, d, d * 2, d * 10]
        out = tuple(sorted({v for v in ladder if v >= lo and (kind == "float" or v > 0 or d == 0)}))
        return out if len(out) > 1 else None
    return None


# ------------------------------------------------------------------------------------------- readers

def attribute_docstrings(cls: type) -> dict[str, str]:
    """Docstrings written under class attributes (``x: int = 0`` then ``\"\"\"...\"\"\"``), by attribute name."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for prev, node in itertools.pairwise(body):
            if isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name) and isinstance(node, ast.Expr) \
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                out[prev.target.id] = " ".join(node.value.value.split())
    return out


def _first_sentence(text: str, limit: int = 200) -> str:
    text = " ".join(str(text or "").split())
    cut = text.find(". ")
    text = text[:cut + 1] if 0 < cut < limit else text
    return text if len(text) <= limit else text[:limit - 1] + "…"


def from_dataclass(cls: type, *, source: str | None = None) -> list[Setting]:
    """One setting per field of a dataclass (``metadata["help"]`` as description; default or default factory)."""
    source = source or f"{cls.__module__}.{cls.__qualname__}"
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - unresolvable forward references: fall back to the raw annotations
        hints = {}
    out = []
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name, f.type)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            try:
                default = f.default_factory()
            except Exception:  # noqa: BLE001 - a factory that needs context
                default = REQUIRED
        else:
            default = REQUIRED
        out.append(Setting(name=f.name, type=type_name(tp), default=jsonable(default), source=source,
                           description=_first_sentence(f.metadata.get("help", "")), choices=choices_of(tp)))
    return out


def pydantic_models_of(tp: Any) -> list[type]:
    """Pydantic model classes an annotation holds (``Optional[Model]``, ``Model``)."""
    out = []
    for a in (typing.get_args(tp) if _is_union(tp) else (tp,)):
        a = base_type(a)
        if inspect.isclass(a) and hasattr(a, "model_fields"):
            out.append(a)
    return out


def from_pydantic(model: type, *, prefix: str = "", source: str | None = None) -> list[Setting]:
    """One setting per field of a pydantic model, named by its alias (how a config file writes it); a field that
    holds another model is listed as a section and its fields follow under its name."""
    source = source or f"{model.__module__}.{model.__qualname__}"
    docs = attribute_docstrings(model)
    out: list[Setting] = []
    for name, f in model.model_fields.items():  # type: ignore[attr-defined]
        key = f.alias or name
        tp = f.annotation
        default: Any
        if f.default_factory is not None:
            try:
                default = f.default_factory()
            except Exception:  # noqa: BLE001
                default = REQUIRED
        elif f.is_required():
            default = REQUIRED
        else:
            default = f.default
        minimum = None
        for m in f.metadata:
            for attr in ("ge", "gt"):
                v = getattr(m, attr, None)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    minimum = v if attr == "ge" else (v + 1 if isinstance(v, int) else v)
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        desc = f.description or docs.get(name, "")
        if extra.get("deprecated"):
            new = extra.get("new_param")
            desc = f"deprecated{f'; use {new}' if new else ''}. {desc}".strip()
        nested = pydantic_models_of(tp)
        aliases = tuple(f"{prefix}{n}" for n in {name, key} - {key})
        if nested:  # a sub-model: listed as a section, its fields follow
            out.append(Setting(name=f"{prefix}{key}", type="section", default=None if default is None else "{…}",
                               source=source, description=_first_sentence(desc), aliases=aliases))
        else:
            out.append(Setting(name=f"{prefix}{key}", type=type_name(tp), default=jsonable(default), source=source,
                               description=_first_sentence(desc), choices=choices_of(tp), minimum=minimum,
                               aliases=aliases))
        for sub in nested:
            out.extend(from_pydantic(sub, prefix=f"{prefix}{key}."))
    return out


def pydantic_field_count(model: type) -> int:
    """Fields of a pydantic model and of every model its fields hold (what :func:`from_pydantic` lists)."""
    fields: dict[str, Any] = model.model_fields  # type: ignore[attr-defined]
    return sum(1 + sum(pydantic_field_count(m) for m in pydantic_models_of(f.annotation))
               for f in fields.values())


# ------------------------------------------------------------------------------------------- classification

Classifier = Callable[[Setting], tuple[str, str | None, str | None]]


def classify(settings: Iterable[Setting], classifier: Classifier) -> tuple[Setting, ...]:
    """Each setting with ``classification``, ``semantics`` and ``knob`` from ``classifier(setting)``."""
    out = []
    for s in settings:
        classification, semantics, knob = classifier(s)
        if classification not in CLASSES:
            raise ValueError(f"unknown classification {classification!r} for {s.name}")
        out.append(dataclasses.replace(s, classification=classification, semantics=semantics, knob=knob))
    return tuple(out)


def discover(framework: Any) -> Discovery:
    """The framework's :class:`Discovery` (its ``discover()`` method, else its package's ``discover`` module);
    :class:`NotImplementedError` when it has neither."""
    method = getattr(framework, "discover", None)
    if callable(method):
        result = method()
        if isinstance(result, Discovery):
            return result
    package = type(framework).__module__
    if package.endswith(".catalogue"):
        package = package.rsplit(".", 1)[0]
    try:
        module = importlib.import_module(f"{package}.discover")
    except ModuleNotFoundError as err:
        if err.name != f"{package}.discover" and not f"{package}.discover".startswith(str(err.name)):
            raise
        raise NotImplementedError(f"the {framework.name} framework cannot discover its settings: it reads no "
                                  "definitions of its installed version") from None
    fn = getattr(module, "discover", None)
    if not callable(fn):
        raise NotImplementedError(f"{module.__name__} has no discover() function")
    return fn(framework)


def installed_version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def require(package: str, extra: str) -> None:
    """Raise a readable error when ``package`` is not importable (discovery reads the installed version)."""
    if importlib.util.find_spec(package) is None:
        from attune.errors import AttuneError

        raise AttuneError(f"discovery reads the installed {package}, which is not installed here; install it "
                          f"(pip install 'attune-llm[{extra}]')")


__all__ = ["CLASSES", "EXPLORATORY", "REQUIRED", "Discovery", "Setting", "attribute_docstrings", "base_type",
           "choices_of", "classify", "discover", "explore_domain", "from_dataclass", "from_pydantic",
           "installed_version", "jsonable", "pydantic_field_count", "pydantic_models_of", "require", "type_name"]
