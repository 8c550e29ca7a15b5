"""The user's own DeepSpeed launch, read token by token (nothing here imports deepspeed).

A launch is ``LAUNCHER [launcher options] SCRIPT ARGS``:

- launchers: ``deepspeed [--num_gpus N] train.py`` (DeepSpeed's own runner; ``--num_accelerators`` is the same
  option), ``torchrun [--nproc_per_node N] train.py`` (also ``python -m torch.distributed.run``), ``accelerate
  launch [--num_processes N] train.py`` and a bare ``python train.py``; ``-m module`` / ``--module`` may stand
  for the script;
- ARGS: the script's own flags. One of them names the DeepSpeed JSON config: ``--deepspeed_config ds.json``
  (what ``deepspeed.add_config_arguments`` defines), ``--deepspeed ds.json`` (the HF ``TrainingArguments`` flag),
  ``--ds_config ds.json`` or ``--deepspeed_config_file ds.json``; the importer can be told another name.

:func:`parse` keeps every token's position so the renderer changes only the tokens a knob controls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attune.errors import RecipeError
from attune.frameworks.cmdline import (
    ACCELERATE_SWITCHES,
    TORCHRUN_SWITCHES,
    Option,
    last_option,
    node_count,
    norm,
    process_count,
    scan_flags,
    skip_tokens,
    split_launch,
)

ACCEPTED = ("deepspeed [--num_gpus N] train.py --deepspeed_config ds.json ...",
            ("torchrun [--standalone] [--nproc_per_node N] train.py --deepspeed_config ds.json ... "
             "(or python -m torch.distributed.run ...)"),
            "accelerate launch [--num_processes N] train.py --deepspeed ds.json ... (HF Trainer)",
            "python train.py --deepspeed ds.json ... (HF Trainer, one process)")

#: script flags that name the DeepSpeed config, in the order they are looked for
CONFIG_FLAGS = ("deepspeed_config", "deepspeed", "ds_config", "deepspeed_config_file")

#: the deepspeed runner's options without a value (from deepspeed 0.19.8's ``launcher/runner.py`` parser)
DEEPSPEED_SWITCHES = frozenset({"h", "help", "module", "no_python", "no_local_rank", "no_ssh", "no_ssh_check",
                                "force_multi", "save_pid", "bind_cores_to_rank", "q", "quiet", "elastic_training"})
#: the launcher option that sets the processes per node
NPROC_OPTION = {"deepspeed": ("num_gpus", "num_accelerators"), "torchrun": ("nproc_per_node",),
                "accelerate": ("num_processes",), "python": ()}


@dataclass(frozen=True)
class ParsedLaunch:
    argv: tuple[str, ...]
    launcher: str  # deepspeed | torchrun | accelerate | python
    script_index: int  # index of the script token (of ``-m`` for ``python -m module``)
    script: str
    module: bool
    launcher_options: tuple[Option, ...]
    args_start: int
    options: tuple[Option, ...]  # the script's flags
    positionals: tuple[tuple[int, str], ...]
    config_option: Option | None  # the flag naming the DeepSpeed config (None: no config on the command line)

    @property
    def config_path(self) -> str | None:
        opt = self.config_option
        return opt.values[0] if opt is not None and len(opt.values) == 1 else None

    def settings(self) -> dict[str, object]:
        """The script's flags as written: ``name → raw`` (``None`` for a bare switch; last occurrence wins)."""
        return {o.name: o.raw for o in self.options}

    def option(self, name: str) -> Option | None:
        return last_option(self.options, name)

    def launcher_option(self, *names: str) -> Option | None:
        return last_option(self.launcher_options, *names)

    def launcher_switch(self, name: str) -> bool:
        return any(o.name == name for o in self.launcher_options)

    def nproc(self, default: int = 1) -> int:
        """Processes per node the launcher starts (``default`` where the launch does not say)."""
        if self.launcher == "python":
            return 1
        n = process_count(self.launcher_option(*NPROC_OPTION[self.launcher]))
        return default if n is None else n

    @property
    def nnodes(self) -> int:
        names = {"deepspeed": ("num_nodes",), "torchrun": ("nnodes",), "accelerate": ("num_machines",)}
        opt = self.launcher_option(*names.get(self.launcher, ()))
        return node_count(opt) or 1

    def launcher_tokens(self) -> list[str]:
        """The launcher part of the argument list without the process-count option (for the contract)."""
        opt = self.launcher_option(*NPROC_OPTION[self.launcher])
        return skip_tokens(self.argv, [opt] if opt else [], self.script_index)


def parse(argv: Sequence[str], *, config_flag: str | None = None, files: Sequence[str] = ()) -> ParsedLaunch:
    """Split a launch into launcher, script and the script's flags; :class:`RecipeError` naming what is wrong.

    The config flag is ``config_flag`` where given, else the first of :data:`CONFIG_FLAGS` the launch has, else
    the flag whose value is one of ``files`` (a recipe carries only its config: that is how a flag the importer
    was told about is found again)."""
    argv = tuple(str(a) for a in argv)
    h = split_launch(argv, {"deepspeed": DEEPSPEED_SWITCHES, "torchrun": TORCHRUN_SWITCHES,
                            "accelerate": ACCELERATE_SWITCHES}, accepted=ACCEPTED,
                     unknown="attune's deepspeed framework imports a DeepSpeed training script started by deepspeed, "
                             "torchrun, accelerate launch or python")
    launcher, launcher_opts, module, script_index, i = h.launcher, list(h.options), h.module, h.script_index, \
        h.args_start - 1
    opts, positionals = scan_flags(argv, i + 1)
    names = (config_flag,) if config_flag else CONFIG_FLAGS
    config_option = None
    for name in names:
        found = [o for o in opts if o.name == norm(name) and len(o.values) == 1]
        if found:
            config_option = found[-1]
            break
    if config_option is None and not config_flag:
        config_option = next((o for o in reversed(opts) if len(o.values) == 1 and o.values[0] in files), None)
    if config_flag and config_option is None:
        raise RecipeError(f"the launch has no --{config_flag} PATH, which names its DeepSpeed config")
    return ParsedLaunch(argv=argv, launcher=launcher, script_index=script_index, script=argv[i], module=module,
                        launcher_options=tuple(launcher_opts), args_start=i + 1, options=tuple(opts),
                        positionals=tuple(positionals), config_option=config_option)


__all__ = ["ACCEPTED", "CONFIG_FLAGS", "DEEPSPEED_SWITCHES", "NPROC_OPTION", "ParsedLaunch", "parse"]
