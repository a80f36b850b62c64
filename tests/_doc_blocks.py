"""The ```python blocks of a Markdown page and the output each promises.

Shared by tests/docs/ and tests/runtime/test_key_ordering.py (docs/ordering.md).
"""

from __future__ import annotations

import re
from pathlib import Path


def python_blocks(path: Path) -> list[str]:
    """The ```python blocks of the Markdown page at ``path``, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def expected_output(code: str) -> list[str]:
    """The output a block promises: for each ``print(`` line, its trailing ``# comment``,
    or else the comment lines right below it (joined by spaces)."""
    lines = code.splitlines()
    expected: list[str] = []
    for index, line in enumerate(lines):
        if not line.strip().startswith("print("):
            continue
        if "  # " in line:
            expected.append(line.split("  # ", 1)[1].strip())
            continue
        below: list[str] = []
        for following in lines[index + 1:]:
            if not following.strip().startswith("#"):
                break
            below.append(following.strip().lstrip("#").strip())
        assert below, f"print without the output it gives in a comment: {line.strip()}"
        expected.append(" ".join(below))
    return expected
