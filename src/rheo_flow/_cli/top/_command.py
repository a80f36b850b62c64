"""``rheo-flow top``: the command that starts the live view of :mod:`._view`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from ..._model._errors import MissingExtra
from .._common import StreamArg, UrlOption, console, errors, existing, run

__all__ = ["top"]


def top(
    url: UrlOption,
    stream: StreamArg,
    interval: Annotated[float, typer.Option(
        min=0.1, max=3600, help="Seconds between refreshes.")] = 1.0,
) -> None:
    """Watch a stream live, full screen: lag, throughput and dead letters of every group.

    Per group: events settled per second, settled and dead-lettered since top
    started and, per partition, high water, frontier and lag with a sparkline of
    its history; below, the latest dead letters with their last errors. Keys:
    down/up select a dead letter, r redrives the one selected, Esc unselects,
    p pauses the refresh, s shows the next stream, q quits. Needs the tui extra
    (pip install 'rheo-flow[tui]').
    """
    try:
        from ._view import TopApp
    except MissingExtra as exc:
        errors().print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    target = existing(url)

    async def check() -> None:
        # A missing store or stream is a one-line error here, not a crash of the app.
        from ..._rheo import Rheo

        async with Rheo(target) as rheo:
            await rheo.stream_info(stream)

    run(console(), check, url)
    TopApp(url, stream, interval=interval).run()
