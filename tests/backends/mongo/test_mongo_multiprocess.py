"""Two OS processes compete for one MongoDB group: no double lease, every event acked.

One worker uses PyMongo's ``AsyncMongoClient`` (built from the URL), the other a
host-owned Motor client; see ``tests/backends/mongo/_mongo_worker.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from rheo_flow import NewEvent, Rheo
from rheo_flow.backends import MongoBackend

WORKER = Path(__file__).with_name("_mongo_worker.py")
TOTAL = 1_000


async def _worker(*args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_two_processes_never_double_lease(mongo_url: str, tmp_path: Path) -> None:
    prefix = f"mp{uuid.uuid4().hex[:10]}_"
    backend = MongoBackend(mongo_url, collection_prefix=prefix)
    try:
        async with Rheo(backend) as r:
            await r.create_stream("jobs", partitions=4)
            for start in range(0, TOTAL, 250):
                await r.append("jobs", [NewEvent("job", {"n": i}, key=f"k{i}")
                                        for i in range(start, start + 250)])
            await r.create_group("jobs", "workers")
            high = await r.high_water("jobs")
        assert sum(high.values()) == TOTAL
        ready = tmp_path / "ready"
        ready.mkdir()
        url = mongo_url.split("?", 1)[0]
        reports = await asyncio.gather(*(
            _worker("compete", url, prefix, "jobs", "workers", f"w{i}", str(ready), "2", client)
            for i, client in enumerate(["pymongo", "motor"])
        ))

        leased = [(p, s) for rep in reports for p, s, _, _ in rep["leased"]]
        # Leases never expire, so every event is leased exactly once across both processes.
        assert len(leased) == TOTAL
        assert set(leased) == {(p, s) for p, n in high.items() for s in range(1, n + 1)}
        assert all(attempt == 1 for rep in reports for *_, attempt in rep["leased"])
        assert len({lid for rep in reports for _, _, lid, _ in rep["leased"]}) == TOTAL
        acks = [(p, s) for rep in reports for p, s, ok, repeated in rep["acked"]
                if ok and not repeated]
        assert sorted(acks) == sorted(leased)
        assert all(rep["leased"] for rep in reports), "both processes got work"
        async with Rheo(MongoBackend(mongo_url, collection_prefix=prefix)) as r:
            assert await r.frontier("jobs", "workers") == high
            assert await r.lag("jobs", "workers") == dict.fromkeys(high, 0)
            assert await r.fetch("jobs", "workers", limit=10) == []
    finally:
        await MongoBackend(mongo_url, collection_prefix=prefix).drop_all()
