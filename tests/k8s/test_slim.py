"""Issue 39, item 12: the slim operator image (docker/Dockerfile.operator: extras k8s and llm, no torch) must be
enough for what runs in it. Here, without building it: the operator's CLI, a whole run reconciled to its end, the
webhook's checks and the agent sidecar's service run in a process where importing torch or any training framework
fails. (Building the image itself is the opt-in tests/image suite: ATTUNE_IMAGE_TEST=1.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.k8s
REPO = Path(__file__).resolve().parents[2]

BLOCK = """
import importlib.abc, sys
FRAMEWORKS = {"torch", "transformers", "deepspeed", "lightning", "trl", "accelerate", "datasets", "tensorboard",
              "megatron", "nemo", "torchtitan"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in FRAMEWORKS:
            raise ImportError(f"{name} is not in the slim image")
sys.meta_path.insert(0, Block())
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin",
                                                                             "PYTHONPATH": str(REPO)})


def test_the_blocker_blocks():
    res = _run("import torch")
    assert res.returncode != 0 and "not in the slim image" in res.stderr


def test_the_operator_reconciles_a_whole_run_and_its_webhook_judges_without_torch():
    res = _run("""
        from attune.operator import handlers, webhook
        from tests.k8s.conftest import good_run
        from tests.k8s.fakes import FakePorts, drive, tuning_run
        run = drive(tuning_run(), FakePorts())
        assert run["status"]["phase"] == "Succeeded", run["status"]
        bad = good_run("r", "http://prom.ml.svc", None)
        bad["spec"]["metrics"]["namespaceLabel"] = 'namespace="team-b", x!'
        assert webhook.run_problems(bad)
        print("reconciled", run["status"]["outcome"])
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reconciled GainNotCertified" in res.stdout


@pytest.mark.parametrize("argv", [("operator", "run", "--help"), ("agent", "serve", "--help")])
def test_the_operator_and_agent_commands_start_without_torch(argv):
    res = _run("""
        import sys
        from attune.cli import main
        sys.argv = ["attune", *sys.argv[1:]]
        main()
    """, *argv)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Usage" in res.stdout


def test_the_agent_sidecar_proposes_without_torch():
    res = _run("""
        import asyncio
        from aiohttp.test_utils import TestClient, TestServer
        from attune.sidecar import make_app
        from attune.recipe.io import recipe_to_dict
        from attune.testing.factories import tiny_recipe
        from tests.agent.helpers import baseline_record

        async def main():
            r = tiny_recipe()
            body = {"policy": "playbook", "baseline": recipe_to_dict(r),
                    "records": [baseline_record(r).model_dump(mode="json")], "noise_floor": 0.03}
            client = TestClient(TestServer(make_app(lessons=None)))
            await client.start_server()
            try:
                resp = await client.post("/v1/propose", json=body)
                data = await resp.json()
                print("proposed", resp.status, data["action"], data["source"])
            finally:
                await client.close()

        asyncio.run(main())
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "proposed 200 change playbook" in res.stdout
