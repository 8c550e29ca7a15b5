"""Writes ``status.yaml`` here: a TuningRun's status and its TuningTrials as release 0.1.0's operator left them (its
own :func:`reconcile` with the test fakes of that release: two baselines and a candidate recorded, nothing in
flight). Run from a checkout of that release (commit b2289dd), e.g.::

    git worktree add /tmp/attune-0.1.0 b2289dd
    cd /tmp/attune-0.1.0 && .venv/bin/python <this file> <this folder>

(any virtual environment with this repository's dependencies will do)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from attune.operator.reconcile import reconcile
from tests.k8s.fakes import FakePorts, tuning_run

ports = FakePorts()
run = tuning_run(searchSpace=["micro_batch_size"])
run["spec"]["metrics"]["prometheusUrl"] = "http://prom.ml.svc:9090"
for _ in range(200):
    res = reconcile(run, ports)
    run["status"] = {k: v for k, v in {**(run.get("status") or {}), **res.status}.items() if v is not None}
    ports.t += 40
    ports.finish()
    recorded = [t for t in ports.trials.values() if (t.get("status") or {}).get("record")]
    if len(recorded) >= 3 and not run["status"].get("currentTrial"):
        break
out = json.loads(json.dumps({"release": "0.1.0 (b2289dd)", "run": run, "trials": list(ports.trials.values())},
                            default=str))  # the API's view: plain JSON (enums as their values)
Path(sys.argv[1], "status.yaml").write_text(yaml.safe_dump(out, sort_keys=False))
print("trials", len(ports.trials), "phase", run["status"]["phase"])
