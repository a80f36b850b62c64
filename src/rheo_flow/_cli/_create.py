"""The ``rheo-flow`` commands that create: ``create-stream`` and ``create-group``, with the
settings the Python calls take (``Rheo.create_stream``, ``Rheo.create_group``). Both
are idempotent as those calls are: creating what exists with the same settings is a
no-op that says so; other settings are an error naming the difference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import typer

from .._backends._urls import redact_url
from .._model._validation import MAX_PARTITIONS
from ._command import Command
from ._common import GroupArg, JsonOption, StreamArg, UrlOption, console, done, existing, run
from ._retention import MaxAgeOption, MaxEventsOption, policy_of, policy_row, policy_text
from ._times import TIME_HELP, parse_position

if TYPE_CHECKING:
    from .._model._stream import StreamInfo

__all__ = ["register"]


def create_stream(
    url: UrlOption,
    stream: StreamArg,
    partitions: Annotated[int, typer.Option(
        "--partitions", "-p", min=1, max=MAX_PARTITIONS,
        help="Partitions (fixed once created).")] = 1,
    max_age: MaxAgeOption = None,
    max_events: MaxEventsOption = None,
    json: JsonOption = False,
) -> None:
    """Create a stream (a no-op if it exists with as many partitions); --max-age and
    --max-events set its retention policy (an existing stream's too)."""
    out = console()
    policy = policy_of(max_age, max_events)

    async def go() -> tuple[StreamInfo, bool]:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            before = set(await rheo.streams())
            info = await rheo.create_stream(stream, partitions=partitions, retention=policy)
            return info, stream not in before

    info, created = run(out, go, url)
    count = info.partitions
    kept = "" if info.retention is None else f", retention {policy_text(info.retention)}"
    done(json, {"stream": stream, "partitions": count, "created": created,
                "retention": policy_row(info.retention)},
         f"stream {stream} {'created' if created else 'exists'} with {count} partition(s)"
         f"{kept} on {redact_url(url)}")


def create_group(
    url: UrlOption,
    stream: StreamArg,
    group: GroupArg,
    ordering: Annotated[str, typer.Option(
        "--ordering", help="none (partition order) or key (one delivery at a time per "
        "key; fixed once created).")] = "none",
    max_attempts: Annotated[int | None, typer.Option(
        "--max-attempts", min=1, help="Deliveries of an event before it is dead-lettered "
        "(default: the backend's; updates an existing group).", show_default=False)] = None,
    start: Annotated[str, typer.Option(
        "--start", help="Where a new group starts: earliest, latest, after a sequence S, or "
        f"at a time T ({TIME_HELP}).")] = "earliest",
    json: JsonOption = False,
) -> None:
    """Create a consumer group (a no-op if it exists with that ordering)."""
    out = console()
    if ordering not in ("none", "key"):
        raise typer.BadParameter(f"expected none or key, got {ordering!r}",
                                 param_hint="--ordering")
    chosen: Literal["none", "key"] = "key" if ordering == "key" else "none"
    position = parse_position(start)

    async def go() -> tuple[int, bool]:
        from datetime import datetime

        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            before = {g.group for g in await rheo.groups(stream)}
            if isinstance(position, datetime):
                info = await rheo.create_group(stream, group, start="earliest",
                                               max_attempts=max_attempts, ordering=chosen)
                if group not in before:
                    await rheo.reset(stream, group, to=position)
            else:
                info = await rheo.create_group(stream, group, start=position,
                                               max_attempts=max_attempts, ordering=chosen)
            return info.max_attempts, group not in before

    attempts, created = run(out, go, url)
    done(json, {"stream": stream, "group": group, "ordering": chosen,
                "max_attempts": attempts, "created": created},
         f"group {group} of {stream} {'created' if created else 'exists'} "
         f"(ordering {chosen}, max attempts {attempts})")


def register(app: typer.Typer) -> None:
    """Add the commands that create streams and groups to ``app``."""
    app.command("create-stream", cls=Command)(create_stream)
    app.command("create-group", cls=Command)(create_group)
