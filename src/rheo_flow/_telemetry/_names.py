"""Names of spans, attributes and instruments (OpenTelemetry messaging conventions).

Standard names follow the messaging semantic conventions; rheo_flow's own
attributes live under ``rheo.``. Only low-cardinality attributes (never ids or
sequences) go on metrics.
"""

from __future__ import annotations

from typing import Final

INSTRUMENTATION_NAME: Final = "rheo_flow"
SYSTEM: Final = "rheo_flow"
"""The value of ``messaging.system`` (the backend is in ``rheo.backend``)."""

# Standard attributes ---------------------------------------------------------

MESSAGING_SYSTEM: Final = "messaging.system"
OPERATION_TYPE: Final = "messaging.operation.type"
OPERATION_NAME: Final = "messaging.operation.name"
DESTINATION: Final = "messaging.destination.name"
PARTITION: Final = "messaging.destination.partition.id"
CONSUMER_GROUP: Final = "messaging.consumer.group.name"
CLIENT_ID: Final = "messaging.client.id"
MESSAGE_ID: Final = "messaging.message.id"
BATCH_COUNT: Final = "messaging.batch.message_count"
ERROR_TYPE: Final = "error.type"
OTHER: Final = "_OTHER"
"""``error.type`` when one operation failed in several different ways."""

# rheo_flow's attributes -----------------------------------------------------

BACKEND: Final = "rheo.backend"
EVENT_SEQUENCE: Final = "rheo.event.sequence"
EVENT_TYPE: Final = "rheo.event.type"
ATTEMPT: Final = "rheo.delivery.attempt"
SETTLE_OUTCOME: Final = "rheo.settle.outcome"
SETTLE_DECISION: Final = "rheo.settle.decision"
SETTLE_FAILED: Final = "rheo.settle.failed_count"
SETTLE_REPEATED: Final = "rheo.settle.repeated_count"
SETTLE_DEAD_LETTERED: Final = "rheo.settle.dead_lettered_count"
SETTLE_REASON: Final = "rheo.settle.reason"
SETTLE_FOLLOW_UP_OF: Final = "rheo.settle.follow_up_of"
PROCESS_OUTCOME: Final = "rheo.process.outcome"
PIPELINE_STAGE: Final = "rheo.pipeline.stage"
PIPELINE_STAGE_NAME: Final = "rheo.pipeline.stage_name"
BATCH_TRIGGER: Final = "rheo.pipeline.batch_trigger"
FAILED_MESSAGES: Final = "rheo.pipeline.failed_count"
FAILURE_REASON: Final = "rheo.failure.reason"

# Span events -----------------------------------------------------------------

EVENT_SETTLE_FAILURE: Final = "rheo.settle.failure"
EVENT_DEAD_LETTER: Final = "rheo.dead_letter"
EVENT_MESSAGE_FAILED: Final = "rheo.message.failed"

# Operation types and names ---------------------------------------------------

CREATE: Final = "create"
SEND: Final = "send"
RECEIVE: Final = "receive"
PROCESS: Final = "process"
SETTLE: Final = "settle"
POLL: Final = "poll"
"""The operation name of ``Rheo.fetch`` (a pull of a batch of leases)."""

# Settle outcomes (``rheo.settle.outcome``) ----------------------------------

SETTLED: Final = "settled"
REPEATED: Final = "repeated"
DEAD_LETTERED: Final = "dead_lettered"
NOT_SETTLED: Final = "failed"

# error.type values besides the six settle kinds -----------------------------

HANDLER_ERROR: Final = "handler_error"
INVALID_OUTCOME: Final = "invalid_outcome"
INVALID_PAYLOAD: Final = "invalid_payload"
BATCH_ERROR: Final = "batch_error"
MESSAGE_FAILED: Final = "message_failed"
CANCELLED: Final = "cancelled"

PROCESS_ERROR_TYPES: Final = (HANDLER_ERROR, INVALID_OUTCOME, INVALID_PAYLOAD, BATCH_ERROR,
                              MESSAGE_FAILED, CANCELLED)

# Instruments -------------------------------------------------------------------

OPERATION_DURATION: Final = "messaging.client.operation.duration"
SENT_MESSAGES: Final = "messaging.client.sent.messages"
CONSUMED_MESSAGES: Final = "messaging.client.consumed.messages"
PROCESS_DURATION: Final = "messaging.process.duration"
SETTLE_OUTCOMES: Final = "rheo.settle.outcomes"
CONSUMER_LAG: Final = "rheo.consumer.lag"
INFLIGHT_LEASES: Final = "rheo.consumer.leases.inflight"
FETCH_SIZE: Final = "rheo.consumer.fetch.size"

FETCH_SIZE_BUCKETS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
"""The bucket boundaries of the fetch size histogram (leases per non-empty fetch)."""

DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                           7.5, 10.0)
"""The bucket boundaries the conventions advise for both duration histograms."""

# Store gauges (``/metrics`` of ``rheo-flow worker`` and ``rheo-flow metrics``) ------

STORE_LAG: Final = "rheo.store.lag"
STORE_SCHEDULED: Final = "rheo.store.scheduled"
STORE_FRONTIER: Final = "rheo.store.frontier"
STORE_HIGH_WATER: Final = "rheo.store.high_water"
STORE_OLDEST_UNSETTLED_AGE: Final = "rheo.store.oldest_unsettled.age"
STORE_DEAD_LETTERS: Final = "rheo.store.dead_letters"
STORE_PAUSED: Final = "rheo.store.paused"
STORE_UP: Final = "rheo.store.up"
STORE_READ_DURATION: Final = "rheo.store.read.duration"
STORE_READ_TIMESTAMP: Final = "rheo.store.read.timestamp"
