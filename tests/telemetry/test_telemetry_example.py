"""The console example runs and shows the spans the docs describe, linked end to end.

It runs in a subprocess because it sets OpenTelemetry's global providers, which
can be set only once per process; so it also checks that rheo_flow picks up
providers set globally after it was imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _documents(text: str) -> list[dict[str, Any]]:
    """The JSON objects the console exporters printed one after the other."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    index = 0
    while True:
        start = text.find("{", index)
        if start < 0:
            return out
        document, index = decoder.raw_decode(text, start)
        out.append(document)


def test_console_example_links_consumers_to_the_checkout_trace() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "otel_console.py")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    documents = _documents(run.stdout)
    spans = [d for d in documents if "kind" in d and "context" in d]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    assert len(by_name["create orders"]) == 3
    assert len(by_name["send orders"]) == 1
    [checkout] = by_name["checkout"]
    trace_id = checkout["context"]["trace_id"]
    assert {s["context"]["trace_id"] for s in by_name["create orders"]} == {trace_id}
    created = {s["context"]["span_id"] for s in by_name["create orders"]}
    processes = by_name["process orders"]
    assert len(processes) == 4  # three orders, one of them twice
    for process in processes:
        assert process["kind"] == "SpanKind.CONSUMER"
        [link] = process["links"]
        assert link["context"]["span_id"] in created
        assert link["context"]["trace_id"] == trace_id
    outcomes = sorted(p["attributes"]["rheo.process.outcome"] for p in processes)
    assert outcomes == ["ack", "ack", "ack", "retry"]
    assert by_name["nack orders"]
    assert by_name["ack orders"]
    metrics = {m["name"] for d in documents for r in d.get("resource_metrics", [])
               for s in r["scope_metrics"] for m in s["metrics"]}
    assert {"messaging.client.operation.duration", "messaging.client.sent.messages",
            "messaging.client.consumed.messages", "messaging.process.duration",
            "rheo.settle.outcomes"} <= metrics
