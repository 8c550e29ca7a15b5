"""The framework seam holds: outside ``attune/frameworks/`` (and the simulator, which models Megatron, and the
reference trainer, the ``torch`` framework's own training program, which reads its knobs) no module names a
framework's knobs, and everything else reads frameworks from the one registry."""

from __future__ import annotations

import ast
from pathlib import Path

from attune import frameworks

PACKAGE = Path(__file__).resolve().parents[2] / "attune"
ALLOWED = (PACKAGE / "frameworks", PACKAGE / "sim", PACKAGE / "trainer")


def knob_names() -> set[str]:
    """Every catalogue knob name, less words that are also values of the generic recipe (precision ``fp8``)."""
    from typing import get_args

    from attune.recipe.model import Precision

    names: set[str] = set()
    for fw in frameworks.names():
        impl = frameworks.get(fw)
        if impl.declared_knobs:
            continue  # its recipes declare their own knobs (command): its catalogue lists roles, not knob names
        names.update(impl.catalogue().knobs)
    return names - set(get_args(Precision))


def string_constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.keyword) and node.arg:
            out.append((node.value.lineno, node.arg))  # with_knobs(micro_batch_size=4)
    return out


def test_no_module_outside_the_framework_packages_names_a_knob():
    knobs = knob_names()
    assert {"micro_batch_size", "tensor_model_parallel_size"} <= knobs  # the check can see what it looks for
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path.is_relative_to(a) for a in ALLOWED):
            continue
        for line, text in string_constants(path):
            if text in knobs:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}")
    assert not offenders, "framework knobs named outside attune/frameworks/:\n" + "\n".join(offenders)


def test_the_check_finds_a_knob_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""doc naming micro_batch_size is fine."""\nX = recipe.knob("micro_batch_size")\n')
    assert [t for _, t in string_constants(bad) if t in knob_names()] == ["micro_batch_size"]


def test_every_framework_registers_a_complete_package():
    for name in frameworks.names():
        fw = frameworks.get(name)
        assert fw.name == name and fw.title and fw.backends
        cat = fw.catalogue()
        assert cat.framework == name and cat.knobs
        for (knob, _direction) in fw.rules:
            assert knob in cat, f"{name}: playbook rule for unknown knob {knob}"
