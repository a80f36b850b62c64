"""The ``rheo-flow`` commands that change a store: append, redrive, replay, reset, trim,
delete-stream, delete-group and migrate.

Destructive ones ask first (``--yes`` skips the question; without a terminal
they refuse unless given ``--yes``). All but ``migrate`` open the store with
``migrate=false``: they never create a file or schema.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

from .._backends._urls import redact_url
from .._model._errors import InvalidArgument
from ._append import append
from ._command import Command
from ._common import (
    GroupArg,
    JsonOption,
    StreamArg,
    UrlOption,
    YesOption,
    confirm,
    console,
    done,
    emit,
    existing,
    run,
)
from ._times import TIME_HELP, format_time, parse_position, parse_time

if TYPE_CHECKING:
    from .._model._stream import DeadLetter

__all__ = ["register"]

PartitionOption = Annotated[list[int] | None, typer.Option(
    "--partition", "-p", min=0, help="Only this partition (repeat for several; default: all).",
    show_default=False)]


def _position(text: str) -> tuple[int, int]:
    partition, colon, sequence = text.partition(":")
    if not (colon and partition.isdigit() and sequence.isdigit()):
        raise typer.BadParameter(f"expected PARTITION:SEQUENCE, got {text!r}")
    return int(partition), int(sequence)


def redrive(
    url: UrlOption,
    stream: StreamArg,
    group: GroupArg,
    position: Annotated[list[str] | None, typer.Option(
        "--position", help="Only the dead letter at PARTITION:SEQUENCE (repeat for several; "
        "default: every dead letter).", show_default=False)] = None,
    yes: YesOption = False,
    json: JsonOption = False,
) -> None:
    """Make a group's dead letters deliverable again (attempt count reset)."""
    out = console()
    wanted = {_position(p) for p in position or ()}
    what = "the dead letters at " + ", ".join(f"{p}:{s}" for p, s in sorted(wanted)) \
        if wanted else "every dead letter"
    confirm(out, f"redrive {what} of {stream}/{group}", yes)

    async def go() -> int:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            await rheo.group_info(stream, group)
            if not wanted:
                return await rheo.redrive(stream, group)
            letters: list[DeadLetter] = []
            last = None
            while page := await rheo.dead_letters(stream, group, limit=1000, after=last):
                letters.extend(d for d in page if (d.partition, d.sequence) in wanted)
                last = page[-1]
            missing = wanted - {(d.partition, d.sequence) for d in letters}
            if missing:
                raise InvalidArgument("no dead letter at " + ", ".join(
                    f"{p}:{s}" for p, s in sorted(missing)))
            return await rheo.redrive(stream, group, letters)

    count = run(out, go, url)
    done(json, {"stream": stream, "group": group, "redriven": count},
         f"{stream}/{group}: {count} dead letter(s) redriven")


def replay(
    url: UrlOption,
    stream: StreamArg,
    group: GroupArg,
    from_sequence: Annotated[int | None, typer.Option(
        "--from", min=1, help="First sequence to deliver again (default 1).",
        show_default=False)] = None,
    from_time: Annotated[str | None, typer.Option(
        "--from-time", metavar="TIME", help="Deliver again, in each partition, from its "
        f"first event appended at or after TIME: {TIME_HELP}.", show_default=False)] = None,
    partition: PartitionOption = None,
    yes: YesOption = False,
    json: JsonOption = False,
) -> None:
    """Deliver a group's events again from a sequence, or a time, on (settled ones too)."""
    out = console()
    if from_sequence is not None and from_time is not None:
        raise typer.BadParameter("give --from or --from-time, not both")
    at = None if from_time is None else parse_time(from_time)
    start = f"time {format_time(at)}" if at is not None else f"sequence {from_sequence or 1}"
    where = _partitions_text(partition)
    confirm(out, f"replay {stream}/{group} from {start} ({where})", yes)

    async def go() -> None:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            if at is None:
                await rheo.replay(stream, group, from_sequence=from_sequence or 1,
                                  partitions=partition or "all")
            else:
                await rheo.replay(stream, group, from_time=at, partitions=partition or "all")

    run(out, go, url)
    position: dict[str, object] = (
        {"from_time": format_time(at)} if at is not None
        else {"from_sequence": from_sequence or 1})
    done(json, {"stream": stream, "group": group, **position,
                "partitions": partition or "all"},
         f"{stream}/{group}: replaying from {start} ({where})")


def reset(
    url: UrlOption,
    stream: StreamArg,
    group: GroupArg,
    to: Annotated[str, typer.Option(
        "--to", help="earliest (deliver everything again), latest (skip everything), a "
        "sequence S (events up to S count as settled) or a time T (in each partition, the "
        f"events appended before T count as settled; T is {TIME_HELP}).",
        show_default=False)],
    partition: PartitionOption = None,
    yes: YesOption = False,
    json: JsonOption = False,
) -> None:
    """Move a group to the earliest event, past the latest, past a sequence, or to a time."""
    out = console()
    position = parse_position(to)
    shown = format_time(position) if isinstance(position, datetime) else position
    where = _partitions_text(partition)
    confirm(out, f"reset {stream}/{group} to {shown} ({where})", yes)

    async def go() -> None:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            await rheo.reset(stream, group, to=position, partitions=partition or "all")

    run(out, go, url)
    done(json, {"stream": stream, "group": group, "to": shown,
                "partitions": partition or "all"},
         f"{stream}/{group}: reset to {shown} ({where})")


