"""rheo_flow's instruments: messaging client metrics, settle outcomes and consumer lag."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import metrics

from . import _names as n
from ._state import STATE, _version

__all__ = ["Instruments", "instruments"]


class Instruments:
    """Every instrument rheo_flow records with, built from one meter."""

    __slots__ = ("consumed", "fetch_size", "inflight", "lag", "operation_duration",
                 "process_duration", "sent", "settle_outcomes")

    def __init__(self, meter: metrics.Meter) -> None:
        self.operation_duration = _histogram(
            meter, n.OPERATION_DURATION,
            "Duration of messaging operations (send, poll, ack, nack, reject, renew).")
        self.process_duration = _histogram(
            meter, n.PROCESS_DURATION, "Duration of processing operations.")
        self.sent = meter.create_counter(
            n.SENT_MESSAGES, unit="{message}",
            description="Number of messages the producer attempted to send.")
        self.consumed = meter.create_counter(
            n.CONSUMED_MESSAGES, unit="{message}",
            description="Number of messages delivered to the application by fetches.")
        self.settle_outcomes = meter.create_counter(
            n.SETTLE_OUTCOMES, unit="{lease}",
            description="Settled or renewed leases by outcome, classified kind and decision.")
        self.lag = meter.create_observable_gauge(
            n.CONSUMER_LAG, callbacks=[_observe_lag], unit="{message}",
            description="Events appended but not yet settled by the group, per partition "
                        "(high water minus contiguous frontier), as last refreshed.")
        self.inflight = meter.create_observable_gauge(
            n.INFLIGHT_LEASES, callbacks=[_observe_inflight], unit="{lease}",
            description="Leases a runtime of this process holds (fetched, not yet settled).")
        self.fetch_size = _fetch_size(meter)


def _histogram(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    try:
        return meter.create_histogram(
            name, unit="s", description=description,
            explicit_bucket_boundaries_advisory=list(n.DURATION_BUCKETS))
    except TypeError:  # an API older than the bucket advisory
        return meter.create_histogram(name, unit="s", description=description)


def _fetch_size(meter: metrics.Meter) -> metrics.Histogram:
    description = "Leases returned by a non-empty fetch (an empty poll records nothing)."
    try:
        return meter.create_histogram(
            n.FETCH_SIZE, unit="{lease}", description=description,
            explicit_bucket_boundaries_advisory=list(n.FETCH_SIZE_BUCKETS))
    except TypeError:  # an API older than the bucket advisory
        return meter.create_histogram(n.FETCH_SIZE, unit="{lease}", description=description)


def instruments() -> Instruments | None:
    """The instruments of the current meter provider, or ``None`` when metrics are off."""
    state = STATE
    provider = state.current_meter_provider()
    if provider is None:
        return None
    bundle = state.instruments
    if state.meter_changed(provider) or not isinstance(bundle, Instruments):
        bundle = Instruments(provider.get_meter(n.INSTRUMENTATION_NAME, _version()))
        state.instruments = bundle
    return bundle


def _observe_lag(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
    # Runs on the metric reader's thread: reads cached values only.
    latest: dict[tuple[tuple[str, str], ...], int] = {}
    for source in list(STATE.lag_sources):
        for value, attributes in source.observations():
            latest[tuple(sorted(attributes.items()))] = value
    return [metrics.Observation(value, dict(key)) for key, value in latest.items()]


def _observe_inflight(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
    # Runs on the metric reader's thread: a len() per runtime, no backend call.
    totals: dict[tuple[tuple[str, str], ...], int] = {}
    for source in list(STATE.lag_sources):
        for value, attributes in source.inflight_observations():
            key = tuple(sorted(attributes.items()))
            totals[key] = totals.get(key, 0) + value
    return [metrics.Observation(value, dict(key)) for key, value in totals.items()]
