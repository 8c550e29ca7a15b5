"""Native launches read and edited token by token (shared by the Megatron formats and torchtitan).

A launch is ``LAUNCHER [launcher options] SCRIPT ARGS``: ``torchrun [...] script.py`` (also ``python -m
torch.distributed.run`` / ``torch.distributed.launch``), ``python script.py`` / ``python -m module``, or a CLI of its
own (``nemo llm pretrain ...``). :func:`split` finds the script; :func:`scan` reads argparse-style flags (``--name
value``, ``--name=value``, bare ``--flag``, several value tokens) and ``key=value`` overrides, keeping every token's
position, so :class:`Edit` can change one setting in place and leave every other token exactly as written.

Nothing here knows a framework's settings: the formats map names to knobs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from attune.errors import RecipeError
from attune.frameworks.cmdline import (
    REMOVE,
    TORCHRUN_SWITCHES,
    Option,
    as_written,
    last_option,
    node_count,
    norm,
    process_count,
    split_launch,
)
from attune.frameworks.cmdline import Edit as ArgvEdit


@dataclass(frozen=True)
class Override:
    """One ``key=value`` override token (Hydra / NeMo-Run / ConfigContainer dot notation)."""

    key: str
    index: int
    value: str


@dataclass(frozen=True)
class Launch:
    """A launch split into its parts (positions index ``argv``)."""

    argv: tuple[str, ...]
    launcher: str  # torchrun | python | <the program's own name>
    launcher_options: tuple[Option, ...]
    script_index: int  # index of the script token (of ``-m`` for a python module)
    script: str
    module: bool
    args_start: int

    def launcher_option(self, *names: str) -> Option | None:
        return last_option(self.launcher_options, *names, key=norm)

    @property
    def nproc(self) -> int | None:
        """Processes per node the launcher starts (torchrun ``--nproc_per_node``; ``None``: not given)."""
        n = process_count(self.launcher_option("nproc_per_node"), example=8)
        if n is None:
            return None if self.launcher == "torchrun" else 1
        return n

    @property
    def nnodes(self) -> int:
        return node_count(self.launcher_option("nnodes")) or 1

    def launcher_tokens(self) -> list[str]:
        """The launcher part of the argument list (everything before the script)."""
        return list(self.argv[:self.script_index])


def split(argv: Sequence[str], *, programs: Sequence[str] = ()) -> Launch:
    """Split a launch into launcher and script; ``programs`` are CLIs that are their own launcher (``nemo``)."""
    argv = tuple(str(a) for a in argv)
    if not argv:
        raise RecipeError("the launch command is empty")
    head = PurePosixPath(argv[0]).name
    if head in programs:
        return Launch(argv, head, (), 0, argv[0], False, 1)
    programs_hint = "".join(", " + p for p in programs)
    h = split_launch(argv, {"torchrun": TORCHRUN_SWITCHES}, name=as_written,
                     unknown="give the training command as torchrun ..., python -m torch.distributed.run ..., "
                             f"python SCRIPT ...{programs_hint}")
    return Launch(argv, h.launcher, h.options, h.script_index, h.script, h.module, h.args_start)


def scan(argv: Sequence[str], start: int, *, overrides: bool = False, short: bool = False,
         switches: frozenset[str] = frozenset()) -> tuple[list[Option], list[Override], list[int]]:
    """Flags from ``argv[start]`` on: each owns the tokens up to the next ``--flag`` (or ``key=value`` override when
    ``overrides``; or ``-x`` short option when ``short``, which takes one value). ``switches``: flags that never take
    a value. Returns (flags, overrides, indices of the other positional tokens)."""
    opts: list[Option] = []
    ovs: list[Override] = []
    positionals: list[int] = []
    i = start

    def is_override(tok: str) -> bool:
        return overrides and not tok.startswith("-") and "=" in tok and bool(re.match(r"^[A-Za-z_+~][\w.\[\]+~-]*=",
                                                                                     tok))

    def is_short(tok: str) -> bool:
        return short and bool(re.match(r"^-[A-Za-z][\w-]*$", tok))

    def starts_option(tok: str) -> bool:
        return (tok.startswith("--") and len(tok) > 2) or is_override(tok) or is_short(tok)

    while i < len(argv):
        tok = argv[i]
        if is_short(tok):
            has_value = i + 1 < len(argv) and not starts_option(argv[i + 1]) and tok[1:] not in switches
            end = i + 2 if has_value else i + 1
            opts.append(Option(tok[1:], i, end, tok, False, tuple(argv[i + 1:end])))
            i = end
            continue
        if tok.startswith("--") and len(tok) > 2:
            spelling, eq, value = tok.partition("=")
            if eq:
                opts.append(Option(spelling[2:], i, i + 1, spelling, True, (value,)))
                i += 1
                continue
            j = i + 1
            if spelling[2:] not in switches:
                while j < len(argv) and not starts_option(argv[j]):
                    j += 1
            opts.append(Option(spelling[2:], i, j, spelling, False, tuple(argv[i + 1:j])))
            i = j
        elif is_override(tok):
            key, _, value = tok.partition("=")
            ovs.append(Override(key, i, value))
            i += 1
        else:
            positionals.append(i)
            i += 1
    return opts, ovs, positionals


@dataclass
class Edit(ArgvEdit):
    """Pending token edits of one argument list, with the setters of Megatron's flags and overrides."""

    def set_option(self, options: Sequence[Option], names: Sequence[str], tokens: list[str] | None,
                   *, spelling: str) -> None:
        """Set the flag called any of ``names`` to ``tokens`` (its value tokens; ``[]`` a bare flag; ``None``
        removes it). The last occurrence keeps its position and spelling; others are removed; a new one is
        appended as ``spelling``."""
        occ = [o for o in options if o.name in names]
        if tokens is None:
            for o in occ:
                self.replace[o.start] = (o.end, [])
            return
        if not occ:
            self.append.extend([spelling, *tokens])
            return
        for o in occ[:-1]:
            self.replace[o.start] = (o.end, [])
        last = occ[-1]
        if last.inline and len(tokens) == 1:
            self.replace[last.start] = (last.end, [f"{last.spelling}={tokens[0]}"])
        else:
            self.replace[last.start] = (last.end, [last.spelling, *tokens])

    def set_override(self, ovs: Sequence[Override], key: str, value: str | None) -> None:
        """Set ``key=value`` in place (the last occurrence), append it when absent, drop it for ``None``."""
        occ = [o for o in ovs if o.key == key]
        if value is None:
            for o in occ:
                self.replace[o.index] = (o.index + 1, [])
            return
        if not occ:
            self.append.append(f"{key}={value}")
            return
        for o in occ[:-1]:
            self.replace[o.index] = (o.index + 1, [])
        self.replace[occ[-1].index] = (occ[-1].index + 1, [f"{key}={value}"])


