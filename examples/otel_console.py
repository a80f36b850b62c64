"""rheo_flow with the OpenTelemetry SDK, printing spans and metrics to the console.

Run it with ``python examples/otel_console.py`` (it needs ``opentelemetry-sdk``,
part of the ``test`` extra). It configures the global tracer and meter
providers the way an application would, then appends a few orders inside a
``checkout`` span, consumes them with a consumer group (one of them fails
once and is redelivered), and prints every span and, at exit, the metrics.

For a real collector, swap the console exporters for the OTLP ones
(``docs/telemetry.md`` shows how).
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from rheo_flow import ACK, Event, NewEvent, Retry, Rheo, consumer


def configure_opentelemetry() -> tuple[TracerProvider, MeterProvider]:
    """Set the global providers: spans and metrics go to stdout."""
    resource = Resource.create({"service.name": "rheo-flow-example"})
    tracer_provider = TracerProvider(resource=resource)
    # SimpleSpanProcessor prints each span as it ends; use BatchSpanProcessor in production.
    tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(),
                                           export_interval_millis=60_000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    return tracer_provider, meter_provider


ORDERS = 3
declined: set[str] = set()
billed: set[str] = set()
all_billed = asyncio.Event()


@consumer(stream="orders", group="billing", concurrency=2)
async def bill(event: Event, context: Any) -> Any:
    """Bill an order; the first attempt at order 2 asks for a retry."""
    with trace.get_tracer("example").start_as_current_span("charge card"):
        if event.data["order"] == 2 and event.id not in declined:
            declined.add(event.id)
            return Retry("card declined, try again")
        billed.add(event.id)
        if len(billed) == ORDERS:
            all_billed.set()
        return ACK


async def main() -> None:
    """Append orders inside a span, consume them, and stop."""
    tracer_provider, meter_provider = configure_opentelemetry()
    tracer = trace.get_tracer("example")
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("orders", partitions=2)
        with tracer.start_as_current_span("checkout"):
            await rheo.append("orders", [NewEvent("order.placed", {"order": n}, key=f"c-{n}")
                                         for n in range(ORDERS)])
        async with bill.start(rheo):
            await asyncio.wait_for(all_billed.wait(), timeout=30)
        # Leaving the block stops the group: it settles what its handlers finished.
    tracer_provider.shutdown()
    meter_provider.shutdown()  # exports the metrics once more


if __name__ == "__main__":
    asyncio.run(main())
