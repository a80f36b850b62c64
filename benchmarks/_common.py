"""What every benchmark suite returns, and small helpers shared by suites."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Result"]


@dataclass(frozen=True, slots=True)
class Result:
    """One measured number, optionally compared with a baseline measured in the same run.

    ``ratio`` is ``value / baseline`` (``None`` without a baseline).
    """

    name: str
    backend: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    note: str = ""

    @classmethod
    def compared(cls, name: str, backend: str, value: float, unit: str, baseline: float,
                 note: str = "") -> Result:
        """A result with its ratio to ``baseline``."""
        return cls(name, backend, value, unit, baseline,
                   value / baseline if baseline else None, note)

    def as_json(self) -> dict[str, Any]:
        """The JSON object printed by ``--json``."""
        data = asdict(self)
        if not data["note"]:
            del data["note"]
        return data
