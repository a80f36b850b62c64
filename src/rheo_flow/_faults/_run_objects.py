"""What a scenario's endpoints set up for a run (a proxy, a server), found again by ``disrupt``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final, Generic, TypeVar

from ._scenario import RunControl

__all__ = ["NETWORKED", "RunObjects"]

NETWORKED: Final = frozenset({"postgres", "redis"})
"""The backend families whose server and network the server and network scenarios fault."""

T = TypeVar("T")


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
