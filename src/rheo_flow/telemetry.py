"""OpenTelemetry instrumentation: switches and provider overrides.

rheo_flow depends on the OpenTelemetry API only. Configure the SDK in your
application (a ``TracerProvider`` and a ``MeterProvider``, set globally) and
rheo_flow emits spans and metrics following the OpenTelemetry messaging
semantic conventions; without an SDK it emits nothing and costs close to
nothing. See ``docs/telemetry.md`` for every span, attribute and metric.

This module adjusts that behaviour:

* :func:`disable` / :func:`enable` turn the instrumentation off and on for the
  process (the environment variable ``RHEO_FLOW_TELEMETRY=off`` starts with it
  off), e.g. to measure its overhead;
* :func:`set_tracer_provider` / :func:`set_meter_provider` make rheo_flow use
  explicit providers instead of the global ones (OpenTelemetry's global
  providers can be set only once per process, which tests cannot live with);
* :func:`configure` chooses between ``create`` spans per appended event and a
  shared ``send`` context, and how fresh the lag gauge is.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from ._model._errors import InvalidArgument
from ._model._settle_results import SettleKind
from ._telemetry import STATE
from ._telemetry._names import INSTRUMENTATION_NAME, OTHER, PROCESS_ERROR_TYPES

__all__ = [
    "ERROR_TYPES",
    "INSTRUMENTATION_NAME",
    "configure",
    "disable",
    "enable",
    "is_enabled",
    "set_meter_provider",
    "set_tracer_provider",
]

ERROR_TYPES: tuple[str, ...] = (*(k.value for k in SettleKind), *PROCESS_ERROR_TYPES, OTHER)
"""Every value rheo_flow puts in ``error.type``: the six settle kinds, the process
failure categories, ``cancelled`` and ``_OTHER`` (several kinds in one operation)."""


def enable() -> None:
    """Turn the instrumentation on (the default unless ``RHEO_FLOW_TELEMETRY=off``)."""
    STATE.enabled = True
    STATE.reset_cache()


def disable() -> None:
    """Turn the instrumentation off: no spans, no metrics, no trace headers injected."""
    STATE.enabled = False
    STATE.reset_cache()


def is_enabled() -> bool:
    """Whether the instrumentation is on (it still records nothing without an SDK)."""
    return STATE.enabled


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Use ``provider`` for rheo_flow's spans instead of the global one (``None``: the
    global provider again)."""
    _check_provider(provider, TracerProvider)
    STATE.tracer_provider = provider
    STATE.reset_cache()


def set_meter_provider(provider: MeterProvider | None) -> None:
    """Use ``provider`` for rheo_flow's metrics instead of the global one (``None``: the
    global provider again)."""
    _check_provider(provider, MeterProvider)
    STATE.meter_provider = provider
    STATE.reset_cache()


def _check_provider(provider: object, kind: type[Any]) -> None:
    if provider is not None and not isinstance(provider, kind):
        raise InvalidArgument(
            f"expected an opentelemetry {kind.__name__} or None, got {type(provider).__name__}")


def configure(*, create_spans: bool | None = None, lag_refresh: float | None = None) -> None:
    """Adjust the instrumentation; arguments left ``None`` keep their value.

    ``create_spans`` (default true): an append of several events creates one
    ``create`` span per event and injects each one's context into that event;
    false injects the ``send`` span's context into every event instead (one span
    per append, whatever its size).

    ``lag_refresh`` (default 10): seconds a cached ``rheo.consumer.lag`` value
    stays fresh; a metric collection that finds it older refreshes it in the
    background.
    """
    if create_spans is not None:
        if not isinstance(create_spans, bool):
            raise InvalidArgument(f"create_spans must be a bool, got {create_spans!r}")
        STATE.create_spans = create_spans
    if lag_refresh is not None:
        if isinstance(lag_refresh, bool) or not isinstance(lag_refresh, int | float) or not (
                math.isfinite(lag_refresh) and lag_refresh >= 0):
            raise InvalidArgument(
                f"lag_refresh must be a number of seconds >= 0, got {lag_refresh!r}")
        STATE.lag_refresh = float(lag_refresh)
