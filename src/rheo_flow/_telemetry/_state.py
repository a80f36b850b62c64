"""Where rheo_flow's tracer comes from, and the switch that turns instrumentation off.

Nothing is resolved at import time: the tracer is looked up on first use and
again whenever the provider changes (the global one is set, or a test sets an
explicit one), so an application may configure OpenTelemetry after importing
rheo_flow. With no SDK configured (the API's proxy or no-op provider) the
lookup returns ``None`` and every instrumented call skips its telemetry.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from opentelemetry import metrics, trace

from .._version import __version__
from ._names import INSTRUMENTATION_NAME

try:
    from opentelemetry.metrics import _internal as _metrics_api
except ImportError:  # another API layout: the public getter is used
    _metrics_api = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["ENV_SWITCH", "OFF", "STATE", "LagSource", "Off", "State", "tracer"]

ENV_SWITCH = "RHEO_FLOW_TELEMETRY"
"""Set to ``off`` (or ``0`` / ``false`` / ``no``) to start with instrumentation disabled."""

_OFF = frozenset({"0", "off", "false", "no", "disabled"})
_NOOP_METER_PROVIDERS = frozenset({"_ProxyMeterProvider", "NoOpMeterProvider"})
_MISSING = object()
# The API's getters look up an environment variable on every call while no global
# provider is set (about a microsecond); reading the global first makes the no-SDK
# check a module attribute lookup. Without these attributes (another API version)
# the public getters are used.
_TRACER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_METER_FROM_ENV = "OTEL_PYTHON_METER_PROVIDER" in os.environ


def _global_tracer_provider() -> trace.TracerProvider | None:
    """The global tracer provider, or ``None`` when none was set."""
    provider = getattr(trace, "_TRACER_PROVIDER", _MISSING)
    if provider is None and not _TRACER_FROM_ENV:
        return None
    return trace.get_tracer_provider()


def _global_meter_provider() -> metrics.MeterProvider | None:
    """The global meter provider, or ``None`` when none was set."""
    provider = getattr(_metrics_api, "_METER_PROVIDER", _MISSING)
    if provider is None and not _METER_FROM_ENV:
        return None
    return metrics.get_meter_provider()


class LagSource(Protocol):
    """A runtime's cached lag per partition, observed by the lag gauge."""

    def observations(self) -> Iterable[tuple[int, dict[str, str]]]:
        """``(lag, attributes)`` pairs from the cache (never a backend call)."""
        ...

    def inflight_observations(self) -> Iterable[tuple[int, dict[str, str]]]:
        """``(leases held, attributes)`` of the runtime (never a backend call)."""
        ...


class State:
    """Process-wide telemetry settings (one instance: :data:`STATE`)."""

    __slots__ = (
        "_meter_seen",
        "_tracer",
        "_tracer_seen",
        "create_spans",
        "enabled",
        "instruments",
        "lag_refresh",
        "lag_sources",
        "meter_provider",
        "tracer_provider",
    )

    def __init__(self) -> None:
        self.enabled = os.environ.get(ENV_SWITCH, "").strip().lower() not in _OFF
        self.tracer_provider: trace.TracerProvider | None = None
        """An explicit provider used instead of the global one (``None``: the global)."""
        self.meter_provider: metrics.MeterProvider | None = None
        self.create_spans = True
        """One ``create`` span per event of a multi-event append (the conventions' default)."""
        self.lag_refresh = 10.0
        """Seconds a cached lag value is considered fresh."""
        self.lag_sources: set[LagSource] = set()
        self.instruments: object = None
        """The instrument bundle of the current meter provider (set by ``_metrics``)."""
        self._tracer_seen: object = None
        self._tracer: trace.Tracer | None = None
        self._meter_seen: object = None

    def reset_cache(self) -> None:
        """Forget the resolved tracer and instruments (after a provider change)."""
        self._tracer_seen = None
        self._tracer = None
        self._meter_seen = None
        self.instruments = None

    def current_meter_provider(self) -> metrics.MeterProvider | None:
        """The meter provider to record with, or ``None`` when metrics are off or no-op."""
        if not self.enabled:
            return None
        provider = self.meter_provider or _global_meter_provider()
        if provider is None or type(provider).__name__ in _NOOP_METER_PROVIDERS:
            return None
        return provider

    def meter_changed(self, provider: object) -> bool:
        """Whether ``provider`` differs from the one the instruments were built for."""
        if provider is self._meter_seen:
            return False
        self._meter_seen = provider
        return True


STATE = State()


def _version() -> str:
    return __version__


def tracer() -> trace.Tracer | None:
    """rheo_flow's tracer, or ``None`` when disabled or when no SDK provider is set."""
    state = STATE
    if not state.enabled:
        return None
    provider = state.tracer_provider or _global_tracer_provider()
    if provider is None:
        return None
    if provider is not state._tracer_seen:
        state._tracer_seen = provider
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            state._tracer = None
        else:
            state._tracer = provider.get_tracer(INSTRUMENTATION_NAME, _version())
    return state._tracer


class Off:
    """The context manager of an instrumented step while telemetry is off: yields ``None``."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


OFF = Off()
"""The one :class:`Off` instance."""
