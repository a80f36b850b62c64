"""No ``assert`` statement in the package: ``python -O`` removes them.

A check the library relies on at run time raises an error of its own (or the
code is shaped so that the type checker needs no narrowing); an ``assert``
would vanish, with what it guards, under ``python -O``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rheo_flow"


def _asserts(root: Path) -> list[str]:
    """``file:line`` of every ``assert`` statement in the modules under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += [f"{path.relative_to(root)}:{node.lineno}"
                  for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    return found


def test_the_package_has_no_assert_statement() -> None:
    found = _asserts(SRC)
    assert not found, f"assert statements (gone under python -O): {found}"


def test_the_scan_finds_statements_not_words(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe.py").write_text(
        '"""A docstring may say: assert x."""\n\n\ndef f(x: int) -> None:\n'
        '    assert x, "x"\n')
    (tmp_path / "clean.py").write_text("# assert nothing\nVALUE = 1\n")
    assert _asserts(tmp_path) == ["sub/probe.py:5"]


def test_a_runtime_check_still_raises_under_python_o() -> None:
    code = ("from rheo_flow._runtime._options import Option\n"
            "try:\n"
            "    Option('x', 'instance', 'doc').validate(1)\n"
            "except TypeError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "option 'x' is of kind 'instance' without instance_of"
