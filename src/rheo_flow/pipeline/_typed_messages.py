"""A pipeline's messages of fetched leases, their data validated into the models the
pipeline declares per event type (docs/typed-events.md).

A message whose data does not validate never reaches the processors: it is marked
failed with ``on_failure="reject"`` and the validation errors as its last error, so
the pipeline dead-letters it at once.
"""

from __future__ import annotations

import logging

from .._model._errors import InvalidPayload
from .._model._failure import error_text, failure_fields, truncated
from .._model._lease import Lease
from .._model._typed import Models
from ._message import Message, Settler

__all__ = ["messages_of"]

log = logging.getLogger("rheo_flow.pipeline")


def messages_of(leases: list[Lease], acknowledger: Settler, models: Models | None
                ) -> tuple[list[Message], list[Message]]:
    """The messages of ``leases`` (data validated into the models, for the types that have
    one), and the messages whose data does not validate (failed, to be rejected)."""
    if models is None:
        return [Message(lease, acknowledger) for lease in leases], []
    typed = models.models
    validated = models.validated
    good: list[Message] = []
    invalid: list[Message] = []
    for lease in leases:
        message = Message(lease, acknowledger)
        if lease.event.type in typed:
            try:
                message.data = validated(lease.event)
            except InvalidPayload as exc:
                _reject(message, exc)
                invalid.append(message)
                continue
        good.append(message)
    return good, invalid


def _reject(message: Message, exc: InvalidPayload) -> None:
    message.failed("invalid_payload")
    message.error = error_text(exc)
    message.on_failure = "reject"
    lease = message.lease
    log.error("event of %s/%s p%d s%d (attempt %d) has invalid data, rejecting it: %s",
              lease.stream, lease.group, lease.partition, lease.sequence, lease.attempt,
              truncated(str(exc), 500), extra=failure_fields(lease))
