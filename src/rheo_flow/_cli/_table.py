"""The commands' tables: rich's ``Table``, or the same text written directly for a pipe.

Rich lays a table out cell by cell (markup, measuring, padding, cropping): about
0.6 ms a row, 0.6 s for the 1,000 rows of ``rheo-flow streams`` on a large store.
Written to a pipe or a file (no colour, no wrapping: see :func:`._common.console`)
the table is plain text, which :func:`plain_table` builds as rich would — the same
characters, widths and justification — when every cell is one line of printable
text. Anything else (a terminal, colour forced, a non-UTF-8 output, a cell with a
newline or a control character) is drawn by rich itself. :func:`print_lines`
does the same for ``--json`` lines, which rich prints one by one (0.1 ms each).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["plain_table", "print_lines", "print_table", "rich_table"]

_PLAIN_CHARACTERS = frozenset(" !\"#$%&'()*+,-./0123456789;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                              "]^_`abcdefghijklmnopqrstuvwxyz{|}~")
"""Printable ASCII that rich's markup and emoji codes leave as it is (no ``[``, ``\\``, ``:``)."""


def rich_table(title: str, columns: Sequence[str], right: frozenset[str],
               rows: Iterable[Sequence[str]]) -> Table:
    """The rich table of ``rows`` (cells as markup) under ``title``; ``right`` columns
    are right-justified."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    for row in rows:
        table.add_row(*row)
    return table


def print_table(out: Console, title: str, columns: Sequence[str], right: frozenset[str],
                rows: Sequence[Sequence[str]]) -> None:
    """Print ``rows`` of plain cells (not markup) as a table, directly when rich's
    rendering would be plain text (see the module's docstring)."""
    text = plain_table(out, title, columns, right, rows) if _plain_output(out) else None
    if text is None:
        from rich.markup import escape

        out.print(rich_table(title, columns, right, ([escape(c) for c in row] for row in rows)))
    else:
        _write(out, text)


def print_lines(out: Console, lines: Iterable[str]) -> None:
    """Print each line as ``out.out(line, highlight=False)`` does: those of printable
    ASCII directly when ``out`` prints plain text (see the module's docstring)."""
    plain = _plain_output(out)
    batch: list[str] = []
    for line in lines:
        if plain and line.isascii() and line.isprintable():
            batch.append(line)
            continue
        if batch:
            _write(out, "\n".join(batch) + "\n")
            batch.clear()
        out.out(line, highlight=False)
    if batch:
        _write(out, "\n".join(batch) + "\n")


def _write(out: Console, text: str) -> None:
    """Write ``text`` to ``out``'s file as rich would (nothing when quiet; a closed
    pipe ends the process quietly)."""
    if out.quiet:
        return
    try:
        out.file.write(text)
        out.file.flush()
    except BrokenPipeError:
        out.on_broken_pipe()


def _plain_output(out: Console) -> bool:
    """Whether ``out`` prints a table as plain text, its lines never wrapped or cut."""
    return (sys.platform != "win32" and out.soft_wrap and out.color_system is None
            and not out.is_terminal and not out.record and not out.is_jupyter
            and out.encoding.lower().startswith("utf"))


def plain_table(out: Console, title: str, columns: Sequence[str], right: frozenset[str],
                rows: Sequence[Sequence[str]]) -> str | None:
    """The text rich prints for this table on ``out`` (plain, never wrapped), or
    ``None`` when a cell or the title is not one line of printable text."""
    # A title rich shows as nothing still takes its line.
    heading = _text(out, title, markup=True) if title else None
    header = [_text(out, c, markup=True) for c in columns]
    body = [[_text(out, c, markup=False) for c in row] for row in rows]
    if (title and heading is None) or None in header or any(None in row for row in body):
        return None
    lines = [heading[0]] if heading is not None else []
    return _draw(lines, columns, right, header, body)  # type: ignore[arg-type]


def _text(out: Console, text: str, *, markup: bool) -> tuple[str, int] | None:
    """What rich shows of a cell (escaped unless ``markup``) and its width in cells;
    ``None`` unless every character shown is printable and takes a cell or two."""
    if _PLAIN_CHARACTERS.issuperset(text):
        return text, len(text)
    from rich.cells import cell_len, get_character_cell_size
    from rich.markup import escape

    shown = out.render_str(text if markup else escape(text), highlight=False).plain
    sizes = [get_character_cell_size(c) for c in shown]
    width = cell_len(shown)
    if not shown.isprintable() or 0 in sizes or sum(sizes) != width:
        return None
    return shown, width


def _draw(lines: list[str], columns: Sequence[str], right: frozenset[str],
          header: list[tuple[str, int]], body: list[list[tuple[str, int]]]) -> str:
    """The table drawn with rich's default box (heavy head) and one space of padding."""
    widths = [max([h[1], *(row[i][1] for row in body)]) for i, h in enumerate(header)]
    justify_right = [c in right for c in columns]

    def line(cells: list[tuple[str, int]], edge: str, between: str) -> str:
        parts = []
        for (text, width), room, to_right in zip(cells, widths, justify_right, strict=True):
            shown = text.rstrip()
            gap = " " * (room - width + len(text) - len(shown))
            parts.append(f" {gap}{shown} " if to_right else f" {shown}{gap} ")
        return f"{edge}{between.join(parts)}{edge}"

    def rule(left: str, fill: str, cross: str, end: str) -> str:
        return f"{left}{cross.join(fill * (w + 2) for w in widths)}{end}"

    lines += [rule("┏", "━", "┳", "┓"), line(header, "┃", "┃"), rule("┡", "━", "╇", "┩")]
    lines += [line(row, "│", "│") for row in body]
    lines.append(rule("└", "─", "┴", "┘"))
    return "\n".join(lines) + "\n"
