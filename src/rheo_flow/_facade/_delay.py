"""Delayed delivery in the facade (docs/contract.md, "Delayed delivery"): which backend
refuses ``NewEvent(deliver_at=...)``, and how many events of a group's lag are
scheduled for later (what :meth:`~rheo_flow.Rheo.scheduled`, ``rheo-flow lag`` and
``rheo-flow top`` show)."""

from __future__ import annotations

from collections.abc import Mapping

from .._backend import Backend

__all__ = ["scheduled_counts", "undelayed"]


def undelayed(backend: Backend) -> str | None:
    """The backend's name when it has no delayed delivery (its appends refuse
    ``deliver_at``), else None."""
    return None if backend.capabilities.delayed_delivery else backend.name


async def scheduled_counts(backend: Backend, stream: str, frontier: Mapping[int, int],
                           high: Mapping[int, int]) -> dict[int, int]:
    """Per partition of ``high``, the events past ``frontier`` scheduled later than now
    (rule ``delay.lag``); zero everywhere on a backend without delayed delivery."""
    after = {p: frontier.get(p, 0) for p in high}
    if not backend.capabilities.delayed_delivery:
        return dict.fromkeys(after, 0)
    return await backend.scheduled(stream, after)
