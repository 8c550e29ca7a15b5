"""A starting knob declaration for a script attune has never seen (``attune knobs --framework command --suggest --
python train.py ...``), every guess marked for its owner to confirm.

What it reads: the flags on the command line, the script's argparse ``--help`` where it has one (flag names, choices,
``(default: X)``), and the script's source for a known step line (nanoGPT's ``iter N: loss X, time Yms``, a
HuggingFace ``Trainer``). What it guesses from a flag's name: the per-process batch, gradient accumulation, data-loader
workers, compile, activation checkpointing become knobs or the batch invariant; learning rate, steps, seed, precision,
data and model shape become contract; every other flag stays frozen (listed in a comment). Nothing is written: the
declaration goes to standard output, for the owner to check and save as ``knobs.yaml``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attune.frameworks.command import parse_argv

BATCH = re.compile(r"^(micro_?)?batch(_size)?$|^(per_device_train_|train_|micro_)batch_size$|^bs$|^mbs$")
ACCUMULATION = re.compile(r"^(gradient_|grad_)?acc(um(ulation)?|um)?(_steps|_iters)?$")
WORKERS = re.compile(r"^(dataloader_)?num_workers$|^workers$|^loader_workers$")
COMPILE = re.compile(r"^(torch_)?compile$")
CHECKPOINTING = re.compile(r"^(gradient|activation|grad)_checkpointing$|^recompute(_activations)?$|^grad_ckpt$")
CONTRACT = re.compile(r"(^|_)(lr|learning_rate|seed|max_iters|max_steps|steps|epochs?|num_train_epochs|iters|dtype|"
                      r"precision|bf16|fp16|fp8|tf32|amp|data|dataset|data_dir|data_path|train_file|weight_decay|"
                      r"warmup(_steps|_iters|_ratio)?|beta[12]|betas|eps|adam_\w+|grad_clip|max_grad_norm|clip|"
                      r"block_size|seq_len|seq_length|max_length|max_seq_length|context_length|n_layer|n_head|n_embd|"
                      r"layers|heads|hidden_size|dropout|bias|vocab_size|init_from|model|model_name|"
                      r"model_name_or_path|optimizer|optim|scheduler|lr_scheduler|decay_lr|min_lr|lr_decay_iters|"
                      r"label_smoothing|loss)$")


@dataclass
class Flag:
    """One flag the script takes: its spelling, the value the command gives it, what ``--help`` says."""

    spelling: str
    value: str | None = None
    choices: tuple[str, ...] = ()
    default: str | None = None
    switch: bool = False
    sources: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spelling.lstrip("-").replace("-", "_")


def read_help(argv: Sequence[str], cwd: Path, timeout_s: float = 60) -> tuple[list[Flag], str | None]:
    """The flags the script's ``--help`` lists (argparse's format), and why none were read (None when read)."""
    parsed = parse_argv(argv)
    command = list(parsed.argv[:parsed.args_start]) + ["--help"]
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [], f"`{' '.join(command)}` did not run: {err}"
    text = done.stdout + done.stderr
    if "usage:" not in text.lower():
        return [], f"`{' '.join(command)}` printed no argparse help (exit {done.returncode})"
    return parse_help(text), None


def parse_help(text: str) -> list[Flag]:
    """The options of an argparse help text: each entry's first long spelling, its metavar (choices ``{a,b}``; none
    for a switch) and the ``(default: X)`` its help text ends with, wrapped over lines as argparse wraps it."""
    entries: list[list[str]] = []
    for line in text.splitlines():
        if re.match(r"^ {2}-", line):
            parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            entries.append([parts[0], parts[1] if len(parts) > 1 else ""])
        elif entries and line.startswith("    ") and line.strip():
            entries[-1][1] += " " + line.strip()
        elif not line.startswith(" "):
            entries.append(["", ""])  # a section header ends the entry before it
    flags: list[Flag] = []
    for head, body in entries:
        m = re.match(r"(?:-\w(?: \S+)?, )?(--[\w.-]+)(?:[ =](\S+))?", head)
        if m is None or m.group(1) == "--help":
            continue
        metavar = (m.group(2) or "").rstrip(",")
        flag = Flag(m.group(1), sources=["--help"])
        if metavar.startswith("{"):
            flag.choices = tuple(metavar.strip("{}").split(","))
        flag.switch = not metavar
        d = re.search(r"\(default:\s*([^)]*)\)", body)
        if d:
            flag.default = d.group(1).strip()
        flags.append(flag)
    return flags


def suggest(argv: Sequence[str], cwd: Path, *, run_help: bool = True) -> str:
    """A declaration (YAML text with comments) for the command ``argv`` run in ``cwd``."""
    parsed = parse_argv(argv)
    found: dict[str, Flag] = {}
    notes: list[str] = []
    if run_help:
        helped, why = read_help(argv, cwd)
        if why:
            notes.append(f"# {why}: only the flags on the command line were read")
        for f in helped:
            found[f.spelling] = f
    for opt in parsed.options:
        f = found.setdefault(opt.spelling, Flag(opt.spelling))
        f.value = opt.values[0] if opt.values else None
        f.switch = f.switch and not opt.values
        f.sources.append("command line")
    script = parsed.head.script if parsed.head is not None else parsed.argv[0]
    steps = _steps_guess(cwd / script)
    knobs: list[str] = []
    contract: list[str] = []
    frozen: list[str] = []
    batch = accumulation = None
    for f in found.values():
        name = f.name
        if BATCH.match(name):
            batch = f
            knobs.append(_knob(f, "batch_per_process", [1, 2, 4, 8, 16, 32], "numerics_drift",
                               "same samples, summed in another order"))
        elif ACCUMULATION.match(name):
            accumulation = f
        elif WORKERS.match(name):
            knobs.append(_knob(f, "loader_workers", [0, 1, 2, 4], "numerics_drift",
                               "workers draw other random numbers where the dataset uses the global generator"))
        elif COMPILE.match(name):
            knobs.append(_knob(f, "compile", [False, True], "numerics_drift", "fused kernels round differently"))
        elif CHECKPOINTING.match(name):
            knobs.append(_knob(f, "checkpointing", [False, True], "preserving", "recomputes the same activations"))
        elif CONTRACT.search(name):
            contract.append(f.spelling)
        else:
            frozen.append(f.spelling)
    lines = ["# A starting knob declaration for attune (framework: command). Every line marked `guess` is one:",
             "# check it against your script, then save this as knobs.yaml and run",
             f"#   attune import --framework command --knobs knobs.yaml -- {' '.join(parsed.argv)}",
             *notes, "", f"steps: {steps[0]}" + (f"  # guess: {steps[1]}" if steps[1] else ""), ""]
    if batch is not None and accumulation is not None:
        acc_default = accumulation.value or accumulation.default
        lines += ["batch:  # guess: the work per optimizer step, which must not change",
                  f"  global: {batch.name} * {accumulation.name}  # guess: add the process count if each process "
                  "takes its own batch",
                  "  accumulation:", f"    flag: {accumulation.spelling}"]
        if acc_default and acc_default.isdigit():
            lines.append(f"    default: {acc_default}")
        lines.append("")
    elif batch is not None:
        lines += [f"# no gradient-accumulation flag was found: {batch.spelling} moves the global batch, so it cannot "
                  "be a knob until the script has one (or declare batch: yourself)", ""]
        knobs = [k for k in knobs if not k.startswith(f"  {batch.name}:")]
    lines += ["knobs:"] + (knobs or ["  # no flag looked like a knob: declare them yourself"])
    lines += ["  threads:  # guess: CPU threads per process",
              "    env: OMP_NUM_THREADS", "    values: ['1', '2', '4']", "    default: '1'", "    role: threads", ""]
    lines += ["# guess: these decide what is learned; attune never changes them",
              f"contract: [{', '.join(contract)}]" if contract else "contract: []"]
    if frozen:
        lines += ["", "# every other flag stays frozen as the command writes it: " + ", ".join(frozen)]
    return "\n".join(lines) + "\n"


def _knob(f: Flag, role: str, values: list[object], semantics: str, why: str) -> str:
    rendered = list(values)
    if f.choices:
        rendered = list(f.choices)
    default = f.default if f.default not in (None, "None") else f.value
    text = [f"  {f.name}:  # guess: {why}", f"    flag: {f.spelling}"]
    if f.switch and isinstance(values[0], bool):
        text.append("    switch: true")
    text.append("    values: [" + ", ".join(_yaml(v) for v in rendered) + "]")
    if default is not None:
        text.append(f"    default: {_yaml(default)}")
    text += [f"    semantics: {semantics}", f"    role: {role}"]
    return "\n".join(text)


def _yaml(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    if text in ("True", "False"):
        return text.lower()
    return text if re.fullmatch(r"-?\d+(\.\d+)?|true|false", text) else repr(text)


def _steps_guess(script: Path) -> tuple[str, str]:
    """The steps preset the script's source suggests, and why it is a guess (empty when it is the known line)."""
    try:
        source = script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        source = ""
    if re.search(r"""f["']iter \{[^}]*\}: loss \{""", source):
        return "nanogpt", ""
    if "Trainer(" in source:
        return "hf", "the script runs a HuggingFace Trainer: its per-step dicts"
    return ("step_loss", "lines like `step 10 | loss 2.31`; if your script prints otherwise, write pattern: a regular "
            "expression with named groups step, loss and time_ms")


__all__ = ["Flag", "parse_help", "read_help", "suggest"]
