"""Redis and Redis Cluster: ``lag_report`` answers in a few round trips what the report
composed from the backend's other reads answers (tests/_lag_scenario.py); the commands
and the script docs/backends.md gives external tools ("Redis lag for external tools")
read the lag ``Rheo.lag`` reports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ResponseError

from _lag_scenario import build_lag_store, check_lag_report
from rheo_flow import NewEvent, Rheo
from rheo_flow._backends.redis._codec import text
from rheo_flow._facade._lag import composed_lag_report
from test_redis_backend import scratch_backend


@pytest.mark.parametrize("server", ["single", "cluster"])
async def test_the_lag_report_is_the_composed_one(
        server: str, request: pytest.FixtureRequest) -> None:
    url = str(request.getfixturevalue("redis_url" if server == "single"
                                      else "redis_cluster_url"))
    async with scratch_backend(url) as backend, Rheo(backend) as rheo:
        await build_lag_store(rheo)
        await check_lag_report(backend)



async def test_a_report_over_many_partitions_is_read_in_several_script_calls(
        redis_url: str) -> None:
    """On one server a script call reads at most 512 group partitions: a stream of 130
    partitions and 4 groups is split over two calls, beside a small stream."""
    async with scratch_backend(redis_url) as backend, Rheo(backend) as rheo:
        await rheo.create_stream("wide", partitions=130)
        await rheo.create_stream("narrow", partitions=2)
        for group in ("a", "b", "c", "d"):
            await rheo.create_group("wide", group)
        await rheo.create_group("narrow", "a")
        await rheo.append("wide", [NewEvent("e", partition=n % 130) for n in range(300)])
        await rheo.append("narrow", [NewEvent("e", partition=n % 2) for n in range(5)])
        await rheo.ack(await rheo.fetch("wide", "b", limit=40))
        report = await backend.lag_report(None)
        assert report.groups == (await composed_lag_report(backend, None)).groups
        assert [g.lag for g in report.groups] == [5, 300, 260, 300, 300]


DOC = Path(__file__).resolve().parents[3] / "docs" / "backends.md"
SCRIPT = (Path(__file__).resolve().parents[3] / "src" / "rheo_flow" / "_backends" / "redis"
          / "lua" / "group_lag.lua")


def _documented_commands() -> list[list[str]]:
    """The commands docs/backends.md gives external tools, each split into words."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- redis-lag-commands:start -->")[1].split(
        "<!-- redis-lag-commands:end -->")[0]
    body = block.split("```text\n", 1)[1].split("```", 1)[0]
    return [line.split() for line in body.splitlines() if line.strip()]


def _words(template: list[str], names: dict[str, str]) -> list[str]:
    """A documented command with its placeholders (P, S, G, p) filled in."""
    return [template[0], *(re.sub(r"\b[PSGp]\b", lambda m: names[m.group(0)], word)
                           for word in template[1:])]


async def _lag_by_the_commands(client: Any, prefix: str, stream: str,
                               group: str) -> tuple[int, int]:
    """(lag, dead letters) of a group as an external tool reads them: the documented
    commands, the per-partition ones for each partition."""
    record_command, *per_partition = _documented_commands()
    names = {"P": prefix, "S": stream, "G": group}
    record = await client.execute_command(*_words(record_command, names))
    count = int(text(record).split("|", 1)[0])
    lag = dead = 0
    for p in range(count):
        high, frontier, letters = [
            await client.execute_command(*_words(command, {**names, "p": str(p)}))
            for command in per_partition]
        lag += max(0, int(high or 0) - int(frontier or 0))
        dead += int(letters)
    return lag, dead


@pytest.mark.parametrize("server", ["single", "cluster"])
async def test_the_documented_commands_give_the_lag_rheo_reports(
        server: str, request: pytest.FixtureRequest) -> None:
    url = str(request.getfixturevalue("redis_url" if server == "single"
                                      else "redis_cluster_url"))
    async with scratch_backend(url) as backend, Rheo(backend) as rheo:
        await build_lag_store(rheo)
        report = await rheo.lag_report()
        assert len(_documented_commands()) == 4
        for entry in report.groups:
            lag = sum((await rheo.lag(entry.stream, entry.group)).values())
            assert await _lag_by_the_commands(backend.client, backend.prefix, entry.stream,
                                              entry.group) == (lag, entry.dead_letters)
        assert any(entry.lag for entry in report.groups)
        assert any(entry.dead_letters for entry in report.groups)


async def test_the_documented_script_gives_the_lag_rheo_reports(redis_url: str) -> None:
    source = SCRIPT.read_text(encoding="utf-8")
    assert f"```lua\n{source}```" in DOC.read_text(encoding="utf-8")
    async with scratch_backend(redis_url) as backend, Rheo(backend) as rheo:
        await build_lag_store(rheo)
        client = backend.client
        for entry in (await rheo.lag_report()).groups:
            lag = await rheo.lag(entry.stream, entry.group)
            reply = await client.eval(source, 0, backend.prefix, entry.stream, entry.group)
            assert [text(v) if i % 2 == 0 else v for i, v in enumerate(reply)] == [
                "lag", sum(lag.values()), "dead_letters", entry.dead_letters,
                "partitions", len(lag)]
        for stream, group in (("lag-orders", "nobody"), ("lag-nothing", "billing")):
            with pytest.raises(ResponseError, match="unknown stream or group"):
                await client.eval(source, 0, backend.prefix, stream, group)
