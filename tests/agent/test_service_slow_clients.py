"""A sidecar that slow or stalled clients cannot starve: a body is read within a deadline and a size bound before
a concurrency slot is taken. Several connections that announce a body and send only part of it hold no slot:
`/v1/propose` keeps answering, and the stalled ones are answered 408 when their deadline passes. Real HTTP on
the loopback (aiohttp's test server), raw sockets for the stalled clients."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from attune.recipe.io import recipe_to_dict
from attune.sidecar import make_app
from attune.testing.factories import tiny_recipe
from tests.agent.helpers import baseline_record

pytestmark = pytest.mark.asyncio


def _body() -> dict:
    r = tiny_recipe()
    return {"policy": "playbook", "baseline": recipe_to_dict(r),
            "records": [baseline_record(r).model_dump(mode="json")], "noise_floor": 0.03}


async def _stall(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/propose HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"policy\": ")
    await writer.drain()
    return reader, writer


async def test_stalled_bodies_hold_no_slot_and_time_out():
    app = make_app(lessons=None, max_concurrency=2, body_timeout_s=10.0)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        host, port = client.server.host, client.server.port
        stalled = [await _stall(host, port) for _ in range(6)]  # three times the slots
        await asyncio.sleep(0.5)  # they are all mid-body now
        for _ in range(3):
            resp = await client.post("/v1/propose", data=json.dumps(_body()),
                                     headers={"Content-Type": "application/json"})
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["action"] in ("change", "stop")
        # answered while every stalled client still waits for its deadline: the proposals did not queue behind them
        assert all(not reader.at_eof() and not reader._buffer for reader, _ in stalled)  # noqa: SLF001
        # each stalled client is answered 408 once its deadline passes, as JSON, and the connection ends
        for reader, writer in stalled:
            head = await asyncio.wait_for(reader.read(4096), timeout=30)
            assert head.startswith(b"HTTP/1.1 408"), head[:200]
            assert b"did not arrive within 10 s" in head
            writer.close()
    finally:
        await client.close()