# ---------------------------------------------------------------------------------------------- versions

def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``0.20.0rc1`` → ``(0, 20, 0)``; ``None`` when nothing numeric leads the text."""
    if not text:
        return None
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def version_in(version: str | None, spec: str) -> bool | None:
    """Whether ``version`` satisfies a PEP 440-style specifier of ``>=``, ``<``, ``<=``, ``>``, ``==`` clauses
    (``==0.2.*`` allowed); ``None`` when the version is unknown or unreadable."""
    v = version_tuple(version)
    if v is None:
        return None
    for clause in (c.strip() for c in spec.split(",") if c.strip()):
        m = re.match(r"^(>=|<=|==|!=|<|>)\s*([\d.]+)(\.\*)?$", clause)
        if not m:
            raise ValueError(f"unsupported version clause {clause!r}")
        op, ref_text, star = m.groups()
        ref = tuple(int(p) for p in ref_text.strip(".").split("."))
        n = max(len(v), len(ref))
        a, b = v + (0,) * (n - len(v)), ref + (0,) * (n - len(ref))
        if star:
            a = v[:len(ref)]
            b = ref
        ok = {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, "<": a < b, ">": a > b}[op]
        if not ok:
            return False
    return True


def check_version(what: str, version: str | None, spec: str) -> None:
    """Refuse a known ``version`` outside ``spec`` (an unknown version passes: the schema checks then decide)."""
    if version_in(version, spec) is False:
        raise RecipeError(f"{what} {version} is outside the versions attune's catalogue and parser cover ({spec}); "
                          "attune will not guess at its settings — use a covered version, or have attune's "
                          "catalogue extended for it")


def to_scalar(raw: Any) -> Any:
    """A command-line value read like YAML scalars (``4`` → 4, ``true`` → True, ``null`` → None, ``3e-4`` → 0.0003)."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


__all__ = ["REMOVE", "Edit", "Launch", "Option", "Override", "check_version", "norm", "scan", "split", "to_scalar",
           "version_in", "version_tuple"]
