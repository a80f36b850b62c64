"""The last error a failed delivery keeps: a bounded, secret-free ``"Type: message"``.

Runtimes record it with every nack or reject of a failure (handler exceptions,
invalid outcomes, :class:`~rheo_flow.Retry` outcomes); backends keep it on the
delivery so that a dead letter says why its last attempt failed, even when its
reason is ``"max_attempts"`` (docs/concepts.md, "Dead letters").
"""

from __future__ import annotations

import re

from ._lease import Lease
from ._validation import MAX_ERROR

__all__ = ["bounded", "describe", "error_text", "failure_fields", "scrub", "truncated"]

# ``scheme://user:password@`` in URLs, and ``password=...`` style options.
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@")
_SECRET_OPTION = re.compile(
    r"(?i)\b((?:[a-z_]*_)?(?:password|passwd|pwd|passphrase|secret|token|api_?key|credentials?)"
    r"\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s&;,]+)"
)
_MASK = "***"


def scrub(text: str) -> str:
    """``text`` with URL passwords and ``password=...``-style values replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: f"{m[1]}{_MASK}@", text)
    return _SECRET_OPTION.sub(lambda m: f"{m[1]}{_MASK}", text)


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc`` (just ``"Type"`` when the message is empty), as is."""
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def truncated(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``...`` when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_text(exc: BaseException, limit: int = MAX_ERROR) -> str:
    """``"Type: message"`` of ``exc``: secrets masked, NUL removed, at most ``limit`` characters."""
    return bounded(describe(exc), limit)


def bounded(text: str, limit: int = MAX_ERROR) -> str:
    """Any failure text made storable: secrets masked, NUL and lone surrogates removed,
    at most ``limit`` characters."""
    text = scrub(text.replace("\x00", ""))
    text = text.encode("utf-8", "replace").decode("utf-8") if not text.isascii() else text
    return truncated(text, limit)


def failure_fields(lease: Lease, consumer_id: str | None = None) -> dict[str, object]:
    """The structured ``logging`` fields (``extra=``) of a handler failure on ``lease``."""
    fields: dict[str, object] = {
        "stream": lease.stream, "group": lease.group, "partition": lease.partition,
        "sequence": lease.sequence, "attempt": lease.attempt, "event_id": lease.event.id,
    }
    if consumer_id is not None:
        fields["consumer_id"] = consumer_id
    return fields
