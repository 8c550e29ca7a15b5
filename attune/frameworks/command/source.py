"""A training script's settings and hazards, read from its source with :mod:`ast`: never by running it.

Running a script to learn its flags (``python train.py --help``) starts a real training run wherever the script
does not stop at ``--help`` (nanoGPT's configurator has no ``--help``; on a cluster such a run is an expensive one).
So attune reads the source instead, in the forms its settings take:

- argparse (and jsonargparse's ``ArgumentParser``): each ``add_argument("--name", default=..., choices=...,
  action="store_true")`` call;
- HuggingFace's ``HfArgumentParser((A, B, ...))``: the fields of the dataclasses it is given, read from the script
  where it defines them, else from the installed library it imports them from (``TrainingArguments``: the library's
  own definition is read, the script is not run);
- click: each ``@click.option("--name", default=..., is_flag=True)``;
- jsonargparse's ``CLI(main)``: the parameters of ``main`` and their defaults;
- a nanoGPT-style configurator: module-level globals (literal numbers, strings, booleans) that ``--name=value``
  overrides and that config files (Python files named on the command line) reassign, in order.

:func:`config_assignments` reads such a config file the same way: its literal top-level assignments; a computed one
that assigns a setting attune must know is an error naming the file and the line.

:func:`hazards` points out what makes two runs of the script learn differently although attune changed nothing that
should matter: evaluation drawing its batches from the global generator training draws from, a printed loss that is
one micro-step's, dropout.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.errors import RecipeError
from attune.frameworks.command.declaration import Hazard, HazardKind

#: names a sequence length goes by: tokens in one sample
SEQUENCE_NAMES = ("block_size", "seq_len", "seq_length", "max_seq_length", "max_seq_len", "sequence_length",
                  "context_length", "max_length", "n_ctx", "n_positions")
ACCUMULATION = re.compile(r"^(gradient_|grad_)?acc(um(ulation)?|um)?(_steps|_iters)?$")
DROPOUT = re.compile(r"(^|_)(dropout|pdrop|dropout_prob|dropout_rate)$")
EVAL_FUNCTION = re.compile(r"eval|estimate_loss|validat")
#: calls that draw from a global generator unless given one (``generator=``)
_GLOBAL_DRAWS = re.compile(r"^(torch\.(randint|randperm|rand|randn|multinomial|bernoulli|normal)|"
                           r"(np|numpy)\.random\.\w+|random\.(random|randint|choice|choices|sample|shuffle))$")


@dataclass(frozen=True)
class Setting:
    """One setting of a script, as its source declares it."""

    name: str  # the Python name (``block_size``)
    flag: str  # as the command line writes it (``--block_size``)
    origin: str  # argparse | dataclass | click | jsonargparse | globals
    line: int = 0
    default: Any = None
    known: bool = False  # the default is a literal attune read (None may be the script's own value)
    choices: tuple[Any, ...] = ()
    switch: bool = False  # a bare flag (store_true, is_flag)

    def where(self, script: str) -> str:
        return f"{script} line {self.line}" if self.line else script


@dataclass
class ScriptSource:
    """What :func:`read_script` found: the settings by name, whether a configurator reads the command line, and the
    notes of what it could not read."""

    path: Path
    text: str = ""
    tree: ast.Module | None = None
    settings: dict[str, Setting] = field(default_factory=dict)
    configurator: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name


def literal(node: ast.AST | None) -> tuple[bool, Any]:
    """(True, value) where ``node`` is a Python literal, else (False, None)."""
    if node is None:
        return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _dotted(node: ast.AST) -> str:
    """``torch.randint`` for the function of a call (empty where it is no plain dotted name)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return ""


def read_script(path: Path, text: str | None = None) -> ScriptSource:
    """The settings ``path``'s source declares (``text``: its source where already read). A script that cannot
    be read or parsed gives none, with a note saying why."""
    out = ScriptSource(path=path)
    try:
        out.text = text if text is not None else path.read_text(encoding="utf-8", errors="replace")
        out.tree = ast.parse(out.text, filename=str(path))
    except OSError as err:
        out.notes.append(f"{path.name} could not be read ({err.strerror}): only the command line was read")
        return out
    except SyntaxError as err:
        out.notes.append(f"{path.name} is not Python attune can parse (line {err.lineno}): only the command line "
                         "was read")
        return out
    for reader in (_argparse, _click, _hf_dataclasses, _jsonargparse_cli, _configurator_globals):
        for s in reader(out):
            out.settings.setdefault(s.name, s)
    return out


