"""Size limits that keep every module and function readable in one sitting.

No source module over 600 lines and no function over 60; statements and
scripts live in their own ``.sql`` / ``.lua`` files, which these limits do not
cover.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rheo_flow"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # From the ``def`` line: decorators (CLI options) declare, they hold no logic.
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_module_is_over_the_line_limit() -> None:
    long = [
        f"{p.relative_to(SRC)} ({n} lines)"
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_is_over_the_line_limit() -> None:
    long = [f for p in _modules() for f in _long_functions(p)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_checker_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    sample = tmp_path / "sample.py"
    sample.write_text(f"def too_long() -> None:\n{body}\n")
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        assert _long_functions(sample) == [f"sample.py:1 too_long ({MAX_FUNCTION_LINES + 1} lines)"]
    finally:
        SRC = saved

