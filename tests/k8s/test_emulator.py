"""The emulated API server keeps the promise kopf's list-then-watch relies on: a watch started from a list's
resourceVersion sends every object the list did not hold, even a create that raced the list for the store's lock."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import aiohttp
import kmock
import pytest

from tests.k8s.harness import NS, free_port
from tests.k8s.kmock_plus import KubernetesEmulatorPlus

pytestmark = [pytest.mark.k8s, pytest.mark.asyncio,
              pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")]  # kmock's own


async def _until(cond: Callable[[], bool], what: str, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _waiting(lock: asyncio.Lock) -> int:
    return len(lock._waiters or ())  # noqa: SLF001 - the only way to see who queues on the emulator's store


async def test_a_create_racing_a_list_is_sent_by_the_watch_from_the_lists_version():
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v1/namespaces/{NS}/configmaps"
    async with KubernetesEmulatorPlus() as emu, kmock.Server(emu, host="127.0.0.1", port=port), \
            aiohttp.ClientSession() as http:
        emu.resources.load_bundled()
        lock = emu._lock  # noqa: SLF001 - the store's lock, held by a write while its event is delivered
        await lock.acquire()
        listing = asyncio.create_task(http.get(base))
        await _until(lambda: _waiting(lock) == 1, "the list to queue on the store")
        lock.release()  # kmock's request handler takes the lock once before the list's snapshot takes it again:
        await lock.acquire()  # hold it again, so that the list waits to take its snapshot
        await _until(lambda: _waiting(lock) == 1, "the list to queue for its snapshot")
        creating = asyncio.create_task(http.post(base, json={"metadata": {"name": "late"}, "data": {}}))
        await _until(lambda: _waiting(lock) == 2, "the create to queue behind it")
        lock.release()
        listed = await (await listing).json()
        assert (await creating).status == 201
        assert [o["metadata"]["name"] for o in listed["items"]] == []  # the list came first: it cannot hold it
        since = listed["metadata"]["resourceVersion"]
        async with http.get(base, params={"watch": "true", "resourceVersion": since, "timeoutSeconds": "1"}) as resp:
            events = [json.loads(line) for line in (await resp.text()).splitlines() if line.strip()]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "late")]
