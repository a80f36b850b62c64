"""The commands' tables and JSON lines: written directly for a pipe, character for
character as rich prints them, and printed by rich wherever the two could differ."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console
from rich.markup import escape

from rheo_flow._cli import _table
from rheo_flow._cli._common import console
from rheo_flow._cli._table import print_lines, print_table, rich_table

PLAIN = list("abcxyz019 ,-_./")
ODD = [":", "[", "]", "\\", "é", "中", "😀", ":smile:", "[bold]", "[/]", "\t", "\n", "\x1b",
       "  ", "\u200b", "\u0301", "ｱ", "🇫🇷", ":+1:", "\\[", "[link=x]", "\x00", "\r"]
"""Markup, emoji codes, wide, zero-width and combining characters, control characters."""


def _word(rng: random.Random, longest: int, odd: float) -> str:
    return "".join(rng.choice(ODD) if rng.random() < odd else rng.choice(PLAIN)
                   for _ in range(rng.randint(0, longest)))


def _pipe() -> Console:
    """What :func:`console` gives off a terminal, writing to a buffer."""
    out = Console(file=io.StringIO(), highlight=False)
    out.soft_wrap = True
    out.width = 100_000
    return out


Printed = tuple[str | None, str | None]
"""What was printed (``None`` on an error) and the error's type name (or ``None``)."""


def _both(title: str, columns: list[str], right: frozenset[str], rows: list[list[str]]
          ) -> tuple[Printed, Printed]:
    """What rich prints of the table, and what :func:`print_table` prints."""
    found: list[Printed] = []
    for ours in (False, True):
        out = _pipe()
        try:
            if ours:
                print_table(out, title, columns, right, rows)
            else:
                out.print(rich_table(title, columns, right,
                                     ([escape(c) for c in row] for row in rows)))
        except Exception as exc:
            found.append((None, type(exc).__name__))
        else:
            found.append((out.file.getvalue(), None))  # type: ignore[attr-defined]
    return found[0], found[1]


@pytest.mark.parametrize("seed", range(4))
def test_a_table_for_a_pipe_is_what_rich_prints(seed: int, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    rng = random.Random(seed)
    direct = 0
    plain_table = _table.plain_table

    def counted(*args: object) -> str | None:
        nonlocal direct
        text = plain_table(*args)  # type: ignore[arg-type]
        direct += text is not None
        return text

    monkeypatch.setattr(_table, "plain_table", counted)
    for _ in range(600):
        odd = rng.choice([0, 0.02, 0.1, 0.3])
        columns = [_word(rng, 4, odd / 3) or "c" for _ in range(rng.randint(1, 5))]
        right = frozenset(c for c in columns if rng.random() < 0.5)
        rows = [[_word(rng, 8, odd) for _ in columns] for _ in range(rng.randint(0, 6))]
        title = _word(rng, 20, odd) if rng.random() < 0.9 else ""
        expected, got = _both(title, columns, right, rows)
        assert got == expected, (title, columns, sorted(right), rows)
    assert direct > 250  # most tables took the direct way


def test_a_large_table_is_written_directly() -> None:
    rows = [[f"s{i:04d}", "1", f"{i * 1000:,}", "0", "billing, shipping"] for i in range(1000)]
    columns = ("stream", "partitions", "events", "retained", "groups")
    right = frozenset({"partitions", "events", "retained"})
    out = _pipe()
    assert _table.plain_table(out, "sqlite:///x.db", columns, right, rows) is not None
    print_table(out, "sqlite:///x.db", columns, right, rows)
    by_rich = _pipe()
    by_rich.print(rich_table("sqlite:///x.db", columns, right, rows))
    assert out.file.getvalue() == by_rich.file.getvalue()  # type: ignore[attr-defined]


@pytest.mark.parametrize("settings", [
    {"force_terminal": True, "color_system": "truecolor", "width": 60},
    {"force_terminal": True, "color_system": None, "width": 30},
    {"force_terminal": False, "color_system": "standard", "width": 200},
])
def test_a_terminal_or_colour_leaves_the_table_to_rich(settings: dict[str, object]) -> None:
    rows = [["a-rather-long-stream-name", "1", "0"], ["b", "22", "1,000"]]
    columns = ("stream", "partitions", "events")
    right = frozenset({"partitions", "events"})
    ours = Console(file=io.StringIO(), highlight=False, **settings)  # type: ignore[arg-type]
    print_table(ours, "title", columns, right, rows)
    by_rich = Console(file=io.StringIO(), highlight=False, **settings)  # type: ignore[arg-type]
    by_rich.print(rich_table("title", columns, right, rows))
    assert ours.file.getvalue() == by_rich.file.getvalue()  # type: ignore[attr-defined]


def test_a_quiet_console_prints_nothing() -> None:
    out = _pipe()
    out.quiet = True
    print_table(out, "t", ("a",), frozenset(), [["x"]])
    assert out.file.getvalue() == ""  # type: ignore[attr-defined]


def test_the_commands_console_off_a_terminal_takes_the_direct_way() -> None:
    out = console()
    out.file = io.StringIO()
    assert _table._plain_output(out) is (not out.is_terminal)


@pytest.mark.parametrize("terminal", [False, True])
def test_lines_are_printed_as_rich_prints_them(terminal: bool) -> None:
    rng = random.Random(7)
    lines = [_word(rng, 30, rng.choice([0, 0.05, 0.3])) for _ in range(500)]
    lines += ['{"stream":"s0001","groups":["g"]}', "[bold]x[/]", ":smile:", ""]
    settings: dict[str, object] = {"force_terminal": True, "width": 40} if terminal else {}
    ours = Console(file=io.StringIO(), highlight=False, **settings)  # type: ignore[arg-type]
    by_rich = Console(file=io.StringIO(), highlight=False, **settings)  # type: ignore[arg-type]
    if not terminal:
        for out in (ours, by_rich):
            out.soft_wrap, out.width = True, 100_000
    print_lines(ours, lines)
    for line in lines:
        by_rich.out(line, highlight=False)
    assert ours.file.getvalue() == by_rich.file.getvalue()  # type: ignore[attr-defined]