def trim(
    url: UrlOption,
    stream: StreamArg,
    up_to: Annotated[int | None, typer.Option(
        "--up-to", min=1, help="Remove events up to this sequence, in every partition "
        "(default: as far as every group has settled).", show_default=False)] = None,
    older_than: Annotated[str | None, typer.Option(
        "--older-than", help="Remove the events appended longer ago than this duration "
        "(90s, 12h, 7d).", show_default=False)] = None,
    keep: Annotated[int | None, typer.Option(
        "--keep", min=1, help="Remove all but the last N events of each partition.",
        show_default=False)] = None,
    retention: Annotated[bool, typer.Option(
        "--retention", help="Remove what the stream's stored retention policy lets go "
        "(rheo-flow retention).")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Also remove events a group has not settled yet.")] = False,
    yes: YesOption = False,
    json: JsonOption = False,
) -> None:
    """Remove old events; unless --force, only those every group has settled."""
    from ._retention import policy_of, policy_text

    out = console()
    policy = policy_of(older_than, keep, age_option="--older-than")
    if sum((up_to is not None, policy is not None, retention)) > 1:
        raise typer.BadParameter("give one of --up-to, --retention, or --older-than and/or "
                                 "--keep", param_hint="--up-to")
    bound = ("what every group has settled" if up_to is None else f"sequence {up_to}")
    what = (f"up to {bound}" if policy is None and not retention else "by its retention policy"
            if retention else f"by {policy_text(policy)}")
    confirm(out, f"trim {stream} {what}{' (forced)' if force else ''}", yes)

    async def go() -> dict[int, int]:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            if retention and (await rheo.stream_info(stream)).retention is None:
                raise InvalidArgument(f"stream {stream!r} has no retention policy: set one "
                                      "with rheo-flow retention, or give --older-than/--keep")
            if retention or policy is not None:
                return await rheo.apply_retention(stream, policy, force=force)
            return await rheo.trim(stream, up_to=up_to, force=force)

    removed = run(out, go, url)
    emit(out, json, f"trimmed {stream}", ("partition", "removed"),
         [{"stream": stream, "partition": p, "removed": n} for p, n in sorted(removed.items())],
         lambda r: [str(r["partition"]), f"{r['removed']:,}"])


def delete_stream(url: UrlOption, stream: StreamArg, yes: YesOption = False,
                  json: JsonOption = False) -> None:
    """Delete a stream with all its events, groups, deliveries and dead letters."""
    out = console()
    confirm(out, f"delete stream {stream} with all its events and groups", yes)

    async def go() -> None:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            await rheo.delete_stream(stream)

    run(out, go, url)
    done(json, {"stream": stream, "deleted": True}, f"stream {stream} deleted")


def delete_group(url: UrlOption, stream: StreamArg, group: GroupArg, yes: YesOption = False,
                 json: JsonOption = False) -> None:
    """Delete a group with its progress, deliveries and dead letters (events stay)."""
    out = console()
    confirm(out, f"delete group {group} of stream {stream}", yes)

    async def go() -> None:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            await rheo.delete_group(stream, group)

    run(out, go, url)
    done(json, {"stream": stream, "group": group, "deleted": True},
         f"group {group} of stream {stream} deleted")


def migrate(
    url: UrlOption,
    schema: Annotated[str | None, typer.Option(
        help="PostgreSQL schema (default: the URL's ?schema= or rheo_flow; giving both is "
        "an error).", show_default=False)] = None,
    json: JsonOption = False,
) -> None:
    """Create or upgrade a backend's schema explicitly (safe to run concurrently).

    PostgreSQL applies its versioned migrations under an advisory lock; the other
    backends create their tables, indexes or keys when they open.
    """
    out = console()
    postgres = url.split("://", 1)[0].lower() in ("postgresql", "postgres")
    if schema is not None and not postgres:
        raise typer.BadParameter("--schema applies to PostgreSQL only", param_hint="--schema")

    async def go() -> str:
        if postgres:
            from .._backends._urls import require_driver

            require_driver("PostgreSQL", "postgres", "asyncpg")
            from .._backends.postgres import DEFAULT_SCHEMA, PostgresBackend
            from .._backends.postgres import migrate as pg_migrate

            in_url = PostgresBackend.from_url(url).schema if "schema=" in url else None
            if schema is not None and in_url is not None and schema != in_url:
                raise InvalidArgument(f"the URL names schema {in_url!r} and --schema "
                                      f"{schema!r}: give one")
            target = in_url or schema or DEFAULT_SCHEMA
            version = await pg_migrate(url, target)
            return f"schema {target}: version {version} is in place"
        from .._rheo import Rheo

        async with Rheo(url):
            pass
        return "schema is in place"

    message = run(out, go, url)
    done(json, {"url": redact_url(url), "result": message},
         f"{redact_url(url)}: {message}")


def _partitions_text(partitions: list[int] | None) -> str:
    if not partitions:
        return "every partition"
    return "partition" + ("s " if len(partitions) > 1 else " ") + ", ".join(
        str(p) for p in sorted(set(partitions)))


def register(app: typer.Typer) -> None:
    """Add the commands that change a store to ``app``."""
    app.command(cls=Command)(append)
    app.command(cls=Command)(redrive)
    app.command(cls=Command)(replay)
    app.command(cls=Command)(reset)
    app.command(cls=Command)(trim)
    app.command("delete-stream", cls=Command)(delete_stream)
    app.command("delete-group", cls=Command)(delete_group)
    app.command(cls=Command)(migrate)
