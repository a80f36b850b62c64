"""A module imported on the first read of one of its attributes through a global."""

from __future__ import annotations

import subprocess
import sys

from rheo_flow._support._lazy import LazyModule


def test_the_first_read_imports_the_module_and_takes_the_globals_place() -> None:
    namespace: dict[str, object] = {}
    namespace["colorsys"] = LazyModule("colorsys", namespace, "colorsys")
    assert "imported on first use" in repr(namespace["colorsys"])
    assert namespace["colorsys"].rgb_to_hsv(1, 0, 0) == (0, 1, 1)  # type: ignore[attr-defined]
    import colorsys

    assert namespace["colorsys"] is colorsys


def test_the_facade_loads_opentelemetry_with_its_first_append() -> None:
    code = """
import asyncio, sys
from rheo_flow import NewEvent, Rheo

async def main():
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("s")
        print("opentelemetry" in sys.modules)
        await rheo.append("s", [NewEvent("t", {})])
        print("opentelemetry" in sys.modules)

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.split() == ["False", "True"]
