"""What :meth:`~rheo_flow.Rheo.trim` may remove: the bounds asked for, per partition,
capped at the lowest frontier of the stream's groups unless forced; and a stream's
retention policy (docs/contract.md, rule ``retention.settled``): storing it, and
applying it as such a trim.

A policy's bound in a partition is the later of what its two limits remove:
``max_events`` all but the partition's last ``max_events`` events, ``max_age`` the
events appended before the backend's now minus ``max_age`` (found as a position in
time, :func:`~._positions.positions_at`). The trim then caps it at every group's
frontier like any unforced trim: a policy never removes an event a group has not
settled. A stream without groups has nothing to protect: the policy applies fully.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._backend import Backend
from .._model._errors import InvalidArgument, Unsupported
from .._model._query import Query
from .._model._stream import Retention, StreamInfo
from .._model._validation import check_partition, check_sequence
from ._positions import positions_at

__all__ = ["apply_retention", "check_retention", "retention_bounds", "store_retention",
           "trim_bounds"]


async def trim_bounds(backend: Backend, stream: str, count: int,
                      up_to: int | Mapping[int, int] | None, force: bool) -> dict[int, int]:
    """The inclusive sequence up to which each partition of ``stream`` (of ``count``) is
    trimmed: ``up_to`` for every partition or per partition, ``None`` as far as every
    group has settled; unless ``force``, no further than any group's frontier."""
    if up_to is None:
        bounds: dict[int, int] | None = None
    elif isinstance(up_to, Mapping):
        bounds = {check_partition(p, count): check_sequence("up_to", s)
                  for p, s in up_to.items()}
    else:
        seq = check_sequence("up_to", up_to)
        bounds = dict.fromkeys(range(count), seq)
    groups = await backend.list_groups(stream)
    if bounds is None:
        if not groups:
            raise InvalidArgument("the stream has no group: give up_to to trim it")
        bounds = dict.fromkeys(range(count), 2**62)
    if not force:
        for g in groups:
            frontier = await backend.frontier(stream, g.group)
            bounds = {p: min(s, frontier.get(p, 0)) for p, s in bounds.items()}
    return bounds


def check_retention(backend: Backend, retention: object, *, optional: bool = True
                    ) -> Retention | None:
    """``retention`` when it is a :class:`Retention` (or ``None`` when ``optional``) the
    backend can store; an InvalidArgument or Unsupported otherwise, before any change."""
    if retention is None and optional:
        return None
    if not isinstance(retention, Retention):
        raise InvalidArgument(
            f"retention must be a Retention{' or None' if optional else ''}, got "
            f"{type(retention).__name__}")
    if not backend.capabilities.retention:
        raise Unsupported(backend.name, "set_retention")
    return retention


async def store_retention(backend: Backend, stream: str, retention: Retention | None
                          ) -> StreamInfo:
    """Make ``retention`` the stream's policy (``None`` clears it); its info afterwards."""
    if not backend.capabilities.retention:
        raise Unsupported(backend.name, "set_retention")
    await backend.set_retention(stream, retention)
    return await backend.stream_info(stream)


async def retention_bounds(backend: Backend, info: StreamInfo, policy: Retention
                           ) -> dict[int, int]:
    """Per partition of the stream ``info`` describes, the inclusive sequence up to
    which ``policy`` removes events (0: none), before any frontier's cap."""
    bounds = dict.fromkeys(range(info.partitions), 0)
    if policy.max_events is not None:
        bounds = {p: max(0, info.high_water.get(p, 0) - policy.max_events) for p in bounds}
    if policy.max_age_ms is not None:
        cutoff = await backend.now_ms() - policy.max_age_ms
        for p, last in (await _older_than(backend, info, cutoff)).items():
            bounds[p] = max(bounds[p], last)
    return bounds


async def _older_than(backend: Backend, info: StreamInfo, cutoff: int) -> dict[int, int]:
    """Per partition holding events appended before ``cutoff``, the last such sequence.

    One read of each partition's first retained event tells the partitions with none
    (a policy's steady state: a round costs one query per partition); only the others
    are searched (:func:`~._positions.positions_at`)."""
    older = []
    for p in range(info.partitions):
        low, high = info.low_water.get(p, 1), info.high_water.get(p, 0)
        if low > high:
            continue
        query = Query(stream=info.name, partitions=[p], from_sequence=low, to_sequence=high)
        first = await backend.query(query, 1, None)
        if first and first[0].appended_at_ms < cutoff:
            older.append(p)
    if not older:
        return {}
    return {p: first - 1 for p, first in
            (await positions_at(backend, info.name, cutoff, older)).items()}


async def apply_retention(backend: Backend, stream: str, retention: Retention | None,
                          force: bool) -> dict[int, int]:
    """Trim ``stream`` as ``retention`` says (``None``: its stored policy; none stored
    removes nothing), capped at every group's frontier unless ``force``; returns how
    many events were removed per partition."""
    if retention is not None and not isinstance(retention, Retention):
        raise InvalidArgument(f"retention must be a Retention, got {type(retention).__name__}")
    info = await backend.stream_info(stream)
    removed = dict.fromkeys(range(info.partitions), 0)
    policy = retention or info.retention
    if policy is None:
        return removed
    bounds = await retention_bounds(backend, info, policy)
    wanted = {p: b for p, b in bounds.items() if b >= info.low_water.get(p, 1)}
    if wanted:
        capped = await trim_bounds(backend, stream, info.partitions, wanted, force)
        if any(b >= info.low_water.get(p, 1) for p, b in capped.items()):
            removed.update(await backend.trim(stream, capped))
    return removed
