"""A starting knob declaration for a script attune has never seen (``attune knobs --framework command --suggest --
python train.py ...``), every guess marked for its owner to confirm.

What it reads, never running the script (:mod:`attune.frameworks.command.source`: a script that does not stop at
``--help`` would start a real training run): the flags on the command line, the config files it names (nanoGPT's
``config/x.py``), and the script's source: its argparse / click / HfArgumentParser / jsonargparse options or its
nanoGPT-style module-level settings, a known step line (nanoGPT's ``iter N: loss X, time Yms``, a HuggingFace
``Trainer``), and the hazards the loss check must know of (evaluation sharing training's random generator, a printed
loss that is one micro-step's, dropout).

What it guesses from a setting's name: the per-process batch, gradient accumulation, data-loader workers, compile,
activation checkpointing become knobs or the batch invariant; learning rate, steps, seed, warm-up, precision, data,
dropout and model shape become contract, whether the command line sets them or only the source does; a thread count
within the CPUs this process may use; the token count per sample from the sequence length (``--block_size``,
``--seq_len``, ...). Nothing is written: the declaration goes to standard output, for the owner to check and save
as ``knobs.yaml``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.frameworks.command import flag_source, parse_argv
from attune.frameworks.command.declaration import HazardKind
from attune.frameworks.command.source import (
    SEQUENCE_NAMES,
    Assigned,
    ScriptSource,
    config_assignments,
    hazards,
    read_script,
)

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
#: evaluation's schedule: contract where evaluation draws from training's generator (when it runs decides the samples)
EVAL_SCHEDULE = re.compile(r"^eval_(interval|iters|steps|every|batches)$")


@dataclass
class Flag:
    """One setting the script takes: its spelling, where the launch sets it, what the source says of it."""

    spelling: str
    value: Any = None  # as the launch has it (a command-line word, a config file's literal); None: not set
    choices: tuple[Any, ...] = ()
    default: Any = None
    switch: bool = False
    line: int = 0
    on_command_line: bool = False
    sources: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spelling.lstrip("-").replace("-", "_")

    @property
    def current(self) -> Any:
        """What the script runs with: the launch's value, else its own default."""
        return self.value if self.value is not None else self.default


