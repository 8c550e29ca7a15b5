"""Lessons on Kubernetes: each namespace's lessons live in that namespace, in the ConfigMap ``attune-lessons``.

**Shape.** Every finished TuningRun adds one data key to its namespace's ``attune-lessons``:
``run.<run>.<uid8>.json``, the observations its records teach (:func:`attune.agent.lessons.distil`) and the noise it
measured. The lessons themselves are the fold of those entries in the order they were recorded
(:func:`store_from_data`), exactly as ``LessonStore.add`` folds runs into the CLI's file. Why entries and not the
folded store:

- *no lost writes across replicas, no locks*: a run's entry is written by a JSON merge patch that adds one key
  (``WriteConfigMap``: create, or merge-patch its data), and merge patches of distinct keys commute on the API
  server, so two operator replicas finishing runs in the same namespace at once both land, without a
  read-modify-write that a resourceVersion would have to guard;
- *durable and shared*: the ConfigMap outlives runs, operator restarts and sidecar restarts (no owner reference),
  and every replica reads the same one;
- *tenant isolation by construction*: a run reads and writes only its own namespace's ConfigMap, and the agent
  sidecar holds no tenant state: the operator sends that namespace's folded lessons with each proposal request
  (``ProposeRequest.lessons``), which the sidecar uses for that request only;
- *a user owns them*: ``kubectl edit cm attune-lessons`` and deleting a run's key forgets what it taught.

A ConfigMap holds at most 1 MiB; an entry is a few kB, and :func:`store_from_data` folds the newest
:data:`MAX_RUNS` entries only.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from pydantic import ValidationError

from attune.agent.lessons import MemoryLessonStore, NoiseRecord, Observation, distil, run_noise
from attune.operator.results import MANAGED_BY, MANAGER

log = logging.getLogger(__name__)

#: the ConfigMap holding a namespace's lessons
LESSONS_CONFIGMAP = "attune-lessons"
#: label marking it
LABEL_LESSONS = "attune.dev/lessons"
ENTRY_PREFIX = "run."
ENTRY_VERSION = 1
#: newest run entries folded into a namespace's lessons
MAX_RUNS = 200
#: backend recorded in the lessons of Kubernetes trials (real hardware)
BACKEND = "k8s"


def entry_key(run: dict[str, Any]) -> str:
    """The data key of ``run``'s entry: ``run.<name>.<uid8>.json`` (valid ConfigMap key characters only)."""
    meta = run["metadata"]
    name = re.sub(r"[^-._a-zA-Z0-9]", "_", str(meta["name"]))[:200]
    uid = re.sub(r"[^a-zA-Z0-9]", "", str(meta.get("uid") or ""))[:8] or "nouid"
    return f"{ENTRY_PREFIX}{name}.{uid}.json"


def run_id(run: dict[str, Any]) -> str:
    meta = run["metadata"]
    return f"{meta['namespace']}/{meta['name']}/{str(meta.get('uid') or '')[:8]}"


def run_entry(run: dict[str, Any], state: Any, now: float | None = None) -> dict[str, Any]:
    """What ``state`` (a finished run's :class:`~attune.engine.loop.RunState`) teaches, as a JSON-ready entry."""
    min_gain = float(getattr(state.config, "min_gain", 0.02))
    obs = distil(state.baseline, state.records, min_gain, backend=BACKEND)
    noise = run_noise(state, backend=BACKEND)
    rid = run_id(run)
    return {"version": ENTRY_VERSION, "run": rid, "recorded": time.time() if now is None else now,
            "minGain": min_gain, "observations": [o.model_dump(mode="json") for o in obs],
            "noise": noise.model_copy(update={"run": rid}).model_dump(mode="json") if noise is not None else None}


def lessons_configmap(run: dict[str, Any], state: Any, now: float | None = None) -> dict[str, Any]:
    """The ConfigMap write that adds ``run``'s entry to its namespace's lessons (merged into the existing data)."""
    meta = run["metadata"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": LESSONS_CONFIGMAP, "namespace": meta["namespace"],
                         "labels": {MANAGED_BY: MANAGER, LABEL_LESSONS: "true"}},
            "data": {entry_key(run): json.dumps(run_entry(run, state, now), separators=(",", ":"))}}


def store_from_data(data: dict[str, str] | None, max_runs: int = MAX_RUNS) -> MemoryLessonStore:
    """A namespace's lessons: its ConfigMap's run entries folded in the order they were recorded (the newest
    ``max_runs``). An entry that cannot be read is skipped with a warning, never fatal."""
    entries = []
    for key, text in (data or {}).items():
        if not key.startswith(ENTRY_PREFIX):
            continue
        try:
            entry = json.loads(text)
            obs = [Observation.model_validate(o) for o in entry.get("observations") or []]
            noise = NoiseRecord.model_validate(entry["noise"]) if entry.get("noise") else None
            entries.append((float(entry.get("recorded") or 0.0), str(entry["run"]), obs, noise,
                            float(entry.get("minGain", 0.02))))
        except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as err:
            log.warning("lessons entry %s is unreadable, skipped: %s", key, str(err).splitlines()[0][:200])
    store = MemoryLessonStore()
    for _, rid, obs, noise, min_gain in sorted(entries, key=lambda e: (e[0], e[1]))[-max_runs:]:
        store.add(obs, rid, min_gain)
        if noise is not None:
            store.add_noise(noise)
    store.save()
    return store


__all__ = ["BACKEND", "ENTRY_PREFIX", "LABEL_LESSONS", "LESSONS_CONFIGMAP", "MAX_RUNS", "entry_key",
           "lessons_configmap", "run_entry", "run_id", "store_from_data"]
