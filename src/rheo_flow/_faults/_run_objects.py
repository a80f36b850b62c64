"""What a scenario's endpoints set up for a run (a proxy, a server), found again by ``disrupt``;
and the endpoints on a throwaway server or cluster that the server scenarios share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

from ._scenario import Endpoints, RunControl

__all__ = ["NETWORKED", "RunObjects", "Throwaway", "throwaway_endpoints_of"]

NETWORKED: Final = frozenset({"postgres", "redis"})
"""The backend families whose server and network the server and network scenarios fault."""

T = TypeVar("T")


class Throwaway(Protocol):
    """A server or cluster a run may start for itself, kill and bring back."""

    @property
    def url(self) -> str:
        """Its URL."""

    @property
    def running(self) -> bool:
        """Whether it serves now."""

    def close(self) -> None:
        """Stop it for good."""


W = TypeVar("W", bound=Throwaway)


class RunObjects(Generic[T]):
    """The object of each running scenario, by the URL its workload uses.

    The endpoints register it for the run's duration; ``disrupt`` gets it back
    from its :class:`RunControl` (whose ``url`` is that workload URL).
    """

    def __init__(self, what: str, endpoints: str) -> None:
        self._what = what
        self._endpoints = endpoints
        self._by_url: dict[str, T] = {}

    @contextlib.contextmanager
    def registered(self, workload_url: str, obj: T) -> Iterator[None]:
        """Make ``obj`` the run's object while the block runs."""
        self._by_url[workload_url] = obj
        try:
            yield
        finally:
            self._by_url.pop(workload_url, None)

    def of(self, run: RunControl) -> T:
        """The object of ``run`` (its endpoints registered it)."""
        try:
            return self._by_url[run.url]
        except KeyError:
            raise RuntimeError(f"this run has no {self._what}: the scenario must use "
                               f"{self._endpoints}") from None


@contextlib.asynccontextmanager
async def throwaway_endpoints_of(
    objects: RunObjects[W], url: str, owned: W | None, start: Callable[[], W],
    revive: Callable[[W], object],
) -> AsyncIterator[Endpoints]:
    """Endpoints on a throwaway server or cluster, registered in ``objects`` for the run.

    ``owned`` is the one ``url`` names when this process started it (then the run uses
    it, and ``revive`` gives it back running); otherwise ``start`` makes one for the run,
    closed at its end. The URL's query string is kept.
    """
    obj = owned if owned is not None else await asyncio.to_thread(start)
    query = urlsplit(url).query
    run_url = f"{obj.url}?{query}" if query else obj.url
    if not obj.running:
        await asyncio.to_thread(revive, obj)
    try:
        with objects.registered(run_url, obj):
            yield Endpoints(run_url, run_url)
    finally:
        if owned is None:
            await asyncio.to_thread(obj.close)
        elif not obj.running:
            await asyncio.to_thread(revive, obj)  # give the owner its server back
