from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("ATTUNE_LESSONS", "off")  # tests never write the user's lessons store


# -- the order files run in: the longest first (xdist hands each worker one file at a time, so the last file to start
# decides when the suite ends; starting the long ones first keeps both workers busy to the end). tests/durations.json
# holds seconds per file from a whole run (`make test-durations` rewrites it); a file not in it counts as the median.
_DURATIONS = Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(config, items):
    try:
        seconds = json.loads(_DURATIONS.read_text())
    except (OSError, ValueError):
        return
    default = sorted(seconds.values())[len(seconds) // 2] if seconds else 0.0
    root = Path(str(config.rootpath))

    def weight(item) -> float:
        try:
            rel = Path(str(item.path)).resolve().relative_to(root).as_posix()
        except ValueError:
            return default
        return float(seconds.get(rel, default))

    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-weight(item), order[id(item)]))


# -- least privilege: the chart's RBAC grants nothing the operators under test did not use (tests/k8s/least_privilege.py)
def pytest_configure(config):
    from tests.k8s import least_privilege

    least_privilege.configure(config)


def pytest_sessionfinish(session, exitstatus):
    from tests.k8s import least_privilege

    least_privilege.finish(session)
