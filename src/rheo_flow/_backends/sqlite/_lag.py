"""The SQLite backend's lag report (rule ``lag.report``): one statement on the
backend's thread, whatever the number of streams (statements.sql, ``lag_report``)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from itertools import groupby

from ..._model._lag import GroupLag, LagReport, PartitionLag
from ..._model._stream import paused_state
from . import _sql as sql

__all__ = ["lag_report"]


def lag_report(conn: sqlite3.Connection, streams: Sequence[str] | None, now: int) -> LagReport:
    """Every group of ``streams`` (``None``: every stream) at the time ``now``."""
    names = None if streams is None else json.dumps(list(streams))
    rows = conn.execute(sql.LAG_REPORT, (now, names)).fetchall()
    groups = []
    for (stream, group), found in groupby(rows, key=lambda r: (r[0], r[1])):
        parts = list(found)
        letters, until = parts[0][7], parts[0][8]
        groups.append(GroupLag(stream, group,
                               tuple(PartitionLag(*r[2:7]) for r in parts),
                               letters, *paused_state(until, now)))
    return LagReport(now, tuple(groups))
