"""``kubectl attune`` on bad input: a clear line and exit status 1 or 2, never a traceback (the plugin's happy path
runs through the real kubectl in tests/k8s/test_real_hf_e2e.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.k8s.realcluster import ControlPlane

PLUGIN = str(Path(sys.executable).parent / "kubectl-attune")


def _plugin(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PLUGIN, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECONFIG": str(kubeconfig)})


def test_a_kubeconfig_it_cannot_read_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\n")
    res = _plugin("list", kubeconfig=bad)
    assert res.returncode == 2 and "kubeconfig" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.k8s
def test_a_run_that_is_not_there_and_an_empty_namespace(crds: ControlPlane) -> None:
    empty = crds.namespace("empty")
    try:
        res = _plugin("list", "-n", empty, kubeconfig=crds.kubeconfig)
        assert res.returncode == 0 and f"No TuningRuns found in namespace {empty}" in res.stderr, res.stderr
        for cmd in (("trials", "nope"), ("export", "nope"), ("report", "nope")):
            res = _plugin(*cmd, "-n", empty, kubeconfig=crds.kubeconfig)
            assert res.returncode == 1 and '"nope" not found (404)' in res.stderr, (cmd, res.stderr)
            assert "Traceback" not in res.stderr
    finally:
        crds.delete_namespace(empty)
