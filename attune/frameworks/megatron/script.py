"""Megatron launches inside shell scripts: ``bash /scripts/run.sh`` (a script mounted from a ConfigMap) and
``sh -c "torchrun ... pretrain_gpt.py ..."``.

Megatron-LM's own examples launch from shell scripts (``examples/gpt3/train_gpt3_175b_distributed.sh``): plain and
exported variables, bash arrays of flags (``TRAINING_ARGS=(--micro-batch-size 1 ...)``), ``${ARR[@]}`` and
``$VAR`` expansions, ``${VAR:-default}``, ``$((...))`` arithmetic and the script's positional arguments (``$1``).
:func:`read_script` reads such a script the way bash would expand its launch line, recording for every token of
the launch where in the text it was written; :func:`edit_script` writes a changed launch back into the text at
exactly those places (an unchanged launch gives the text back unchanged), and checks that the edited text reads
as the changed launch. Anything the script computes at run time (``$(...)``, backticks) is refused when the launch
uses it, naming it.

:func:`classify` tells how a container runs its launch: directly (``torchrun ...`` in command/args), an inline
shell script (``sh -c TEXT``) or a script file (``bash PATH`` / ``PATH.sh``).
"""

from __future__ import annotations

import ast
import difflib
import itertools
import operator
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import cast

from attune.errors import RecipeError

SHELLS = ("bash", "sh", "dash", "zsh", "ksh")
_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=")
_SKIP_WORDS = ("exec",)
_REDIRECT = re.compile(r"(\d*|&)(>>?|<)(&\d+|&-)?")
#: what to do about a launch attune cannot see
SEE_FIX = ("put the script in a ConfigMap, mount it into the container and run it from there (attune reads it "
           "through the API and gives each trial a changed copy), or give the command line itself in the "
           "container's command and args (command: [torchrun], args: [--nproc_per_node, '8', pretrain_gpt.py, ...])")


# -------------------------------------------------------------------------------------------- the container

@dataclass(frozen=True)
class ContainerLaunch:
    """How a container runs its launch: ``direct`` (the argument list itself), ``inline`` (``sh -c TEXT``, the text
    in ``text``) or ``file`` (a script at ``path``, ``bash PATH`` or an executable ``*.sh``)."""

    kind: str
    argv: tuple[str, ...]
    shell: tuple[str, ...] = ()  # the interpreter and its options before the script (``-c`` excluded)
    text: str | None = None  # an inline script
    path: str | None = None  # a script file, absolute (relative paths resolved against the working directory)
    script_args: tuple[str, ...] = ()  # $1 ... (an inline script: after its $0)
    zero: str | None = None  # $0 of an inline script


def classify(argv: Sequence[str], cwd: str = "/") -> ContainerLaunch:
    argv = tuple(str(a) for a in argv)
    if not argv:
        return ContainerLaunch("direct", argv)
    head = PurePosixPath(argv[0]).name
    if head in SHELLS:
        i, inline = 1, False
        while i < len(argv) and argv[i][:1] in ("-", "+") and argv[i] not in ("-", "--"):
            tok = argv[i]
            if tok in ("-o", "+o", "-O", "+O"):
                i += 2
                continue
            if not tok.startswith("--") and "c" in tok[1:]:
                inline = True
            i += 1
        if i < len(argv) and argv[i] == "--":
            i += 1
        if i >= len(argv):
            return ContainerLaunch("direct", argv)
        shell = tuple(a for a in argv[:i] if a != "--")
        if inline:
            opts = tuple(a if a.startswith("--") or a[:1] == "+" or "c" not in a else a.replace("c", "")
                         for a in shell)
            opts = tuple(a for a in opts if a not in ("-", "+"))
            rest = argv[i + 1:]
            return ContainerLaunch("inline", argv, shell=opts, text=argv[i], zero=rest[0] if rest else None,
                                   script_args=rest[1:])
        return ContainerLaunch("file", argv, shell=shell, path=_absolute(argv[i], cwd), script_args=argv[i + 1:])
    if argv[0].endswith(".sh"):
        return ContainerLaunch("file", argv, path=_absolute(argv[0], cwd), script_args=argv[1:])
    return ContainerLaunch("direct", argv)


def _absolute(path: str, cwd: str) -> str:
    return str(PurePosixPath(cwd or "/") / path) if not path.startswith("/") else path


def interpreter(text: str, shell: Sequence[str]) -> list[str]:
    """The interpreter that runs a script: the container's (``bash``), else its ``#!`` line's, else ``sh``."""
    if shell:
        return list(shell)
    first = text.splitlines()[0] if text else ""
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts:
            return parts
    return ["sh"]


