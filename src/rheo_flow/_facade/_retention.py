"""What :meth:`~rheo_flow.Rheo.trim` may remove: the bounds asked for, per partition,
capped at the lowest frontier of the stream's groups unless forced."""

from __future__ import annotations

from collections.abc import Mapping

from .._backend import Backend
from .._model._errors import InvalidArgument
from .._model._validation import check_partition, check_sequence

__all__ = ["trim_bounds"]


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
