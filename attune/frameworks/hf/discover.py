"""Every ``TrainingArguments`` field of the installed transformers, classified against the hf catalogue.

``attune knobs --framework hf --discover`` lists them: the catalogue's flag knobs (and the checkpointing flag's
5.23+ name), the derived ``gradient_accumulation_steps``, the contract flags, and every other field unclassified
(frozen: the gate refuses a change). The launcher's process count and the OpenMP threads are knobs too, listed
after the fields. Imports transformers (slow); nothing else in the hf package does.
"""

from __future__ import annotations

from typing import Any

from attune.frameworks.discover import Discovery, Setting, classify, from_dataclass, installed_version, require


def training_arguments() -> type:
    require("transformers", "hf")
    from transformers import TrainingArguments

    return TrainingArguments


def classifier(setting: Setting) -> tuple[str, str | None, str | None]:
    from attune.frameworks.hf import catalogue as cat

    knobs = {k.name: k for k in cat.KNOBS}
    name = setting.name
    if name == cat.CHECKPOINTING_V5:
        return "knob", knobs[cat.CHECKPOINTING].semantics.value, cat.CHECKPOINTING
    if name in cat.FLAG_KNOBS:
        return "knob", knobs[name].semantics.value, name
    if name == cat.ACCUMULATION:
        return "derived", cat.D.value, cat.PER_DEVICE
    if name in cat.CONTRACT:
        return "contract", "contract", None
    return "unclassified", None, None


def discover(framework: Any = None) -> Discovery:
    """The installed transformers' TrainingArguments fields, classified (plus the launcher and env knobs)."""
    from attune.frameworks.hf import catalogue as cat

    cls = training_arguments()
    fields = classify(from_dataclass(cls, source="transformers.TrainingArguments"), classifier)
    knobs = {k.name: k for k in cat.KNOBS}
    extra = (Setting(name=cat.NPROC, type="int", default=1, source="launcher (torchrun --nproc_per_node, accelerate "
                     "launch --num_processes)", classification="knob", semantics=knobs[cat.NPROC].semantics.value,
                     knob=cat.NPROC),
             Setting(name=cat.OMP_ENV, type="str", default="", source="environment", classification="knob",
                     semantics=knobs[cat.OMP_ENV].semantics.value, knob=cat.OMP_ENV))
    return Discovery(framework="hf", version=installed_version("transformers"),
                     sources=("transformers.TrainingArguments",), settings=(*fields, *extra))


__all__ = ["classifier", "discover", "training_arguments"]