# -------------------------------------------------------------------------------------------- reading

@dataclass(frozen=True)
class Token:
    """One token of the expanded launch, and the span of the text that writes it (``None``: no single place)."""

    text: str
    site: tuple[int, int] | None


@dataclass
class _Word:
    raw: str
    start: int
    end: int
    array: list[_Word] | None = None  # NAME=( ... ): the elements


class _Unknown(Exception):
    """A value the script computes at run time."""


Char = tuple[str, "int | None", bool]  # character, its place in the text, subject to word splitting


@dataclass
class Script:
    """A shell script's launch: the expanded argument list with where each token is written, the environment the
    script exports (and where each exported value is written), and the text."""

    text: str
    tokens: list[Token]
    env: dict[str, str]
    env_sites: dict[str, tuple[int, int]] = field(default_factory=dict)
    statement: tuple[int, int] = (0, 0)  # the launch statement's span

    @property
    def argv(self) -> list[str]:
        return [t.text for t in self.tokens]


def _lex(text: str) -> list[list[_Word]]:
    """Statements (lists of words) of ``text``: newlines, ``;``, ``&&``, ``||`` and ``|`` end one; ``#`` starts a
    comment; ``\\``-newline continues; quotes, ``$(...)``, ``${...}`` and backticks stay inside a word; a
    ``NAME=(`` word holds its array's elements."""
    statements: list[list[_Word]] = []
    words: list[_Word] = []
    i, n = 0, len(text)

    def end_statement() -> None:
        nonlocal words
        if words:
            statements.append(words)
        words = []

    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
        elif c == "\\" and text[i + 1:i + 2] == "\n":
            i += 2
        elif c == "\n" or c == ";":
            end_statement()
            i += 1
        elif (r := _REDIRECT.match(text, i)) is not None:
            i = r.end()
            if not r.group(3):  # the target word goes with it
                while i < n and text[i] in " \t":
                    i += 1
                if i < n and text[i] not in "\n;&|":
                    _, i = _word(text, i)
        elif c in "&|":
            end_statement()
            i += 2 if text[i + 1:i + 2] == c else 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        else:
            word, i = _word(text, i)
            words.append(word)
    end_statement()
    return statements


def _word(text: str, i: int) -> tuple[_Word, int]:
    start, n = i, len(text)
    while i < n:
        c = text[i]
        if c in " \t\n;&|<>":
            break
        if c == "\\":
            if text[i + 1:i + 2] == "\n":
                break
            i += 2
        elif c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise RecipeError(f"the script has an unterminated ' quote (at character {i})")
            i = j + 1
        elif c == '"':
            i = _skip_double(text, i + 1)
        elif c == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise RecipeError(f"the script has an unterminated ` (at character {i})")
            i = j + 1
        elif c == "$" and text[i + 1:i + 2] in ("(", "{"):
            i = _skip_group(text, i + 1)
        elif c == "(" and text[start:i].endswith("=") and _ASSIGN.match(text[start:i]):
            return _array(text, start, i)
        elif c in "()":
            if i == start:
                i += 1
            break
        else:
            i += 1
    return _Word(text[start:i], start, i), i


def _skip_double(text: str, i: int) -> int:
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        elif c == "$" and text[i + 1:i + 2] in ("(", "{"):
            i = _skip_group(text, i + 1)
        elif c == "`":
            i = text.find("`", i + 1) + 1 or n
        else:
            i += 1
    raise RecipeError('the script has an unterminated " quote')


def _skip_group(text: str, i: int) -> int:
    """``text[i]`` is ``(`` or ``{``: the index after its matching closer."""
    opener = text[i]
    closer = ")" if opener == "(" else "}"
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and opener == "(":
            i = text.find("'", i + 1) + 1 or n
            continue
        if c == '"':
            i = _skip_double(text, i + 1)
            continue
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise RecipeError(f"the script has an unterminated {opener}")


def _array(text: str, start: int, i: int) -> tuple[_Word, int]:
    """``NAME=(`` at ``text[start:i+1]``: its elements up to the matching ``)``."""
    elements: list[_Word] = []
    i += 1
    n = len(text)
    while i < n:
        c = text[i]
        if c in " \t\n":
            i += 1
        elif c == "\\" and text[i + 1:i + 2] == "\n":
            i += 2
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == ")":
            return _Word(text[start:i + 1], start, i + 1, array=elements), i + 1
        else:
            word, i = _word(text, i)
            if not word.raw:
                raise RecipeError(f"cannot read the array at character {start} of the script")
            elements.append(word)
    raise RecipeError(f"the array at character {start} of the script has no closing )")


