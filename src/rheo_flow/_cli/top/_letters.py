"""The dead-letter table of ``rheo-flow top``: a row is selected only by the user.

Its cursor is hidden until a key (an arrow, Page Up/Down, Ctrl-Home/End, Enter) or
a click selects a row: the first key selects the newest dead letter, the next ones
move the selection. ``r`` redrives :attr:`LetterTable.chosen` only, never a row the
cursor rests on by default; Escape drops the selection, and so does the selected
dead letter leaving the table (redriven, by ``top`` or elsewhere).
"""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

__all__ = ["LetterTable"]


class LetterTable(DataTable[str]):
    """The dead letters, one per row keyed ``group\\0partition\\0sequence``."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("down", "cursor_down", "Select next", key_display="↓"),
        Binding("up", "cursor_up", "Select previous", key_display="↑"),
        Binding("escape", "unselect", "Unselect"),
    ]

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True, show_cursor=False)
        self.chosen: str | None = None
        """The key of the row the user selected, ``None`` before any selection."""

    def show_rows(self, rows: list[tuple[str, tuple[str, ...]]]) -> None:
        """Replace the rows by ``rows`` (key, cells); the selection stays on its key,
        or is dropped when that key is gone."""
        self.clear()
        for key, cells in rows:
            self.add_row(*cells, key=key)
        if self.chosen is not None and self.chosen in self.rows:
            self.move_cursor(row=self.get_row_index(self.chosen))
        else:
            self.action_unselect()

    def _select(self, move: str | None) -> None:
        """Reveal the cursor (on the first row) or move it, then take its row as chosen."""
        if self.row_count == 0:
            return
        if not self.show_cursor:
            self.show_cursor = True
            self.move_cursor(row=0)
        elif move is not None:
            getattr(super(), f"action_{move}")()
        self.chosen = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def action_cursor_down(self) -> None:
        """Select the next row (the first one when none is selected)."""
        self._select("cursor_down")

    def action_cursor_up(self) -> None:
        """Select the previous row (the first one when none is selected)."""
        self._select("cursor_up")

    def action_page_down(self) -> None:
        """Select a page further down."""
        self._select("page_down")

    def action_page_up(self) -> None:
        """Select a page further up."""
        self._select("page_up")

    def action_scroll_top(self) -> None:
        """Select the first row."""
        self._select("scroll_top")

    def action_scroll_bottom(self) -> None:
        """Select the last row."""
        self._select("scroll_bottom")

    def action_select_cursor(self) -> None:
        """Enter: select the row under the cursor (the first one when none is)."""
        self._select(None)
        super().action_select_cursor()

    def action_unselect(self) -> None:
        """Drop the selection and hide the cursor."""
        self.chosen = None
        self.show_cursor = False

    async def _on_click(self, event: events.Click) -> None:
        """A click on a row selects it."""
        meta = event.style.meta
        if self.row_count and meta.get("row", -1) >= 0 and not self.show_cursor:
            self.show_cursor = True
        await super()._on_click(event)
        if self.show_cursor and self.row_count:
            self.chosen = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
