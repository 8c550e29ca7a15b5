"""The toy framework's trainer: a plain Python loop (no torch) that "trains" for ``--steps`` steps.

Each step does ``--compute-ms`` of fixed work plus ``--host-ms`` of per-call overhead, which ``--chunk K`` pays once
per K micro-calls instead of once per call (so a larger chunk only reorders the same work and is faster). The loss
is a deterministic function of the step, the learning rate and the seed, never of the chunk. ``--stop-after N``
ends the run after N steps without changing it (a measurement's cut, like the reference trainer's ``max_steps``:
``--steps`` stays the run's length). One line per step::

    toy step 3 time_s 0.02512 compute_s 0.00503 host_s 0.02009 loss 2.468102 tokens 512

and ``toy done`` after the last step.
"""

from __future__ import annotations

import argparse
import math
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--chunk", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--compute-ms", type=float, default=5.0)
    p.add_argument("--host-ms", type=float, default=20.0)
    p.add_argument("--stop-after", type=int, default=None)
    a = p.parse_args()
    for step in range(1, min(a.steps, a.stop_after or a.steps) + 1):
        t0 = time.perf_counter()
        time.sleep(a.compute_ms / 1000)
        t1 = time.perf_counter()
        time.sleep(a.host_ms / 1000 / a.chunk)
        t2 = time.perf_counter()
        loss = 1.0 + 2.0 * math.exp(-a.lr * step) + 0.01 * math.sin(step + a.seed)
        print(f"toy step {step} time_s {t2 - t0:.6f} compute_s {t1 - t0:.6f} host_s {t2 - t1:.6f} "
              f"loss {loss:.6f} tokens {a.tokens}", flush=True)
    print("toy done", flush=True)


if __name__ == "__main__":
    main()
