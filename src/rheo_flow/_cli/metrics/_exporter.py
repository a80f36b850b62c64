"""The one instrumentation path to ``/metrics``: an OpenTelemetry meter provider whose
reader is the OpenTelemetry Prometheus exporter, rendered into a registry of its own.

rheo_flow's own instruments (:mod:`rheo_flow._telemetry._metrics`) record to it when
``runtime`` is set (the worker); the store gauges (:mod:`._store`) register on it too.
So the page has one naming scheme: OpenTelemetry names with dots as underscores, the
unit as a suffix (``_seconds``), counters with ``_total``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._model._errors import MissingExtra

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

__all__ = ["CONTENT_TYPE", "MISSING_EXTRA", "PrometheusExport", "available"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format's content type."""
MISSING_EXTRA = str(MissingExtra("/metrics endpoint", "prometheus",
                                  "opentelemetry-exporter-prometheus"))


def available() -> bool:
    """Whether the prometheus extra is installed."""
    from importlib.util import find_spec

    try:
        return all(find_spec(name) is not None for name in (
            "prometheus_client", "opentelemetry.sdk.metrics",
            "opentelemetry.exporter.prometheus"))
    except ImportError:  # a parent package is missing
        return False


class PrometheusExport:
    """A meter provider read by the Prometheus exporter, and the page it renders.

    With ``runtime`` rheo_flow's instruments record to it (it becomes rheo_flow's
    meter provider, :func:`rheo_flow.telemetry.set_meter_provider`, until closed).
    The process collector (CPU, memory, open files) is on the page as well.
    """

    def __init__(self, *, runtime: bool) -> None:
        if not available():
            raise MissingExtra("/metrics endpoint", "prometheus",
                               "opentelemetry-exporter-prometheus")
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import CollectorRegistry, ProcessCollector

        self._registry = CollectorRegistry()
        ProcessCollector(registry=self._registry)
        self._provider = MeterProvider(metric_readers=[_reader(self._registry)],
                                       views=_views())
        self._runtime = runtime
        if runtime:
            from ...telemetry import set_meter_provider

            set_meter_provider(self._provider)

    def meter(self, name: str) -> Meter:
        """A meter of this provider (the store gauges register on one)."""
        return self._provider.get_meter(name)

    def render(self) -> bytes:
        """The page, in the Prometheus text format (runs the gauges' callbacks: call it off
        the event loop, on a thread)."""
        from prometheus_client import generate_latest

        return generate_latest(self._registry)

    def close(self) -> None:
        """Stop recording (rheo_flow's metrics go back to the global provider)."""
        if self._runtime:
            from ...telemetry import set_meter_provider

            set_meter_provider(None)
        self._provider.shutdown()


SERIES_LIMIT = 1_000_000
"""Series one metric may have on the page. The SDK's default (2,000) folds the rest into
one ``otel_metric_overflow`` series: 100 streams of 4 groups and 8 partitions are 3,200
series of ``rheo_store_lag`` already. The series come from the store's own shape (and the
runtimes' streams and groups), not from event data."""


def _views() -> list[Any]:
    """A view raising every instrument's series limit to :data:`SERIES_LIMIT` (none on an
    SDK older than the limit's option: its default then applies)."""
    from opentelemetry.sdk.metrics.view import View

    try:
        return [View(instrument_name="*", aggregation_cardinality_limit=SERIES_LIMIT)]
    except TypeError:  # an SDK before aggregation_cardinality_limit
        return []


def _reader(registry: Any) -> Any:
    """The exporter's reader on ``registry``: no ``target_info`` and no scope labels, so
    every series has only its own attributes as labels."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    try:
        return PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False,
                                      registry=registry)
    except TypeError:  # an exporter older than registry= (and scope_info_enabled=)
        reader = PrometheusMetricReader(disable_target_info=True)
        from prometheus_client import REGISTRY

        REGISTRY.unregister(reader._collector)
        registry.register(reader._collector)
        return reader
