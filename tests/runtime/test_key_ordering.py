"""Key-ordered groups beyond the conformance kit: the facade's checks, the runtimes'
``ordering`` option, SQLite's schema upgrade to version 5 and docs/ordering.md.

The rule itself (a delivery of key K waits for every earlier one of K) is checked
on every backend declaring ``key_ordering`` by the kit (rheo_flow/testing,
``_cases_ordering.py`` and the stateful model), and across processes by
tests/runtime/test_key_ordering_processes.py.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from _doc_blocks import expected_output, python_blocks
from _sqlite_ranges import ranges_to_delivery_rows, undo_schema_7, undo_schema_8
from rheo_flow import ACK, Capabilities, Event, InvalidArgument, NewEvent, Rheo, consumer
from rheo_flow._backends import sqlite as sqlite_module
from rheo_flow.backends import MemoryBackend, SQLiteBackend
from rheo_flow.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[2]


class _Unordered(MemoryBackend):
    """A backend that does not declare key_ordering, with create_group's old signature."""

    name = "unordered"
    calls: list[tuple[Any, ...]]

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, key_ordering=False)

    async def create_group(self, stream: str, group: str, start: Any,  # type: ignore[override]
                           max_attempts: int | None) -> Any:
        return await super().create_group(stream, group, start, max_attempts)


async def test_key_ordering_needs_the_capability() -> None:
    async with Rheo(_Unordered()) as rheo:
        await rheo.create_stream("s")
        with pytest.raises(InvalidArgument, match=r"key_ordering.*'unordered'"):
            await rheo.create_group("s", "g", ordering="key")
        assert await rheo.groups("s") == []
        info = await rheo.create_group("s", "g")  # the old signature: no ordering passed
        assert info.ordering == "none"
        await rheo.append("s", [NewEvent("t", key="a"), NewEvent("t", key="a")])
        assert len(await rheo.fetch("s", "g")) == 2


@pytest.mark.parametrize("value", ["keys", "", None, 1, "KEY"])
async def test_an_unknown_ordering_is_refused_naming_it(value: Any) -> None:
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("s")
        with pytest.raises(InvalidArgument, match=f"ordering must be .*got {value!r}"):
            await rheo.create_group("s", "g", ordering=value)


async def test_fetch_creating_a_group_takes_an_existing_ordering() -> None:
    backend = MemoryBackend()
    async with Rheo(backend) as first, Rheo(backend) as second:
        await first.create_stream("s")
        await first.create_group("s", "g", ordering="key")
        await first.append("s", [NewEvent("t", key="a"), NewEvent("t", key="a")])
        assert [x.sequence for x in await second.fetch("s", "g")] == [1]


async def _handle(event: Event, context: Any) -> Any:
    return ACK


async def test_a_group_runtime_creates_the_group_with_its_ordering() -> None:
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", key="a")])
        keyed = consumer(stream="s", group="keyed", ordering="key")(_handle)
        async with keyed.start(rheo) as group:
            await group.drain(timeout=5)
        assert (await rheo.group_info("s", "keyed")).ordering == "key"
        async with keyed.start(rheo, ordering=None) as group:  # None: as the group is
            await group.drain(timeout=5)
        plain = consumer(stream="s", group="plain")(_handle)
        async with plain.start(rheo) as group:
            await group.drain(timeout=5)
        assert (await rheo.group_info("s", "plain")).ordering == "none"
        with pytest.raises(InvalidArgument, match="exists with ordering 'none', not 'key'"):
            async with plain.start(rheo, ordering="key"):
                pass
        with pytest.raises(InvalidArgument, match="ordering must be"):
            plain.start(rheo, ordering="sorted")


async def test_a_pipeline_creates_the_group_with_its_ordering() -> None:
    class Echo:
        async def handle_message(self, processor: str, message: Any, context: Any) -> Any:
            return message

    async with Rheo("memory://") as rheo:
        await rheo.create_stream("s")
        async with Pipeline(rheo, stream="s", group="p", handler=Echo(), ordering="key"):
            await asyncio.sleep(0)
        assert (await rheo.group_info("s", "p")).ordering == "key"


async def test_a_version_3_sqlite_file_upgrades_in_place(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    async with Rheo(SQLiteBackend(db)) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", key="a") for _ in range(3)])
        first, *_ = await rheo.fetch("s", "g", limit=3)
        await rheo.ack(first)
    conn = sqlite3.connect(db)
    try:  # back to what version 3 left: no ranges, ordering, delivery key or index
        undo_schema_8(conn)
        undo_schema_7(conn)
        ranges_to_delivery_rows(conn)
        conn.execute("DROP INDEX deliveries_keyed")
        conn.execute("ALTER TABLE deliveries DROP COLUMN key")
        conn.execute("ALTER TABLE groups DROP COLUMN ordering")
        conn.execute("PRAGMA user_version = 3")
        conn.commit()
    finally:
        conn.close()
    async with Rheo(SQLiteBackend(db)) as rheo:
        assert (await rheo.group_info("s", "g")).ordering == "none"
        assert await rheo.frontier("s", "g") == {0: 1}
        await rheo.create_group("s", "keyed", ordering="key")
        assert [x.sequence for x in await rheo.fetch("s", "keyed")] == [1]
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (
            sqlite_module.SCHEMA_VERSION,)
        assert sqlite_module.SCHEMA_VERSION >= 7
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
        assert "deliveries_keyed" in names
    finally:
        conn.close()


@pytest.mark.parametrize("number", range(len(python_blocks(ROOT / "docs/ordering.md"))))
def test_ordering_page_examples_print_what_they_say(number: int, tmp_path: Path) -> None:
    code = python_blocks(ROOT / "docs/ordering.md")[number]
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected_output(code)
