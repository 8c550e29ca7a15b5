"""Test-only: serve the kmock emulator (with :mod:`kmock_plus`) on loopback until SIGTERM: ``kmock_server.py PORT``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import kmock

from tests.k8s.kmock_plus import KubernetesEmulatorPlus

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


async def main(port: int) -> None:
    async with KubernetesEmulatorPlus() as emu, kmock.Server(emu, host="127.0.0.1", port=port):
        emu.resources.load_bundled()  # v1/namespaces, configmaps, events: kopf waits for namespaces in discovery
        emu.resources["attune.dev/v1alpha1/tuningruns"] = kmock.ResourceInfo(
            kind="TuningRun", singular="tuningrun", namespaced=True, verbs=VERBS, subresources={"status"})
        emu.resources["attune.dev/v1alpha1/tuningtrials"] = kmock.ResourceInfo(
            kind="TuningTrial", singular="tuningtrial", namespaced=True, verbs=VERBS, subresources={"status"})
        emu.resources["kubeflow.org/v1/pytorchjobs"] = kmock.ResourceInfo(
            kind="PyTorchJob", singular="pytorchjob", namespaced=True, verbs=VERBS, subresources={"status"})
        if "trainjobs" not in os.environ.get("KMOCK_WITHOUT", "").split(","):  # Kubeflow Trainer installed
            emu.resources["trainer.kubeflow.org/v1alpha1/trainjobs"] = kmock.ResourceInfo(
                kind="TrainJob", singular="trainjob", namespaced=True, verbs=VERBS, subresources={"status"})
        stop = asyncio.Event()
        for s in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(s, stop.set)
        sys.stdout.write(f"listening {port}\n")
        sys.stdout.flush()
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
