"""The layout of the test suite: no test module imports another test module.

A test module (``test_*.py``) is collected by pytest; importing one from another runs its module code twice under two
roles, re-exports its tests and fixtures into the importer, and ties the two files together. Whatever tests share
lives in a helper module (not named ``test_*``) or, for fixtures, in a ``conftest.py``.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def _package_of(path: Path, root: Path, package: str) -> list[str]:
    """The dotted package holding ``path``, for a tree ``root`` importable as ``package``."""
    return [package, *path.parent.relative_to(root).parts]


def _resolve(node: ast.ImportFrom, here: list[str]) -> str | None:
    """The absolute module an ``import from`` names (None: a relative import climbing above the package)."""
    if not node.level:
        return node.module or ""
    if node.level > len(here):
        return None
    base = here[:len(here) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imports_of_test_modules(root: Path, package: str = "tests") -> list[str]:
    """Every import of a test module by a test module under ``root`` (a tree importable as ``package``), as
    ``path:line: imports module``, the path from the folder holding ``root``. Imports inside functions count, and so
    does ``importlib.import_module("...")`` with a literal name. A module outside ``package`` whose name merely starts
    with ``test_`` (``aiohttp.test_utils``) is not a test module of this suite."""
    test_files = sorted(root.rglob("test_*.py"))
    bare_names = {p.stem for p in test_files}  # `import test_x`, as with rootdir-relative imports

    def ours(dotted: str) -> bool:
        first = dotted.split(".", 1)[0]
        return first == package or (dotted == first and first in bare_names)

    problems: list[tuple[str, int, str]] = []
    for path in test_files:
        here = _package_of(path, root, package)
        rel = path.relative_to(root.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            imported: list[str] = []
            if isinstance(node, ast.Import):
                imported = [a.name for a in node.names if ours(a.name)]
            elif isinstance(node, ast.ImportFrom):
                module = _resolve(node, here)
                if module is None:
                    problems.append((rel, node.lineno, f"a relative import above the package {package!r}"))
                    continue
                if node.level or ours(module):
                    imported = [module] + [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name in ("import_module", "__import__") and ours(node.args[0].value):
                    imported = [node.args[0].value]
            tests = [m for m in imported if _is_test_module(m)]
            if tests:
                problems.append((rel, node.lineno, f"imports {tests[0]}"))
    return [f"{rel}:{line}: {what}" for rel, line, what in sorted(problems)]


def test_no_test_module_imports_another():
    problems = imports_of_test_modules(TESTS)
    assert not problems, "test modules import test modules; move what they share into a helper module (or a " \
                         "conftest.py for fixtures):\n" + "\n".join(problems)


def test_the_checker_names_every_import_of_a_test_module(tmp_path):
    root = tmp_path / "tests"
    (root / "a" / "deep").mkdir(parents=True)
    for init in (root / "__init__.py", root / "a" / "__init__.py", root / "a" / "deep" / "__init__.py"):
        init.write_text("")
    (root / "a" / "test_one.py").write_text("def helper():\n    return 1\n")
    (root / "a" / "helpers.py").write_text("def shared():\n    return 2\n")
    (root / "a" / "deep" / "test_three.py").write_text(textwrap.dedent("""\
        from ..test_one import helper
        from .. import helpers
        """))
    (root / "a" / "test_two.py").write_text(textwrap.dedent("""\
        from aiohttp.test_utils import TestServer
        from tests.a.helpers import shared
        from .helpers import shared as also
        from tests.a.test_one import helper
        import tests.a.test_one
        from .test_one import helper as h2
        from . import test_one
        from tests.a import test_one as again


        def later():
            from tests.a.test_one import helper
            import importlib
            importlib.import_module("tests.a.test_one")
            importlib.import_module("json")
        """))
    assert imports_of_test_modules(root) == [
        "tests/a/deep/test_three.py:1: imports tests.a.test_one",
        "tests/a/test_two.py:4: imports tests.a.test_one",
        "tests/a/test_two.py:5: imports tests.a.test_one",
        "tests/a/test_two.py:6: imports tests.a.test_one",
        "tests/a/test_two.py:7: imports tests.a.test_one",
        "tests/a/test_two.py:8: imports tests.a.test_one",
        "tests/a/test_two.py:12: imports tests.a.test_one",
        "tests/a/test_two.py:14: imports tests.a.test_one",
    ]
    (root / "a" / "test_two.py").write_text("from tests.a.helpers import shared\n")
    (root / "a" / "deep" / "test_three.py").write_text("from ..helpers import shared\n")
    assert imports_of_test_modules(root) == []
