"""A consumer group's options, resolved from where they are given.

An option of a :class:`~rheo_flow.Group` comes from the keyword arguments of
``start(rheo, **options)`` (or ``Group(rheo, consumer, **options)``), else
from the consumer's constructor (or ``@consumer``) keywords, else from its class
attribute; every other key is an application key, passed to ``setup`` as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

from .._model._errors import InvalidArgument
from .._rheo import Rheo
from ._options import GROUP
from ._retry_policy import RetryPolicy

__all__ = ["Configured", "resolve_group_options"]


class Configured(Protocol):
    """What resolving reads of a :class:`~rheo_flow.Consumer`: the keywords it was built
    with (its class attributes are read by name). A protocol, so the group's options sit
    below the group."""

    @property
    def options(self) -> Mapping[str, Any]:
        """The consumer's constructor (or ``@consumer``) keywords."""


def resolve_group_options(rheo: Rheo, consumer: Configured, options: Mapping[str, Any]
                          ) -> Mapping[str, Any]:
    """Every option of the group, validated and with its default filled in (a generated
    consumer id, ``fetch_size`` = ``max_demand``, ``RetryPolicy()``), after the
    application keys, with ``rheo``; read-only. Raises
    :class:`~rheo_flow.InvalidArgument` for a bad value or a missing stream or group."""
    merged = {**consumer.options, **options}
    values = {name: merged.pop(name, getattr(consumer, name, None)) for name in GROUP.names}
    for required in ("stream", "group"):
        if values[required] is None:
            raise InvalidArgument(
                f"{type(consumer).__name__} has no {required}: set the {required!r} class "
                f"attribute or pass {required}=..."
            )
    chosen = GROUP.resolve(values)
    if chosen["fetch_size"] is None:
        chosen["fetch_size"] = chosen["max_demand"]
    if chosen["consumer_id"] is None:
        chosen["consumer_id"] = rheo.new_consumer_id()
    if chosen["retry_policy"] is None:
        chosen["retry_policy"] = RetryPolicy()
    stream, group = chosen.pop("stream"), chosen.pop("group")
    return MappingProxyType({**merged, "stream": stream, "group": group, "rheo": rheo,
                             **chosen})
