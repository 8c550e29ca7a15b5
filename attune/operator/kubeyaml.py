"""YAML that kubectl reads back as written: manifests attune hands to users to ``kubectl apply``.

PyYAML writes YAML 1.1 and leaves a string plain whenever YAML 1.1 would read it back as a string; kubectl reads
manifests with Go's YAML (sigs.k8s.io/yaml), which resolves more plain scalars to numbers and booleans: ``1e-3``,
``5e5``, ``0o17``, ``1_000``, ``+.inf``, ``y``, ``n``. A trainer's argument ``--learning_rate 1e-3`` written plain
comes back as the number 0.001, and the API server refuses the manifest (kube-apiserver 1.37: ``.args[7]: expected
string, got &value.valueUnstructured{Value:0.001}``). :func:`dump` quotes every string Go's YAML could read as
another type; everything else is written as :func:`yaml.safe_dump` writes it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

#: plain scalars Go's YAML (yaml.v2 resolve table) reads as booleans or null, in any letter case attune could write
_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", "<<", "="}
#: a date Go's YAML reads as a timestamp (month and day may have one digit, where YAML 1.1 wants two)
_DATE = re.compile(r"^\d{4}-\d{1,2}-\d{1,2}")
_SPECIAL_FLOAT = re.compile(r"^[-+]?\.(inf|nan)$", re.IGNORECASE)
_PREFIXED_INT = re.compile(r"^[-+]?0[xob]", re.IGNORECASE)


def go_reads_as_non_string(text: str) -> bool:
    """Whether Go's YAML would read ``text``, written plain, as something other than that string."""
    if text.lower() in _WORDS or _SPECIAL_FLOAT.match(text) or _DATE.match(text) or _PREFIXED_INT.match(text):
        return True
    if not text or text[0] not in "0123456789+-.":
        return False
    plain = text.replace("_", "")
    try:
        float(plain)
        return True
    except ValueError:
        return False


class _KubeDumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if go_reads_as_non_string(data):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="'")
    return dumper.represent_str(data)


_KubeDumper.add_representer(str, _str)


def dump(value: Any) -> str:
    """``value`` as YAML text that both PyYAML and kubectl read back as ``value`` (keys in their given order)."""
    return str(yaml.dump(value, Dumper=_KubeDumper, sort_keys=False))
