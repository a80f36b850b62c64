"""``rheo-flow append``: events read from stdin, one JSON object per line.

Every line is checked before anything is appended, and an error names its line
with an excerpt of it. On a terminal a hint on stderr says what to type; input
without an event appends nothing, says so on stderr and exits 0 (a script
piping an empty batch has nothing to fail on).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import orjson
import typer
from rich.markup import escape

from .._model._errors import InvalidArgument
from .._model._validation import MAX_APPEND, MAX_PARTITIONS
from ._common import JsonOption, StreamArg, UrlOption, console, emit, errors, existing, run

if TYPE_CHECKING:
    from .._rheo import Rheo

__all__ = ["EXCERPT", "append"]

EXCERPT = 60
"""Characters of a faulty line quoted in its error."""

_HINT = ("type one JSON event per line, e.g. {\"type\": \"placed\", \"data\": {}}; "
         f"end with {'Ctrl-Z, Enter' if sys.platform == 'win32' else 'Ctrl-D'}")


def append(
    url: UrlOption,
    stream: StreamArg,
    batch: Annotated[int, typer.Option(
        min=1, max=MAX_APPEND, help="Events per append call.")] = 500,
    create: Annotated[bool, typer.Option(
        "--create", help="Create the stream first when it does not exist.")] = False,
    partitions: Annotated[int, typer.Option(
        min=1, max=MAX_PARTITIONS, help="Partitions of a stream made by --create.")] = 1,
    json: JsonOption = False,
) -> None:
    """Append events read from stdin, one JSON object per line, and print where they went.

    Each line is an event mapping: {"type": ..., "data": ..., "id": ..., "key": ...}
    ("type" required; "partition" and "headers" are accepted too). Every line is
    checked before anything is appended (an error names the line); blank lines
    are skipped; no event at all appends nothing and exits 0. Appends are
    idempotent on "id": a line whose id is already stored prints the stored event.
    """
    out = console()
    if sys.stdin.isatty():
        errors().print(escape(_HINT))
    lines = _read_lines()

    async def go() -> list[dict[str, Any]]:
        from .._rheo import Rheo

        rows = []
        async with Rheo(existing(url)) as rheo:
            if create:
                await rheo.create_stream(stream, partitions=partitions)
            items = await _checked(rheo, stream, lines)
            for start in range(0, len(items), batch):
                for event in await rheo.append(stream, items[start:start + batch]):
                    rows.append({"stream": stream, "id": event.id, "partition": event.partition,
                                 "sequence": event.sequence})
        return rows

    rows = run(out, go, url, stream_fix="rerun with --create, or: rheo-flow create-stream "
               f"{stream}")
    if not rows:
        errors().print(f"nothing appended to {escape(stream)}: no event on stdin")
        return
    emit(out, json, f"appended to {stream}", ("id", "partition", "sequence"),
         rows, lambda r: [r["id"], str(r["partition"]), str(r["sequence"])])


def _read_lines() -> list[tuple[int, str, dict[str, Any]]]:
    """Each non-blank line of stdin: its number, its text and its JSON object."""
    lines = []
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            _fail(number, line, f"not JSON ({exc})")
        if not isinstance(item, dict):
            _fail(number, line, "not a JSON object")
        lines.append((number, line, item))
    return lines


def _fail(number: int, line: str, problem: str) -> NoReturn:
    errors().print(f"[bold red]error:[/] line {number}: {escape(problem)}: "
                   f"{escape(_excerpt(line))}")
    raise typer.Exit(1)


async def _checked(rheo: Rheo, stream: str, lines: list[tuple[int, str, dict[str, Any]]]
                   ) -> list[dict[str, Any]]:
    """The events of ``lines``, each checked as :meth:`Rheo.append` would check it;
    the first faulty one is an error naming its line."""
    count = (await rheo.stream_info(stream)).partitions  # a typo errs with no event too
    if not lines:
        return []
    from .._facade._delay import undelayed
    from .._model._append_records import append_records

    for number, line, item in lines:
        try:
            append_records([item], count, None, None, rheo.max_event_bytes,
                           undelayed(rheo.backend))
        except InvalidArgument as exc:
            raise InvalidArgument(f"line {number}: {exc}: {_excerpt(line)}") from None
    return [item for _, _, item in lines]


def _excerpt(line: str) -> str:
    text = line.strip()
    return text if len(text) <= EXCERPT else f"{text[:EXCERPT - 1]}…"
