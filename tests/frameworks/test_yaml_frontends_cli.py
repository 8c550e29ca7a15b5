"""LLaMA-Factory and axolotl recipes on the command line: `attune gate check --set KEY=VALUE` in each tool's own key
names (a contract key is refused, a knob admitted) and `attune render --set` changing exactly that key of the config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

FRAMEWORKS = Path(__file__).parent
CASES = {
    "llamafactory": (FRAMEWORKS / "llamafactory" / "fixtures" / "lora_sft_small.yaml", "llamafactory-cli train",
                     ["cutoff_len=4096", "packing=true", "learning_rate=1e-3", "template=qwen"],
                     "per_device_train_batch_size=2"),
    "axolotl": (FRAMEWORKS / "axolotl" / "fixtures" / "lora-packed.yml", "axolotl train",
                ["sample_packing=false", "sequence_len=4096", "learning_rate=1e-3", "num_epochs=2"],
                "micro_batch_size=4"),
}


def attune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "ATTUNE_LESSONS": "off"}
    return subprocess.run([sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


@pytest.mark.parametrize("framework", sorted(CASES))
def test_contract_keys_are_refused_and_a_knob_renders_as_exactly_its_key(framework, tmp_path):
    config, tool, contract, knob = CASES[framework]
    shutil.copy(config, tmp_path / config.name)
    res = attune("import", "--framework", framework, "-o", "recipe.yaml", "--", *tool.split(), config.name,
                 cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for setting in contract:
        res = attune("gate", "check", "recipe.yaml", "--set", setting, cwd=tmp_path)
        key = setting.split("=")[0]
        assert res.returncode == 1 and f"{framework}.{key}" in res.stdout, (setting, res.stdout, res.stderr)
    res = attune("gate", "check", "recipe.yaml", "--set", knob, cwd=tmp_path)
    assert res.returncode == 0 and "ADMITTED" in res.stdout, res.stdout
    res = attune("render", "recipe.yaml", "--set", knob, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rendered = yaml.safe_load(json.loads(res.stdout)["files"][config.name])
    original = yaml.safe_load(config.read_text())
    differing = {k for k in set(rendered) | set(original) if rendered.get(k) != original.get(k)}
    key, value = knob.split("=")
    assert key in differing and rendered[key] == int(value)
    assert differing <= {key, "gradient_accumulation_steps"}  # the accumulation is derived to keep the global batch