# ---------------------------------------------------------------------------------------------- the readers

def _argparse(src: ScriptSource) -> list[Setting]:
    assert src.tree is not None
    found = []
    for node in ast.walk(src.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        long = next((n for n in names if n.startswith("--")), None)
        if long is None:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        _, action = literal(kw.get("action"))
        switch = action in ("store_true", "store_false")
        known, default = literal(kw["default"]) if "default" in kw else (True, action == "store_false"
                                                                          if switch else None)
        _, dest = literal(kw.get("dest"))
        _, choices = literal(kw.get("choices"))
        name = dest if isinstance(dest, str) else long[2:].replace("-", "_")
        found.append(Setting(name, long, "argparse", node.lineno, default, known,
                             tuple(choices) if isinstance(choices, (list, tuple)) else (), switch))
    return found


def _click(src: ScriptSource) -> list[Setting]:
    assert src.tree is not None
    found = []
    for node in ast.walk(src.tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            if not (isinstance(dec, ast.Call) and _dotted(dec.func).split(".")[-1] == "option"):
                continue
            names = [a.value for a in dec.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            long = next((n.split("/")[0] for n in names if n.startswith("--")), None)
            if long is None:
                continue
            kw = {k.arg: k.value for k in dec.keywords if k.arg}
            _, is_flag = literal(kw.get("is_flag"))
            known, default = literal(kw["default"]) if "default" in kw else (bool(is_flag), False if is_flag
                                                                             else None)
            found.append(Setting(long[2:].replace("-", "_"), long, "click", dec.lineno, default, known,
                                 switch=bool(is_flag)))
    return found


def _dataclass_fields(cls: ast.ClassDef) -> list[Setting]:
    found = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        value = stmt.value
        if isinstance(value, ast.Call) and _dotted(value.func).split(".")[-1] == "field":
            value = next((k.value for k in value.keywords if k.arg == "default"), None)
        known, default = literal(value)
        name = stmt.target.id
        found.append(Setting(name, f"--{name}", "dataclass", stmt.lineno, default, known))
    return found


def _hf_dataclasses(src: ScriptSource) -> list[Setting]:
    assert src.tree is not None
    classes = {n.name: n for n in ast.walk(src.tree) if isinstance(n, ast.ClassDef)}
    imported = {a.asname or a.name: n.module for n in ast.walk(src.tree) if isinstance(n, ast.ImportFrom) and n.module
                for a in n.names}
    found: list[Setting] = []
    for node in ast.walk(src.tree):
        if not (isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "HfArgumentParser" and node.args):
            continue
        arg = node.args[0]
        names = [e.id for e in (arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg])
                 if isinstance(e, ast.Name)]
        for name in names:
            if name in classes:
                found += _dataclass_fields(classes[name])
            elif name in imported:
                found += _library_dataclass(src, str(imported[name]), name)
    return found


def _library_dataclass(src: ScriptSource, module: str, name: str) -> list[Setting]:
    """The fields of a dataclass the script imports from an installed library (``transformers.TrainingArguments``):
    the library's definition, imported here; the script itself is not run, nor any module of its own (a module that
    is not an installed package is never imported: its code is the user's)."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        spec = None
    origin = str(spec.origin) if spec is not None and spec.origin else ""
    if not re.search(r"[/\\](site|dist)-packages[/\\]", origin):
        src.notes.append(f"{name} comes from {module}, which is no installed library (attune never runs the script's "
                         "own code): its flags are only those on the command line")
        return []
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as err:  # noqa: BLE001 - any import failure only means the fields stay unread
        src.notes.append(f"{name} (from {module}) could not be read here ({type(err).__name__}): its flags are "
                         "only those on the command line")
        return []
    if not dataclasses.is_dataclass(cls):
        return []
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        known = f.default is not dataclasses.MISSING
        default = f.default if known else None
        if isinstance(default, (bool, int, float, str)) or default is None:
            out.append(Setting(f.name, f"--{f.name}", "dataclass", 0, default, known))
    return out


def _jsonargparse_cli(src: ScriptSource) -> list[Setting]:
    assert src.tree is not None
    functions = {n.name: n for n in ast.walk(src.tree) if isinstance(n, ast.FunctionDef)}
    found: list[Setting] = []
    for node in ast.walk(src.tree):
        if not (isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] in ("CLI", "auto_cli")
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in functions):
            continue
        fn = functions[node.args[0].id]
        args = fn.args.args + fn.args.kwonlyargs
        defaults = [None] * (len(fn.args.args) - len(fn.args.defaults)) + list(fn.args.defaults) + \
            list(fn.args.kw_defaults)
        for a, d in zip(args, defaults, strict=True):
            known, default = literal(d)
            found.append(Setting(a.arg, f"--{a.arg}", "jsonargparse", a.lineno, default, known and d is not None))
    return found


def _configurator_globals(src: ScriptSource) -> list[Setting]:
    """nanoGPT's shape: module-level literals, then something that rewrites them from the command line (its
    ``exec(open('configurator.py').read())``, or a function given ``globals()`` and ``sys.argv``)."""
    assert src.tree is not None
    point = None
    for stmt in src.tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring that mentions a configurator is none
        text = ast.get_source_segment(src.text, stmt) or ""
        if "configurator" in text or ("globals()" in text and "sys.argv" in text):
            point = stmt.lineno
            break
    if point is None:
        return []
    src.configurator = True
    found = []
    for stmt in src.tree.body:
        if stmt.lineno >= point:
            break
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            known, value = literal(stmt.value)
            if not name.startswith("_") and known and isinstance(value, (bool, int, float, str)):
                found.append(Setting(name, f"--{name}", "globals", stmt.lineno, value, True))
    return found


# ---------------------------------------------------------------------------------------------- config files

@dataclass(frozen=True)
class Assigned:
    """A setting a config file named on the command line assigns."""

    value: Any
    where: str  # "config/x.py line 3"
    position: int  # the file's index in the command line: a later word overrides it


def config_assignments(word: str, text: str, position: int, watched: Collection[str]) -> dict[str, Assigned]:
    """The settings config file ``word`` (source ``text``, at ``position`` in the command line) assigns, read as
    nanoGPT's configurator executes it but statically: each top-level ``name = literal``. A name in ``watched``
    (a declared knob, the accumulation) assigned anything attune cannot read without running the file (a
    computation, an assignment under a condition) is a :class:`RecipeError` naming the file and the line."""
    try:
        tree = ast.parse(text, filename=word)
    except SyntaxError as err:
        raise RecipeError(f"launch.files: the config file {word} is not Python attune can read (line "
                          f"{err.lineno}: {err.msg})") from None
    out: dict[str, Assigned] = {}
    problems = []
    for stmt in tree.body:
        simple = isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
        if simple:
            assert isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)
            name = stmt.targets[0].id
            known, value = literal(stmt.value)
            where = f"{word} line {stmt.lineno}"
            if known:
                out[name] = Assigned(value, where, position)
                continue
            if name in watched:
                problems.append(f"{where}: {ast.get_source_segment(text, stmt)} is not a literal: attune reads "
                                "config files without running them, so it cannot know this value; write the value "
                                f"itself ({name} = ...)")
            else:
                out[name] = Assigned(f"{ast.get_source_segment(text, stmt.value)} (computed)", where, position)
            continue
        assigned = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for name in sorted(assigned & set(watched)):
            problems.append(f"{word} line {stmt.lineno}: {name} is assigned here under a condition, a loop or as "
                            "part of another statement: attune reads config files without running them; assign it "
                            f"once at the top level ({name} = value)")
    if problems:
        raise RecipeError("a config file sets a setting attune must know in a way it cannot read:", problems)
    return out


# ---------------------------------------------------------------------------------------------- hazards

def _draws(fn: ast.AST) -> list[ast.Call]:
    """Calls in ``fn`` that draw from a global random generator (no ``generator=`` given)."""
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and _GLOBAL_DRAWS.match(_dotted(n.func))
            and not any(k.arg == "generator" for k in n.keywords)]


def eval_shares_generator(src: ScriptSource) -> Hazard | None:
    """Evaluation that draws its batches from the global generator training draws from (nanoGPT's
    ``estimate_loss`` calling ``get_batch``, which uses ``torch.randint`` without a generator)."""
    if src.tree is None:
        return None
    functions = [n for n in ast.walk(src.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    drawing = {f.name: _draws(f) for f in functions}
    drawing = {k: v for k, v in drawing.items() if v}
    for fn in functions:
        if not EVAL_FUNCTION.search(fn.name):
            continue
        called = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                  and n.func.id in drawing and n.func.id != fn.name]
        own = drawing.get(fn.name)
        if called:
            draw = drawing[called[0].func.id][0]  # type: ignore[attr-defined]
            how = (f"{fn.name} ({src.name} line {fn.lineno}) calls {called[0].func.id}, which draws with "  # type: ignore[attr-defined]
                   f"{_dotted(draw.func)} without a generator (line {draw.lineno})")
        elif own:
            how = f"{fn.name} ({src.name} line {fn.lineno}) draws with {_dotted(own[0].func)} without a generator"
        else:
            continue
        return Hazard(HazardKind.EVAL_SHARES_GENERATOR,
                      f"{how}: evaluation takes numbers from the global generator training draws its batches from, "
                      "so a run that evaluates at another moment (or a different number of times) trains on other "
                      "samples")
    return None


def loss_not_step_mean(src: ScriptSource) -> Hazard | None:
    """A printed loss that is one micro-step's, scaled back up (nanoGPT's ``loss.item() *
    gradient_accumulation_steps``), not the optimizer step's mean."""
    if src.tree is None:
        return None
    for node in ast.walk(src.tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        sides = (node.left, node.right)
        item = any(isinstance(s, ast.Call) and isinstance(s.func, ast.Attribute) and s.func.attr == "item"
                   for s in sides)
        acc = any(ACCUMULATION.match(_dotted(s).split(".")[-1]) for s in sides if _dotted(s))
        if item and acc:
            return Hazard(HazardKind.LOSS_NOT_STEP_MEAN,
                          f"the printed loss is {ast.get_source_segment(src.text, node)} ({src.name} line "
                          f"{node.lineno}): the last micro-step's loss scaled back up, not the step's mean, so it "
                          "changes with the micro-batch split and loss curves of two splits cannot be compared")
    return None


def dropout(src: ScriptSource, values: Mapping[str, Any]) -> Hazard | None:
    """Dropout in the model: a dropout setting above zero (``values``: the settings as the launch has them), or a
    literal ``Dropout(p)`` with p > 0."""
    for name, value in values.items():
        if DROPOUT.search(name) and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            s = src.settings.get(name)
            where = f" ({s.where(src.name)})" if s is not None and s.default == value else ""
            return Hazard(HazardKind.DROPOUT, f"dropout: {name} = {value}{where}: dropout draws a random mask for "
                          "every sample, so another micro-batch split or another number of draws before it gives "
                          "other masks, and other losses than rounding alone would")
    if src.tree is not None:
        for node in ast.walk(src.tree):
            if isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "Dropout" and node.args:
                known, p = literal(node.args[0])
                if known and isinstance(p, (int, float)) and p > 0:
                    return Hazard(HazardKind.DROPOUT, f"dropout: Dropout({p}) ({src.name} line {node.lineno}) "
                                  "draws a random mask for every sample, so another micro-batch split gives other "
                                  "masks, and other losses than rounding alone would")
    return None


def hazards(src: ScriptSource, values: Mapping[str, Any]) -> list[Hazard]:
    """Every hazard :mod:`attune.frameworks.command.source` can see in ``src`` (``values``: the settings as the
    launch has them)."""
    found = [eval_shares_generator(src), loss_not_step_mean(src), dropout(src, values)]
    return [h for h in found if h is not None]


__all__ = ["SEQUENCE_NAMES", "Assigned", "ScriptSource", "Setting", "config_assignments", "dropout",
           "eval_shares_generator", "hazards", "literal", "loss_not_step_mean", "read_script"]
