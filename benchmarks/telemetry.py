"""Suite ``telemetry``: what the OpenTelemetry instrumentation costs the pipeline.

The ``pipeline`` suite's pipeline (same shape, no-op handlers, in-memory
backend) consumes the same backlog in four modes:

* ``off``: instrumentation switched off (``rheo_flow.telemetry.disable()``), the baseline;
* ``no-op API``: instrumentation on, no SDK configured (what a library user who
  does not use OpenTelemetry gets): every call checks the provider and skips;
* ``SDK traces``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor``
  whose exporter discards the spans (the cost of recording and queueing them,
  not of shipping them);
* ``SDK traces, 10% sampled``: the same with a ``TraceIdRatioBased(0.1)``
  sampler (unsampled spans are not recorded, links included);
* ``SDK traces + metrics``: every span recorded, plus an SDK ``MeterProvider``
  (its reader collects once, at the end);
* ``SDK metrics only``: the ``MeterProvider`` and no tracer provider.

Every event carries a ``traceparent`` header of its own (as if appended by
instrumented producers), so the SDK modes also build one link per message in
every process span. Rounds alternate the modes on a fresh backlog each; the
median of each mode is reported, with its ratio to ``off``. The overhead lines
compare CPU time per event (this process's, the span processor's thread
included) with ``off``: on a shared machine it is steadier than wall time.
Last, the no-op path itself is timed: what one instrumented call (a settle,
a process step) costs when no SDK is configured.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from rheo_flow import NewEvent, Rheo, _telemetry, telemetry

from ._common import Result
from .pipeline import BATCH_CONCURRENCY, BATCH_SIZE, PARTITIONS, PROCESSORS, run_pipeline

MODES = ("off", "no-op API", "SDK traces", "SDK traces, 10% sampled", "SDK traces + metrics",
         "SDK metrics only")


class Discard(SpanExporter):
    """Accepts every span and keeps none (counts them)."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop the spans."""
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


async def traced_backlog(events: int, seed: int) -> Rheo:
    """A fresh in-memory instance with ``events`` events, each with its own creation context."""
    rng = random.Random(seed)
    telemetry.disable()  # the headers are written by hand: no spans while building it
    try:
        rheo = await Rheo("memory://").open()
        await rheo.create_stream("bench", partitions=PARTITIONS)
        chunk = 50_000
        for start in range(0, events, chunk):
            await rheo.append("bench", [
                NewEvent("bench.event", {"n": i}, key=f"k{i % 1000}", headers={
                    "traceparent": f"00-{rng.getrandbits(128) | 1:032x}-"
                                   f"{rng.getrandbits(64) | 1:016x}-01"})
                for i in range(start, min(events, start + chunk))
            ])
    finally:
        telemetry.enable()
    return rheo


class Mode:
    """Switches rheo_flow's telemetry into one of :data:`MODES` for a block."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.spans = 0

    def __enter__(self) -> Mode:
        self._closers: list[Callable[[], object]] = []
        if self.name == "off":
            telemetry.disable()
            return self
        telemetry.enable()
        if self.name.startswith("SDK traces"):
            self._exporter = Discard()
            sampled = self.name.endswith("sampled")
            provider = TracerProvider(
                sampler=ParentBased(TraceIdRatioBased(0.1)) if sampled else None)
            provider.add_span_processor(BatchSpanProcessor(self._exporter))
            telemetry.set_tracer_provider(provider)
            self._closers.append(provider.shutdown)
        if "metrics" in self.name:
            reader = InMemoryMetricReader()
            meters = MeterProvider(metric_readers=[reader])
            telemetry.set_meter_provider(meters)
            self._closers.append(meters.shutdown)
            self._closers.append(reader.get_metrics_data)
        return self

    def __exit__(self, *exc: object) -> None:
        for close in reversed(self._closers):
            close()
        if self.name.startswith("SDK traces"):
            self.spans = self._exporter.exported
        telemetry.set_tracer_provider(None)
        telemetry.set_meter_provider(None)
        telemetry.enable()


async def noop_call_cost() -> dict[str, float]:
    """Nanoseconds per instrumented call on the no-op path (no SDK), by helper."""
    telemetry.enable()
    rheo = await traced_backlog(100, seed=0)
    try:
        leases = await rheo.fetch("bench", "noop", limit=100)
    finally:
        await rheo.close()
    backend = rheo.backend
    settling = _telemetry.settling
    process_event = _telemetry.process_event
    lease = leases[0]
    calls = 200_000
    out: dict[str, float] = {}
    started = time.perf_counter()
    for _ in range(calls):
        with settling("ack", leases, backend, {}):
            pass
    out["settle"] = (time.perf_counter() - started) / calls * 1e9
    started = time.perf_counter()
    for _ in range(calls):
        with process_event(lease, "c"):
            pass
    out["process"] = (time.perf_counter() - started) / calls * 1e9
    started = time.perf_counter()
    for _ in range(calls):
        pass
    empty = (time.perf_counter() - started) / calls * 1e9
    return {name: max(0.0, value - empty) for name, value in out.items()}


def overhead(baseline: float, value: float) -> float:
    """``value`` in percent above ``baseline`` (CPU seconds per event)."""
    return (value / baseline - 1) * 100


async def run(quick: bool) -> list[Result]:
    """Alternate the modes round by round; report medians, ratios and overheads."""
    events = 30_000 if quick else 100_000
    rounds = 5 if quick else 7
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    spans: dict[str, int] = {}
    for r in range(rounds):
        order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
        for mode in order:
            rheo = await traced_backlog(events, seed=r)
            try:
                with Mode(mode) as active:
                    started = time.process_time()
                    rates[mode].append(await run_pipeline(rheo, events))
                    cpu[mode].append((time.process_time() - started) / events)
                spans[mode] = spans.get(mode, 0) + active.spans
            finally:
                await rheo.close()
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    cpu_median = {mode: statistics.median(values) for mode, values in cpu.items()}
    baseline = median["off"]
    note = (f"{events} events, {PROCESSORS} processors, batch {BATCH_SIZE}x{BATCH_CONCURRENCY}, "
            f"median of {rounds} alternating rounds")
    results = [Result("pipeline, instrumentation off", "memory", baseline, "events/s",
                      note=note)]
    for mode in MODES[1:]:
        extra = f"; {spans[mode] // rounds} spans exported per run" if spans[mode] else ""
        results.append(Result.compared(f"pipeline, {mode}", "memory", median[mode], "events/s",
                                       baseline, note + extra))
    cpu_note = (f"extra CPU time per event against instrumentation off "
                f"({cpu_median['off'] * 1e6:.1f} us/event)")
    for mode in MODES[1:]:
        results.append(Result(f"overhead, {mode}", "memory",
                              overhead(cpu_median["off"], cpu_median[mode]), "%", note=cpu_note))
    for helper, ns in (await noop_call_cost()).items():
        results.append(Result(f"no-op path, one {helper} call", "memory", ns, "ns",
                              note="instrumentation on, no SDK: the provider check that skips"))
    return results
