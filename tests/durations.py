"""``python -m tests.durations JUNIT.xml``: rewrite tests/durations.json (seconds per test file, longest first) from
a whole run's JUnit report; tests/conftest.py starts the longest files first."""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def per_file(junit: Path) -> dict[str, float]:
    files: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()  # a test class: its module is the file
        if parts:
            files["/".join(parts) + ".py"] += float(case.get("time") or 0)
    return {k: round(v, 1) for k, v in sorted(files.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    out = Path(__file__).with_name("durations.json")
    out.write_text(json.dumps(per_file(Path(argv[0])), indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