class _Reader:
    def __init__(self, text: str, args: Sequence[str], zero: str, env: Mapping[str, str]) -> None:
        self.text = text
        self.args = list(args)
        self.zero = zero
        self.vars: dict[str, list[Char] | list[Token] | _Unknown] = {
            k: [(ch, cast("int | None", None), True) for ch in v] for k, v in env.items()}
        self.exported: set[str] = set()
        self.sites: dict[str, tuple[int, int]] = {}

    # -- expansion -----------------------------------------------------------------------------------------
    def chars(self, raw: str, base: int | None, quoted: bool = False) -> list[Char]:
        """The characters a word (or the inside of double quotes) expands to, without word splitting."""
        out: list[Char] = []
        i, n = 0, len(raw)

        def pos(k: int) -> int | None:
            return None if base is None else base + k

        while i < n:
            c = raw[i]
            if c == "\\":
                nxt = raw[i + 1:i + 2]
                if quoted and nxt not in ('"', "\\", "$", "`"):
                    out.append((c, pos(i), False))
                    i += 1
                elif nxt:
                    out.append((nxt, pos(i + 1), False))
                    i += 2
                else:
                    i += 1
            elif c == "'" and not quoted:
                j = raw.index("'", i + 1)
                out += [(raw[k], pos(k), False) for k in range(i + 1, j)]
                i = j + 1
            elif c == '"' and not quoted:
                j = _skip_double(raw, i + 1)
                out += self.chars(raw[i + 1:j - 1], None if base is None else base + i + 1, quoted=True)
                i = j
            elif c == "`":
                raise _Unknown(f"`{raw[i:raw.index('`', i + 1) + 1]}` (a command it runs)")
            elif c == "$":
                got, i = self.dollar(raw, i, base, quoted)
                out += got
            else:
                out.append((c, pos(i), False))
                i += 1
        return out

    def dollar(self, raw: str, i: int, base: int | None, quoted: bool) -> tuple[list[Char], int]:
        nxt = raw[i + 1:i + 2]
        if raw.startswith("$((", i):
            j = _skip_group(raw, i + 1)
            expr = raw[i + 3:j - 2]
            value = str(self.arithmetic(expr))
            return [(ch, None, not quoted) for ch in value], j
        if nxt == "(":
            j = _skip_group(raw, i + 1)
            raise _Unknown(f"`{raw[i:j]}` (a command it runs)")
        if nxt == "{":
            j = _skip_group(raw, i + 1)
            inner = raw[i + 2:j - 1]
            m = re.match(r"^([A-Za-z_]\w*|\d+|[@*#?])(.*)$", inner, re.S)
            if m is None:
                raise _Unknown(f"`{raw[i:j]}` (a parameter expansion attune does not evaluate)")
            name, rest = m.group(1), m.group(2)
            if rest.startswith((":-", "-")):
                default = rest[2:] if rest.startswith(":-") else rest[1:]
                got = self.scalar(name, quoted, raw[i:j])
                if got or (not rest.startswith(":-") and name in self.vars):
                    return got, j
                dbase = None if base is None else base + i + 2 + len(name) + (len(rest) - len(default))
                return [(ch, p, not quoted and s) for ch, p, s in self.chars(default, dbase, quoted=True)], j
            if rest:
                raise _Unknown(f"`{raw[i:j]}` (a parameter expansion attune does not evaluate)")
            return self.scalar(name, quoted, raw[i:j]), j
        m = re.match(r"[A-Za-z_]\w*|\d|[@*#?]", raw[i + 1:])
        if not m:
            return [("$", None if base is None else base + i, False)], i + 1
        return self.scalar(m.group(0), quoted, raw[i:i + 1 + m.end()]), i + 1 + m.end()

    def scalar(self, name: str, quoted: bool, written: str) -> list[Char]:
        if name.isdigit():
            k = int(name)
            value = self.zero if k == 0 else (self.args[k - 1] if k <= len(self.args) else "")
            return [(ch, None, not quoted) for ch in value]
        if name in ("@", "*", "#", "?"):
            raise _Unknown(f"`{written}` (the script's arguments as a list)")
        var = self.vars.get(name)
        if var is None:
            return [(ch, None, False) for ch in written]  # set at run time (the job's environment): kept as written
        if isinstance(var, _Unknown):
            raise var
        if var and isinstance(var[0], Token):
            var = list(self.tokens_chars(var))  # $ARR: its first element
        return [(ch, p, s and not quoted) for ch, p, s in var]  # type: ignore[misc]

    @staticmethod
    def tokens_chars(tokens: list[Token]) -> list[Char]:
        first = tokens[0]
        if first.site is None:
            return [(ch, None, False) for ch in first.text]
        return [(ch, first.site[0] + k if len(first.text) == first.site[1] - first.site[0] else None, False)
                for k, ch in enumerate(first.text)]

    def arithmetic(self, expr: str) -> int:
        def value(m: re.Match[str]) -> str:
            chars = self.scalar(m.group(1) or m.group(2), True, m.group(0))
            return "".join(ch for ch, _, _ in chars) or "0"

        expr = re.sub(r"\$\{?([A-Za-z_]\w*)\}?|(?<![\w$])([A-Za-z_]\w*)", value, expr)
        try:
            return _eval_int(ast.parse(expr.strip(), mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError):
            raise _Unknown(f"`$(({expr}))` (arithmetic attune cannot evaluate)") from None

    def word_tokens(self, word: _Word) -> list[Token]:
        """The tokens one word expands to, each with the span of the text that writes it."""
        arr = re.fullmatch(r'"?\$\{([A-Za-z_]\w*)\[[@*]\]\}"?', word.raw)
        if arr:
            var = self.vars.get(arr.group(1))
            if isinstance(var, _Unknown):
                raise var
            if var is None:
                return []
            if var and isinstance(var[0], Token):
                return list(var)
            return [Token("".join(ch for ch, _, _ in var), None)]  # type: ignore[misc]
        chars = self.chars(word.raw, word.start)
        tokens: list[list[Char]] = [[]]
        quoted = any(not s for _, _, s in chars) or not chars
        for ch, p, s in chars:
            if s and ch in " \t\n":
                if tokens[-1]:
                    tokens.append([])
                continue
            tokens[-1].append((ch, p, s))
        tokens = [t for t in tokens if t]
        if not tokens:
            return [Token("", (word.start, word.end))] if quoted and _quoted_empty(word.raw) else []
        if len(tokens) == 1:
            return [Token("".join(ch for ch, _, _ in tokens[0]), (word.start, word.end))]
        return [Token("".join(ch for ch, _, _ in t), _contiguous(t)) for t in tokens]

    # -- statements ----------------------------------------------------------------------------------------
    def assign(self, word: _Word, export: bool) -> None:
        m = _ASSIGN.match(word.raw)
        assert m is not None
        name, append = m.group(1), bool(m.group(2))
        if word.array is not None:
            try:
                value: list[Char] | list[Token] | _Unknown = [t for e in word.array for t in self.word_tokens(e)]
            except _Unknown as err:
                value = err
            old = self.vars.get(name)
            if append and isinstance(old, list) and old and isinstance(old[0], Token) and isinstance(value, list):
                value = [*old, *value]
        else:
            vstart = word.start + m.end()
            try:
                value = self.chars(word.raw[m.end():], vstart)
                value = [(ch, p, True) for ch, p, _ in value]
                self.sites[name] = (vstart, word.end)
            except _Unknown as err:
                value = err
        self.vars[name] = value
        if export:
            self.exported.add(name)

    def env(self) -> dict[str, str]:
        out = {}
        for name in sorted(self.exported):
            var = self.vars.get(name)
            if isinstance(var, list) and (not var or not isinstance(var[0], Token)):
                out[name] = "".join(ch for ch, _, _ in var)  # type: ignore[misc]
        return out


def _quoted_empty(raw: str) -> bool:
    return raw in ('""', "''")


def _contiguous(chars: list[Char]) -> tuple[int, int] | None:
    places = [p for _, p, _ in chars]
    if any(p is None for p in places):
        return None
    first = places[0]
    assert first is not None
    if places != list(range(first, first + len(places))):
        return None
    return first, first + len(places)


_OPS: dict[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                               ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv,
                                               ast.Mod: operator.mod}


def _eval_int(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_int(node.left), _eval_int(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_int(node.operand)
    raise ValueError("unsupported")


def read_script(text: str, *, args: Sequence[str] = (), zero: str = "run.sh", env: Mapping[str, str] | None = None,
                is_launch: Callable[[list[str]], bool], where: str = "the script") -> Script:
    """The launch ``text`` runs (the last statement ``is_launch`` accepts, ``exec`` dropped), expanded as bash
    would with ``args`` as ``$1 ...`` and ``env`` as the environment it starts with; :class:`RecipeError` naming
    what cannot be read."""
    reader = _Reader(text, args, zero, env or {})
    found: tuple[list[Token], tuple[int, int], dict[str, str]] | None = None
    unreadable: list[str] = []
    for words in _lex(text):
        head = words[0].raw
        export = head in ("export", "declare", "local", "readonly", "typeset")
        body = words[1:] if export else words
        body = [w for w in body if not (export and w.raw.startswith("-"))]
        assigns = [w for w in body if _ASSIGN.match(w.raw)]
        if export and len(assigns) < len(body) and head == "export":
            reader.exported.update(w.raw for w in body if _NAME.fullmatch(w.raw))
        k = 0
        while k < len(body) and _ASSIGN.match(body[k].raw):
            k += 1
        if export or k == len(body):
            for w in assigns:
                reader.assign(w, export=head == "export")
            continue
        prefix = {}
        for w in body[:k]:
            m = _ASSIGN.match(w.raw)
            assert m is not None
            try:
                prefix[m.group(1)] = "".join(ch for ch, _, _ in reader.chars(w.raw[m.end():], None))
            except _Unknown:
                pass
        cmd = body[k:]
        while cmd and cmd[0].raw in _SKIP_WORDS:
            cmd = cmd[1:]
        if not cmd:
            continue
        try:
            tokens = [t for w in cmd for t in reader.word_tokens(w)]
        except _Unknown as err:
            if re.search(r"torchrun|python|nemo|pretrain_|\.py\b", " ".join(w.raw for w in cmd)):
                unreadable.append(f"`{' '.join(w.raw for w in cmd)[:120]}` uses {err}")
            continue
        if tokens and is_launch([t.text for t in tokens]):
            found = (tokens, (cmd[0].start, cmd[-1].end), prefix)
    if found is None:
        if unreadable:
            raise RecipeError(f"{where}: cannot read its launch: {unreadable[-1]}, which attune cannot evaluate; "
                              "write the value in the script")
        raise RecipeError(f"{where} runs no launch attune can read (torchrun / python ... pretrain_gpt.py, "
                          "run_recipe.py, nemo llm ...)")
    tokens, span, prefix = found
    return Script(text=text, tokens=tokens, env={**reader.env(), **prefix}, statement=span,
                  env_sites={k: v for k, v in reader.sites.items() if k in reader.exported})


# -------------------------------------------------------------------------------------------- editing

def edit_script(script: Script, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                is_launch: Callable[[list[str]], bool], args: Sequence[str] = (), zero: str = "run.sh",
                where: str = "the script") -> str:
    """``script``'s text with its launch changed to ``argv`` and its exported variables in ``env`` set, each token
    edited where the text writes it (a flag in an array, in its array); :class:`RecipeError` when a token to change
    has no single place in the text (it is built from several), naming it."""
    old = script.argv
    new = [str(a) for a in argv]
    edits: list[tuple[int, int, str]] = []

    def place(k: int) -> tuple[int, int]:
        site = script.tokens[k].site
        if site is None:
            raise RecipeError(f"{where}: cannot change `{script.tokens[k].text}` in the launch: the script builds it "
                              "from several pieces; write it as one word in the script")
        return site

    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        if op == "replace" and i2 - i1 == j2 - j1:
            for k in range(i2 - i1):
                s, e = place(i1 + k)
                edits.append((s, e, _quote(new[j1 + k])))
            continue
        for k in range(i1, i2):
            s, e = place(k)
            while s > 0 and script.text[s - 1] in " \t":
                s -= 1
            edits.append((s, e, ""))
        if j2 > j1:
            text = " " + " ".join(_quote(t) for t in new[j1:j2])
            if i1 > 0:
                at = place(i1 - 1)[1]
            else:
                at = place(0)[0]
                text = text[1:] + " "
            edits.append((at, at, text))
    for name, value in (env or {}).items():
        if script.env.get(name) == value:
            continue
        site = script.env_sites.get(name)
        if site is None:
            raise RecipeError(f"{where}: cannot set {name}={value}: the script exports it without a value of its own")
        edits.append((site[0], site[1], _quote(value)))
    edits.sort(key=lambda e: (e[0], e[1]))
    for (_s1, e1, _), (s2, _e2, _) in itertools.pairwise(edits):
        if s2 < e1:
            raise RecipeError(f"{where}: cannot apply the change: two edits meet at character {s2}")
    text = script.text
    for s, e, rep in reversed(edits):
        text = text[:s] + rep + text[e:]
    check = read_script(text, args=args, zero=zero, is_launch=is_launch, where=where)
    if check.argv != new:
        raise RecipeError(f"{where}: the changed script would not run the changed launch (a token it changes is "
                          "used in more than one place); write the launch's flags literally in the script")
    return text


def _quote(token: str) -> str:
    return shlex.quote(token)


__all__ = ["SEE_FIX", "ContainerLaunch", "Script", "Token", "classify", "edit_script", "interpreter", "read_script"]
