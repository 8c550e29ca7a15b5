"""Combine single-budget ``attune bench`` runs (each its own ``--out`` directory) into one multi-budget report.

``attune bench --budget 8t,15t,30t`` writes the same report in one go; this is for budgets run one at a time
(or on different machines):

    python benchmarks/scripts/combine_bench.py runs/bench/8t runs/bench/15t runs/bench/30t --out runs/bench
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from attune.bench.report import write_combined
    from attune.bench.run import done_criteria

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="directories holding one budget's bench.json each")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    docs = {}
    for d in args.dirs:
        doc = json.loads((d / "bench.json").read_text())
        docs[doc["budget"]] = doc
    docs = dict(sorted(docs.items(), key=lambda kv: float(kv[0].rstrip("t")) if kv[0].endswith("t") else 0.0))
    args.out.mkdir(parents=True, exist_ok=True)
    for b in docs:
        src = next(x for x in args.dirs if json.loads((x / "bench.json").read_text())["budget"] == b)
        if (args.out / b).resolve() != src.resolve():
            shutil.copytree(src, args.out / b, dirs_exist_ok=True)
    criteria = done_criteria(docs)
    first = next(iter(docs.values()))
    combined = {"suite": first["suite"], "budgets": docs, "seeds": first["seeds"], "tuners": first["tuners"],
                "llm": first.get("llm", ""), "attune_policy": first["attune_policy"], "done_criteria": criteria,
                "seconds": sum(d.get("seconds", 0.0) for d in docs.values())}
    write_combined(combined, args.out)
    print(f"wrote {args.out / 'bench.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
