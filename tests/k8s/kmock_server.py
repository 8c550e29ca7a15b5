"""Test-only: serve the kmock emulator (with :mod:`kmock_plus`) on loopback until SIGTERM: ``kmock_server.py PORT``.

Configured by the environment (the harness's :class:`KubeAPI` sets it):

* ``KMOCK_CRDS``: CRD YAML files (``os.pathsep``-separated) whose resources it serves with their schemas; default the
  repository's ``crds/attune.dev_*.yaml`` (an upgrade test points it at an older release's CRDs);
* ``KMOCK_WITHOUT``: resources not served (e.g. ``trainjobs``: Kubeflow Trainer not installed);
* ``KMOCK_TOKENS``: JSON ``{token: user}`` (none: no authentication, every request the admin's);
* ``KMOCK_AUDITED``: JSON list of users whose authorization decisions are recorded (the operator's);
* ``KMOCK_RBAC``: a JSON file of Roles, ClusterRoles and bindings stored at start (the chart's RBAC).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import kmock
import yaml

from tests.k8s.kmock_plus import KubernetesEmulatorPlus

ROOT = Path(__file__).resolve().parents[2]
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}


def crd_files() -> list[Path]:
    listed = os.environ.get("KMOCK_CRDS")
    if listed:
        return [Path(p) for p in listed.split(os.pathsep) if p]
    return sorted((ROOT / "crds").glob("attune.dev_*.yaml"))


def load(emu: KubernetesEmulatorPlus) -> None:
    """The resources, CRDs and RBAC objects the emulated cluster starts with."""
    without = set(os.environ.get("KMOCK_WITHOUT", "").split(","))
    emu.resources.load_bundled()  # v1/namespaces, configmaps, events: kopf waits for namespaces in discovery
    crds = kmock.resource(group="apiextensions.k8s.io", version="v1", plural="customresourcedefinitions")
    for path in crd_files():
        for crd in yaml.safe_load_all(path.read_text()):
            if crd and crd["spec"]["names"]["plural"] not in without:
                crd.setdefault("metadata", {}).update(uid=f"crd-{crd['metadata']['name']}", resourceVersion="1",
                                                      generation=1)
                emu.objects[crds, None, crd["metadata"]["name"]] = crd
                emu.register_crd(crd)
    # Kubeflow's CRDs: their schemas are not available here, so their objects are kept as sent (unknown fields kept)
    emu.resources["kubeflow.org/v1/pytorchjobs"] = kmock.ResourceInfo(
        kind="PyTorchJob", singular="pytorchjob", namespaced=True, verbs=VERBS, subresources={"status"})
    if "trainjobs" not in without:  # Kubeflow Trainer installed
        emu.resources["trainer.kubeflow.org/v1alpha1/trainjobs"] = kmock.ResourceInfo(
            kind="TrainJob", singular="trainjob", namespaced=True, verbs=VERBS, subresources={"status"})
    if os.environ.get("KMOCK_RBAC"):
        plurals = {"Role": "roles", "ClusterRole": "clusterroles", "RoleBinding": "rolebindings",
                   "ClusterRoleBinding": "clusterrolebindings"}
        for obj in json.loads(Path(os.environ["KMOCK_RBAC"]).read_text()):
            res = kmock.resource(group="rbac.authorization.k8s.io", version="v1", plural=plurals[obj["kind"]])
            meta = obj["metadata"]
            meta.update(uid=f"rbac-{meta['name']}", resourceVersion="1")
            emu.objects[res, meta.get("namespace"), meta["name"]] = obj


async def main(port: int) -> None:
    tokens = json.loads(os.environ.get("KMOCK_TOKENS") or "{}")
    audited = set(json.loads(os.environ.get("KMOCK_AUDITED") or "[]"))
    async with KubernetesEmulatorPlus(tokens=tokens, audited=audited) as emu, \
            kmock.Server(emu, host="127.0.0.1", port=port):
        load(emu)
        stop = asyncio.Event()
        for s in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(s, stop.set)
        sys.stdout.write(f"listening {port}\n")
        sys.stdout.flush()
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
