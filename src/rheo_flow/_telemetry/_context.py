"""Message creation contexts: W3C ``traceparent`` / ``tracestate`` in event headers.

The creation context of an event travels in its headers as W3C Trace Context,
whatever propagator the application configured: the headers are part of the
stored event, read by consumers in other processes and languages, so their
format must not depend on one process's settings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from opentelemetry.trace import Link, SpanContext, TraceFlags, TraceState

from .._model._event import Event
from ._names import MESSAGE_ID

__all__ = ["TRACEPARENT", "TRACESTATE", "carrier", "creation_context", "link", "links"]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

# The W3C grammar, as OpenTelemetry's TraceContextTextMapPropagator reads it.
_TRACEPARENT = re.compile(
    r"^\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\s*$")


def carrier(context: SpanContext) -> dict[str, str]:
    """The W3C headers naming ``context`` (empty for an invalid context)."""
    if not context.is_valid:
        return {}
    headers = {TRACEPARENT: f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                            f"{context.trace_flags:02x}"}
    state = context.trace_state.to_header()
    if state:
        headers[TRACESTATE] = state
    return headers


def creation_context(headers: Mapping[str, str]) -> SpanContext | None:
    """The creation context carried by event headers, or ``None`` when there is none."""
    parent = headers.get(TRACEPARENT)
    if parent is None:
        return None
    return _parse(parent, headers.get(TRACESTATE))


@lru_cache(maxsize=8192)
def _parse(parent: str, state: str | None) -> SpanContext | None:
    # Cached: a fetch and the process spans after it read the same headers. The
    # tests check it against the propagator on valid and malformed headers.
    match = _TRACEPARENT.match(parent)
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    context = SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True,
        trace_flags=TraceFlags(int(flags, 16)),
        trace_state=TraceState.from_header([state]) if state else None,
    )
    return context if context.is_valid else None


def link(event: Event) -> Link | None:
    """A link to the event's creation context, carrying its message id."""
    context = creation_context(event.headers)
    if context is None:
        return None
    return Link(context, {MESSAGE_ID: event.id})


def links(events: Iterable[Event]) -> list[Link]:
    """Links to the creation contexts of ``events`` (those that carry one)."""
    out: list[Link] = []
    for event in events:
        headers = event.headers
        parent = headers.get(TRACEPARENT)
        if parent is None:
            continue
        context = _parse(parent, headers.get(TRACESTATE))
        if context is not None:
            out.append(Link(context, {MESSAGE_ID: event.id}))
    return out
