"""Discovery reads the installed framework's own definitions: every TrainingArguments field of transformers, every
field of DeepSpeed's config models and every key its config reader looks up, each classified."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Literal, Optional

import pytest
from typer.testing import CliRunner

from attune import frameworks
from attune.frameworks.discover import (
    Setting,
    choices_of,
    discover,
    explore_domain,
    from_dataclass,
    pydantic_field_count,
    type_name,
)

transformers = pytest.importorskip("transformers")
deepspeed_spec = pytest.importorskip("deepspeed.runtime.config")


# -- generic machinery ---------------------------------------------------------------------------------------

class Device(enum.Enum):
    cpu = "cpu"
    nvme = "nvme"


@dataclasses.dataclass
class Args:
    lr: float = dataclasses.field(default=1e-3, metadata={"help": "Peak learning rate. Decays after."})
    steps: int = 10
    flag: bool = False
    mode: Literal["a", "b"] = "a"
    device: Optional[Device] = None  # noqa: UP045 - the annotation users write
    names: list[str] = dataclasses.field(default_factory=list)


def test_dataclass_fields_become_settings():
    found = {s.name: s for s in from_dataclass(Args)}
    assert list(found) == ["lr", "steps", "flag", "mode", "device", "names"]
    assert found["lr"].description == "Peak learning rate." and found["lr"].default == 1e-3
    assert found["mode"].type == "Literal['a', 'b']" and found["mode"].choices == ("a", "b")
    assert found["device"].type == "Optional[Device('cpu', 'nvme')]"
    assert choices_of(Optional[Device]) == ("cpu", "nvme")  # noqa: UP045 - the annotation users write
    assert found["names"].default == [] and type_name(list[str]) == "list[str]"


@pytest.mark.parametrize("setting,domain", [
    (Setting("a", "bool", False), (False, True)),
    (Setting("a", "Optional[bool]", None), (False, True)),
    (Setting("a", "Literal['x', 'y']", "x", choices=("x", "y")), ("x", "y")),
    (Setting("a", "int", 1000), (100, 500, 1000, 2000, 10000)),
    (Setting("a", "int", 0, minimum=0), (0, 1, 10, 100, 1000)),
    (Setting("a", "float", 0.8), (0.08, 0.4, 0.8, 1.6, 8.0)),
    (Setting("a", "int", -1), None),  # a sentinel
    (Setting("a", "Optional[int]", None), None),
    (Setting("a", "str", "x"), None),
    (Setting("a", "dict", {}), None),
])
def test_explore_domains(setting, domain):
    assert explore_domain(setting) == domain


# -- HF TrainingArguments ------------------------------------------------------------------------------------

def test_hf_discovery_lists_every_training_arguments_field():
    found = discover(frameworks.get("hf"))
    fields = [f.name for f in dataclasses.fields(transformers.TrainingArguments)]
    listed = [s.name for s in found.settings if s.source == "transformers.TrainingArguments"]
    assert listed == fields and len(fields) == len(set(fields))
    assert found.version == transformers.__version__
    c = found.counts()
    assert c["total"] == len(fields) + 2  # + the launcher's process count and the OpenMP threads
    from attune.frameworks.hf import catalogue as hfcat

    # 8 flag knobs + activation_checkpointing (the checkpointing knob's 5.23+ name) + process count + threads
    assert c["knob"] == 11 and c["derived"] == 1
    assert c["contract"] == len(set(hfcat.CONTRACT) & set(fields)) == 15  # warmup_ratio is gone in 5.24
    assert (c["total"], c["unclassified"], c["explorable"]) == (116, 89, 41)
    assert c["curated"] + c["unclassified"] == c["total"]
    by = {s.name: s for s in found.settings}
    assert by["per_device_train_batch_size"].classification == "knob"
    assert by["per_device_train_batch_size"].semantics == "numerics_drift"
    assert by["activation_checkpointing"].knob == "gradient_checkpointing"
    assert by["learning_rate"].classification == "contract" and by["gradient_accumulation_steps"].classification == "derived"
    assert by["dataloader_drop_last"].classification == "unclassified" and by["dataloader_drop_last"].explorable
    assert by["label_smoothing_factor"].classification == "unclassified"
    assert not by["label_smoothing_factor"].explorable  # a float defaulting to 0: no ladder
    assert by["report_to"].classification == "unclassified" and not by["report_to"].explorable


# -- DeepSpeed config models ---------------------------------------------------------------------------------

def test_deepspeed_discovery_lists_every_pydantic_field():
    from attune.frameworks.deepspeed.discover import MOUNTS, _load

    found = discover(frameworks.get("deepspeed"))
    assert found.version == "0.19.8"
    for key, ref in MOUNTS.items():
        model = _load(ref)
        listed = [s for s in found.settings if s.name.startswith(key + ".")]
        assert len(listed) == pydantic_field_count(model), key  # every field, nested models' fields too
        assert found.get(key) is not None
    total_models = sum(1 + pydantic_field_count(_load(ref)) for ref in MOUNTS.values())
    from_models = [s for s in found.settings if "(keys it reads)" not in s.source and s.source not in (
        "launcher (deepspeed --num_gpus, torchrun --nproc_per_node, accelerate launch --num_processes)",
        "environment") and s.name != "bfloat16"]
    assert len(from_models) == total_models == 171  # 158 fields of 20 models, 13 mounted sections
    zero = found.get("zero_optimization.stage3_prefetch_bucket_size")
    assert zero is not None and zero.default == 50_000_000 and "zero_optimization.prefetch_bucket_size" in zero.aliases
    assert zero.classification == "knob" and zero.semantics == "preserving"


def test_deepspeed_discovery_lists_every_key_the_config_reader_reads():
    from deepspeed.runtime import config as dsc

    from attune.frameworks.deepspeed.discover import _Recorder, _run

    reads: list = []
    _run(_Recorder({"train_batch_size": 1}, "", reads))
    top = {k for k, _ in reads} - set(dsc._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    found = discover(frameworks.get("deepspeed"))
    names = {s.name for s in found.settings}
    assert top <= names and len(top) == 49
    assert not set(dsc._REMOVED_TOP_LEVEL_CONFIG_KEYS) & names  # removed features are no settings
    by = {s.name: s for s in found.settings}
    assert by["gradient_clipping"].default == 1.0 and by["gradient_clipping"].classification == "contract"
    assert by["flops_profiler.module_depth"].default == -1 and by["activation_checkpointing"].type == "section"
    assert by["train_batch_size"].classification == "contract"
    assert by["gradient_accumulation_steps"].classification == "derived"


def test_deepspeed_counts_and_the_recorded_schema_match_the_installed_version():
    from attune.frameworks.deepspeed import schema
    from attune.frameworks.deepspeed.discover import raw_settings

    live = [(s.name, s.type, s.default, s.source, tuple(s.choices), s.minimum, tuple(s.aliases))
            for s in raw_settings()]
    recorded = [(s.name, s.type, s.default, s.source, tuple(s.choices), s.minimum, tuple(s.aliases))
                for s in schema.settings()]
    assert schema.VERSION == "0.19.8" and live == recorded  # regenerate: python -m ...deepspeed.discover --write-schema
    c = discover(frameworks.get("deepspeed")).counts()
    assert c["total"] == 328 and c["knob"] == 10 and c["derived"] == 1 and c["contract"] == 35
    assert c["unclassified"] == 282 and c["explorable"] == 167
    explorable = frameworks.get("deepspeed").catalogue().explorable
    assert len(explorable) == c["explorable"]  # one exploratory knob per explorable setting


def test_cli_discover(monkeypatch):
    from attune.cli import app

    res = CliRunner().invoke(app, ["knobs", "--framework", "deepspeed", "--discover", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["counts"]["total"] == len(data["settings"]) and data["version"] == "0.19.8"
    res = CliRunner().invoke(app, ["knobs", "--framework", "torch", "--discover"])
    assert res.exit_code == 2 and "cannot discover" in res.output
