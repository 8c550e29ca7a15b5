"""The core (recipe, engine, gate, agent, policies, backends, sim, trainer) never imports Kubernetes code."""

from __future__ import annotations

import json
import subprocess
import sys

CORE = ["attune.recipe", "attune.engine.loop", "attune.gate", "attune.gate.verify", "attune.agent",
        "attune.policies.playbook", "attune.policies.llm", "attune.sidecar", "attune.policies",
        "attune.backends.local", "attune.backends.simulated", "attune.sim.megatron", "attune.bench.run",
        "attune.api"]
FORBIDDEN = ("kopf", "kubernetes", "kr8s")


def test_core_is_free_of_kubernetes_imports():
    code = ("import importlib, json, sys\n"
            f"for m in {CORE!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(out.stdout)
    bad = [m for m in loaded if m.split(".")[0] in FORBIDDEN]
    assert not bad, f"core modules pulled in {bad}"


def test_simulator_does_not_need_torch():
    code = ("import json, sys\nimport attune.sim, attune.backends.simulated, attune.sim.megatron\n"
            "print(json.dumps('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) is False