def cpus() -> int:
    """The CPUs this process may run on (its affinity where the system has one, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _flags(src: ScriptSource, argv: Sequence[str], cwd: Path, notes: list[str]) -> dict[str, Flag]:
    parsed = parse_argv(argv)
    configured: dict[str, Assigned] = {}
    for position, word in parsed.config_files():
        try:
            text = (Path(word) if Path(word).is_absolute() else cwd / word).read_text(encoding="utf-8")
            configured.update(config_assignments(word, text, position, ()))
        except (OSError, UnicodeDecodeError) as err:
            notes.append(f"# the config file {word} could not be read ({err}): its settings are not counted")
    found: dict[str, Flag] = {}
    for s in src.settings.values():
        found[s.flag] = Flag(s.flag, choices=s.choices, default=s.default if s.known else None, switch=s.switch,
                             line=s.line, sources=[s.origin])
    for opt in parsed.options:
        f = found.setdefault(opt.spelling, Flag(opt.spelling))
        f.on_command_line = True
        f.switch = f.switch and not opt.values
        f.sources.append("command line")
    for f in found.values():
        where = flag_source(parsed, configured, f.spelling)
        if where.kind != "absent":
            f.value = where.python_value if where.kind == "config" or where.token is not None else True
    for name, assigned in configured.items():  # a config file may set what the source does not show
        if f"--{name}" not in found:
            found[f"--{name}"] = Flag(f"--{name}", value=assigned.value, sources=[assigned.where])
    return found


def suggest(argv: Sequence[str], cwd: Path) -> str:
    """A declaration (YAML text with comments) for the command ``argv`` run in ``cwd``, read without running it."""
    parsed = parse_argv(argv)
    script = parsed.head.script if parsed.head is not None and not parsed.head.module else parsed.argv[0]
    src = read_script(Path(script) if Path(script).is_absolute() else cwd / script)
    notes = [f"# {n}" for n in src.notes]
    if src.configurator:
        notes.append(f"# {src.name}'s settings are module-level globals that `--name=value` and config files "
                     "override (nanoGPT's configurator): read from its source, not by running it")
    found = _flags(src, argv, cwd, notes)
    seen = hazards(src, {f.name: f.current for f in found.values()})
    kinds = {h.kind for h in seen}
    knobs: list[str] = []
    contract: list[str] = []
    frozen: list[str] = []
    schedule: list[str] = []  # evaluation's schedule, contract because evaluation shares training's generator
    batch = accumulation = None
    for f in sorted(found.values(), key=lambda f: (not f.on_command_line, f.line)):
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
        elif HazardKind.EVAL_SHARES_GENERATOR in kinds and EVAL_SCHEDULE.match(name):
            contract.append(f.spelling)
            schedule.append(f.spelling)
        elif f.on_command_line:
            frozen.append(f.spelling)
    lines = ["# A starting knob declaration for attune (framework: command). Every line marked `guess` is one:",
             "# check it against your script, then save this as knobs.yaml and run",
             f"#   attune import --framework command --knobs knobs.yaml -- {' '.join(parsed.argv)}",
             *notes, ""]
    steps = _steps_guess(src.text)
    lines += [f"steps: {steps[0]}" + (f"  # guess: {steps[1]}" if steps[1] else "")]
    if batch is not None and accumulation is not None:
        lines += _tokens(found)
        lines += ["", "batch:  # guess: the work per optimizer step, which must not change",
                  f"  global: {batch.name} * {accumulation.name}  # guess: add the process count if each process "
                  "takes its own batch",
                  "  accumulation:", f"    flag: {accumulation.spelling}"]
        own = accumulation.default if _whole(accumulation.default) else accumulation.current
        if _whole(own):
            lines.append(f"    default: {int(str(own))}")
        lines.append("")
    elif batch is not None:
        lines += ["# no token count: add tokens_per_step: N (the tokens one optimizer step trains on)", "",
                  f"# no gradient-accumulation setting was found: {batch.spelling} moves the global batch, so it "
                  "cannot be a knob until the script has one (or declare batch: yourself)", ""]
        knobs = [k for k in knobs if not k.startswith(f"  {batch.name}:")]
    else:
        lines += ["# no token count: add tokens_per_step: N (the tokens one optimizer step trains on)", ""]
    lines += ["knobs:"] + (knobs or ["  # no setting looked like a knob: declare them yourself"])
    lines += _threads()
    lines += ["", "# guess: these decide what is learned; attune never changes them"]
    if schedule:
        lines += [f"# ({', '.join(schedule)}: when evaluation runs decides which samples training draws, see the "
                  "eval_shares_generator hazard below)"]
    lines += [
              f"contract: [{', '.join(contract)}]" if contract else "contract: []"]
    lines += ["", *_facts(seen)]
    if frozen:
        lines += ["", "# every other flag stays frozen as the command writes it: " + ", ".join(frozen)]
    rest = [f.name for f in found.values() if not f.on_command_line and f.spelling not in contract
            and not any(k.startswith(f"  {f.name}:") for k in knobs) and f is not accumulation]
    if rest:
        more = f", and {len(rest) - 12} more" if len(rest) > 12 else ""
        lines += ["# settings the script reads that the command does not set (attune never adds them): "
                  + ", ".join(rest[:12]) + more]
    return "\n".join(lines) + "\n"


def _whole(value: Any) -> bool:
    """A whole number, as a literal or a command-line word."""
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.isdigit())


def _tokens(found: dict[str, Flag]) -> list[str]:
    """``tokens_per_sample`` from the sequence length, where the launch or the source shows one."""
    for name in SEQUENCE_NAMES:
        f = found.get(f"--{name}")
        if f is None or not _whole(f.current):
            continue
        where = "the command line" if f.on_command_line else f"its default, line {f.line}" if f.line else \
            ", ".join(f.sources)
        return [f"tokens_per_sample: {int(str(f.current))}  # guess: {f.spelling} ({where}): the tokens in one "
                "sample"]
    return ["# no sequence length was found: add tokens_per_sample: N (the tokens in one sample), or attune "
            "cannot measure a trial"]


def _threads() -> list[str]:
    n = cpus()
    if n < 2:
        return ["  # this process may use 1 CPU here: no threads knob (add one, env OMP_NUM_THREADS, where the job "
                "runs on more)"]
    values = [str(v) for v in (1, 2, 4, 8, 16, 32, 64, 128) if v <= n]
    return ["  threads:  # guess: CPU threads per process, within the "
            f"{n} CPUs this process may use", "    env: OMP_NUM_THREADS",
            "    values: [" + ", ".join(f"'{v}'" for v in values) + "]",
            f"    default: '{values[-1]}'  # torch's own: one thread per CPU", "    role: threads"]


def _facts(seen: list[Any]) -> list[str]:
    """The declaration's facts for the loss check, each hazard seen in the source with the line saying why."""
    kinds = {h.kind: h for h in seen}
    out = ["# what the loss check must know of the script (read from its source; false or true without a hazard "
           "line above it: nothing was seen, a guess)"]
    for h in seen:
        out.append(f"# hazard: {h.why}")
    out.append(f"loss_is_step_mean: {'false' if HazardKind.LOSS_NOT_STEP_MEAN in kinds else 'true'}")
    out.append(f"eval_shares_generator: {'true' if HazardKind.EVAL_SHARES_GENERATOR in kinds else 'false'}")
    out.append(f"dropout: {'true' if HazardKind.DROPOUT in kinds else 'false'}")
    return out


def _knob(f: Flag, role: str, values: list[Any], semantics: str, why: str) -> str:
    rendered = list(f.choices) if f.choices else list(values)
    current = f.current
    if isinstance(current, str) and current.isdigit():
        current = int(current)
    if isinstance(current, int) and not isinstance(current, bool) and current not in rendered and all(
            isinstance(v, int) for v in rendered):
        rendered = sorted({*rendered, current})  # the launch's own value must be legal
    default = f.default if f.default is not None else f.value
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


def _steps_guess(source: str) -> tuple[str, str]:
    """The steps preset the script's source suggests, and why it is a guess (empty when it is the known line)."""
    if re.search(r"""f["']iter \{[^}]*\}: loss \{""", source):
        return "nanogpt", ""
    if "Trainer(" in source:
        return "hf", "the script runs a HuggingFace Trainer: its per-step dicts"
    return ("step_loss", "lines like `step 10 | loss 2.31`; if your script prints otherwise, write pattern: a regular "
            "expression with named groups step, loss and time_ms")


__all__ = ["Flag", "cpus", "suggest"]
