"""The console of output meant for a pipe or a file: plain, and as wide as its content.

Off a terminal rich would lay everything out at 80 columns (or ``$COLUMNS``):
tables squeezed until every header is one letter and an ellipsis, cells wrapped
over several lines. Given a huge width instead, a table is drawn at its natural
width but a panel stretches to fill all of it. :class:`PlainConsole` prints each
renderable at the width of its content, never less than its longest word (no
header is cut) and at most ``$COLUMNS`` when that is set and leaves room for it.
Text lines are never wrapped (``soft_wrap``): a log line stays one line.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group

if TYPE_CHECKING:  # loaded when a renderable is printed, not when a command starts
    from rich.measure import Measurement

__all__ = ["UNLIMITED", "PlainConsole"]

UNLIMITED = 100_000
"""The width of a line no renderable reaches: nothing is wrapped or cut at it."""


class PlainConsole(Console):
    """A console for a pipe or a file: renderables at their content's width (see the module)."""

    def __init__(self) -> None:
        super().__init__(highlight=False, soft_wrap=True, width=UNLIMITED)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """Print as :meth:`rich.console.Console.print` does, a renderable (not a
        string) at the width :meth:`fitted` gives it unless ``width`` is passed, and each
        part of a :class:`rich.console.Group` on its own."""
        if len(objects) == 1 and isinstance(objects[0], Group):
            # Each part at its own width: a panel atop a wide table stays narrow.
            for part in objects[0].renderables:
                self.print(part, **kwargs)
            return
        renderables = [o for o in objects if not isinstance(o, str)]
        if kwargs.get("width") is None and renderables and len(renderables) == len(objects):
            kwargs["width"] = self.fitted(renderables)
            # Wrapped at words within that width (soft wrap would cut a panel's lines).
            kwargs.setdefault("soft_wrap", False)
        super().print(*objects, **kwargs)

    def fitted(self, renderables: list[Any]) -> int:
        """The width ``renderables`` take: their widest content, capped at
        ``$COLUMNS`` when set but never below the longest word any of them holds,
        nor a table below its natural width."""
        from rich.measure import Measurement

        measures = [Measurement.get(self, self.options, r) for r in renderables]
        natural = max(m.maximum for m in measures)
        # Rich squeezes a table below its natural width by cutting cells (``events…``)
        # rather than wrapping them at words: a table keeps its natural width.
        least = max(self._least(r, m) for r, m in zip(renderables, measures, strict=True))
        columns = _columns()
        width = natural if columns is None else max(min(natural, columns), least)
        return max(1, min(width, UNLIMITED))

    def _least(self, renderable: Any, measure: Measurement) -> int:
        """The narrowest ``renderable`` may be drawn without cutting a word."""
        from rich.measure import Measurement
        from rich.panel import Panel
        from rich.table import Table

        if isinstance(renderable, Table):
            return measure.maximum
        if isinstance(renderable, Panel):
            # A panel measures as wide as its content unwrapped: its content may wrap.
            inner = Measurement.get(self, self.options, renderable.renderable)
            return self._least(renderable.renderable, inner) + measure.maximum - inner.maximum
        return measure.minimum


def _columns() -> int | None:
    """``$COLUMNS`` as a positive number of columns, or ``None`` (unset, or not a number)."""
    value = os.environ.get("COLUMNS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None
