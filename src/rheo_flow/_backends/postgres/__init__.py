"""The PostgreSQL backend, on asyncpg: durable, shared by any number of processes.

Consumer-group state lives in tables of one schema (layout and lock order in
:mod:`._migrations`). The hot operations are each ONE round trip: ``fetch``,
``ack`` / ``nack`` / ``reject`` / ``renew`` call server-side functions (see
:mod:`._leases`), and ``append`` is one statement that numbers the events
gaplessly under the partition row lock and sends one ``NOTIFY`` for the whole
batch (see :mod:`._streams`).

Lease deadlines and append times come from the database clock. Idle consumers
are woken by ``LISTEN`` on a dedicated connection (:mod:`._listener`); when that
connection cannot be had, ``wait_for_append`` falls back to sleeping (polling).
All SQL lives in the package's ``.sql`` files (:mod:`._sql`).
"""

from ._backend import PostgresBackend, migrate
from ._config import DEFAULT_SCHEMA

__all__ = ["DEFAULT_SCHEMA", "PostgresBackend", "migrate"]
