"""The Lua scripts of the Redis backend, and running them in one round trip.

Each script is a file of ``lua/``, loaded once: its text is the shared helpers
(``common.lua``, and ``lookup.lua`` for settle and renew) followed by its own.
Every script touches the keys of ONE partition (one hash tag) or one
stream-level key, so a Redis Cluster can place partitions on different
shards. Requests and replies are compact strings (JSON or code letters): one
bulk string per reply is decoded by one ``orjson.loads`` on the client.

Delivery records (field = sequence in the ``:d`` hash of a group partition)
are ``state|attempt|lease_id|settled_by|rejected_at_ms|reason``, then NUL and
the last error when one was recorded (a nack's or reject's; NUL never occurs in
a reason or error), with state
``L`` (leased), ``A`` (available), ``K`` (acked) or ``R`` (rejected) and
settled_by ``a`` / ``n`` / ``r`` (ack, nack, reject), ``-`` (dead-lettered on
expiry) or empty (``common.lua`` names them: ``LEASED``, ``BY_ACK``, ...). The
scripts name the keys of a group partition as ``group_keys`` does (``keys.records``
for ``:d``, ``keys.due`` for ``:z``, ...; :class:`~._keys.GroupKeys` alike). The
``:z`` sorted set holds the available and leased deliveries scored by when they
become eligible (available-at or deadline), so a fetch finds due work in O(log n)
whatever the lease time of each one.
New deliveries start in a block (``:b`` record ``first|last|deadline`` under a
token, ``:y`` the unexpired blocks by deadline). A delivery without a record of
its own that a block covers has lease id ``<token>:<seq>`` and attempt 1: it is
leased when past the group's frontier ``f``, acked by that lease when at or
behind it. So an ack that moves the frontier over its deliveries writes no
record for them; one that does not (out of order) writes ``K`` records, as
does anything that moves the frontier back (redrive). A block's deliveries get
records of their own when settled otherwise, renewed or expired.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias

from ..._model._errors import BackendError, OutcomeUnknown
from .._guard import masked_cause
from ._driver import Client, RedisCluster, rex
from ._errors import DRIVER_ERRORS, is_no_script

__all__ = ["LOST", "SCRIPTS", "Read", "ScriptCall", "ScriptRunner", "is_reply"]

LOST: Final = "LOST"
"""The reply of append and fetch when the partition's presence marker ``mk`` (written
when its stream was created) is gone: the server lost its data."""

_PRELUDES: Final[dict[str, tuple[str, ...]]] = {
    "settle": ("common", "lookup"),
    "renew": ("common", "lookup"),
    "fetch": ("common", "fetch_partition"),
    "fetch_many": ("common", "fetch_partition"),
}
"""The shared files a script starts with, when not just ``common``."""
_NAMES: Final = (
    "create_stream", "group_record", "init_group", "claim_ids", "append", "append_many", "fetch",
    "fetch_many",
    "settle",
    "renew", "replay", "reset", "trim", "dead_letters", "redrive", "forget_consumers",
    "describe", "work", "pause", "set_retention", "lag",
)
_ON_NODE: Final = frozenset({"work"})
"""The scripts a cluster may send straight to a node (:meth:`ScriptRunner._run_on_node`):
those that may run twice (``work.lua``: a plan, a note, a summary write)."""


def _source(name: str) -> str:
    from importlib.resources import files

    lua = files(__name__.rpartition(".")[0]).joinpath("lua")
    parts = (*_PRELUDES.get(name, ("common",)), name)
    return "".join(lua.joinpath(f"{part}.lua").read_text(encoding="utf-8") for part in parts)


class _Sources(Mapping[str, str]):
    """Script name -> Lua source, each read from ``lua/`` when first asked for: a process
    that runs a few scripts (``rheo-flow streams`` runs one) reads only those."""

    __slots__ = ("_read",)

    def __init__(self) -> None:
        self._read: dict[str, str] = {}

    def __getitem__(self, name: str) -> str:
        text = self._read.get(name)
        if text is None:
            if name not in _NAMES:
                raise KeyError(name)
            text = self._read[name] = _source(name)
        return text

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)


class _Digests(dict[str, str]):
    """Script name -> SHA-1 of its source (what ``EVALSHA`` names), computed when first
    asked for; a plain dict lookup after that."""

    def __missing__(self, name: str) -> str:
        sha = self[name] = hashlib.sha1(SCRIPTS[name].encode()).hexdigest()
        return sha


SCRIPTS: Final[Mapping[str, str]] = _Sources()
"""Script name -> Lua source (each with the shared helpers prepended)."""
_SHAS: Final = _Digests()

ScriptCall: TypeAlias = tuple[str, Sequence[str], Sequence[Any]]
"""One script call: the script's name, its keys and its arguments."""
Read: TypeAlias = tuple[Any, ...]
"""One read-only command (``XRANGE``): its name and arguments. Its reply comes back as the
server sent it (see :meth:`ScriptRunner.run_and_read`)."""


def is_reply(reply: Any, word: str) -> bool:
    """Whether a script replied with the status ``word`` (in either response mode)."""
    return reply == word or (type(reply) is bytes and reply == word.encode())


class ScriptRunner:
    """Runs script calls on a client, in one round trip per batch.

    Scripts run by ``EVALSHA``. One the server does not know (first use,
    restart, ``SCRIPT FLUSH`` at any moment, even between two calls of one
    pipeline) did not run: those calls run again by ``EVAL``, which carries
    the script's source (so no flush can race the retry) and caches it for
    the next ``EVALSHA``.

    On a Redis Cluster (``cluster``) a batch is one cluster pipeline, which redis-py
    sends as one round trip per primary (each call goes to the primary of its keys'
    slot; each ``EVALSHA`` is atomic on its slot, the batch as a whole is not), so a
    batch over 256 partitions takes three connections, not 256. A batch meant to be
    atomic (an append to several partitions) is one concurrent ``EVALSHA`` per call
    instead, each answered or failed on its own (see :meth:`_gather`).
    """

    __slots__ = ("_client", "_cluster", "_scrub", "_translate")

    def __init__(
        self, client: Client, translate: Callable[[BaseException], BackendError],
        scrub: Callable[[str], str], *, cluster: bool = False,
    ) -> None:
        self._client = client
        self._cluster = cluster
        self._translate = translate
        self._scrub = scrub
        """The backend's masking of its secrets: a translated error's cause is a copy
        of redis-py's exception masked with it (its message may quote the URL)."""

    async def run(self, calls: Sequence[ScriptCall], *, transaction: bool = False) -> list[Any]:
        """Run the calls (in one ``MULTI``/``EXEC`` with ``transaction``); their replies
        in order. An error reply raises its translation."""
        if not calls:
            return []
        if len(calls) == 1 and (not transaction or self._cluster):
            if self._cluster and calls[0][0] in _ON_NODE:
                return [await self._run_on_node(*calls[0])]
            return [await self._run_one(*calls[0])]
        if self._cluster:
            if transaction:
                return await self._run_concurrently(calls, atomic=True)
            return (await self._cluster_batch(calls, ()))[0]
        results = await self._pipeline(calls, transaction, by_source=False)
        await self._retry_missing(calls, results, transaction)
        for result in results:
            if isinstance(result, BaseException):
                raise self._translate(result)
        return results

    async def run_after(self, commands: Sequence[Read], calls: Sequence[ScriptCall]
                        ) -> list[Any]:
        """Run plain commands (``SET``), then the calls, in one ``MULTI``/``EXEC``
        (standalone Redis); the replies of the calls. When the server lacked a script,
        the whole transaction runs again by source (the commands must be idempotent)."""
        if not commands:
            return await self.run(calls, transaction=len(calls) > 1)
        results = await self._pipeline(calls, True, by_source=False, before=commands)
        if any(is_no_script(r) for r in results):
            results = await self._pipeline(calls, True, by_source=True, before=commands)
        for result in results:
            if isinstance(result, BaseException):
                raise self._translate(result)
        return results

    async def run_and_read(self, calls: Sequence[ScriptCall], reads: Sequence[Read]
                           ) -> tuple[list[Any], list[Any]]:
        """Run the calls and the reads in one round trip (a cluster: all at once); the
        replies of each, in order. An error reply raises its translation.

        A read's reply is the server's as parsed (``XRANGE``: a list of ``[id,
        [field, value, ...]]``), not turned into redis-py's tuples and dicts: the
        command is queued under its name as bytes, which no response callback is
        registered for (a connection that falls back from RESP3 may still apply one,
        so a reader accepts both forms). On a cluster it is queued under its name as
        text (redis-py's cluster pipeline routes by it), parsed."""
        if not reads:
            return await self.run(calls), []
        if self._cluster:
            return await self._cluster_batch(calls, reads)
        results = await self._pipeline(calls, False, by_source=False, reads=reads)
        read_replies = results[len(calls):]
        del results[len(calls):]
        await self._retry_missing(calls, results, False)
        for result in (*results, *read_replies):
            if isinstance(result, BaseException):
                raise self._translate(result)
        return results, read_replies

    async def read(self, reads: Sequence[Read]) -> list[Any]:
        """Only reads, in one round trip (see :meth:`run_and_read`)."""
        return (await self.run_and_read((), reads))[1] if reads else []

    async def _cluster_batch(self, calls: Sequence[ScriptCall], reads: Sequence[Read]
                             ) -> tuple[list[Any], list[Any]]:
        """A cluster's batch (see the class docstring): the replies of the calls and of
        the reads. Calls whose script a node lacked run again by source; an error reply
        raises its translation once every reply is in (an ambiguous one first)."""
        results = await self._cluster_pipeline(calls, reads, by_source=False)
        missing = [i for i, r in enumerate(results[:len(calls)]) if is_no_script(r)]
        if missing:
            again = await self._cluster_pipeline([calls[i] for i in missing], (),
                                                  by_source=True)
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        failed = [(self._translate(r), r) for r in results if isinstance(r, BaseException)]
        if failed:
            error, cause = next((pair for pair in failed if isinstance(pair[0], OutcomeUnknown)),
                                failed[0])
            raise error from masked_cause(cause, self._scrub)
        return results[:len(calls)], results[len(calls):]

    async def _cluster_pipeline(self, calls: Sequence[ScriptCall], reads: Sequence[Read],
                                *, by_source: bool) -> list[Any]:
        """One cluster pipeline of the calls, then the reads; error replies in place."""
        pipe = self._client.pipeline(transaction=False)
        for name, keys, args in calls:
            if by_source:
                pipe.eval(SCRIPTS[name], len(keys), *keys, *args)
            else:
                pipe.evalsha(_SHAS[name], len(keys), *keys, *args)
        for name, *args in reads:
            pipe.execute_command(name, *args)
        try:
            return list(await pipe.execute(raise_on_error=False))
        except DRIVER_ERRORS as exc:
            raise self._translate(exc) from masked_cause(exc, self._scrub)

    async def _run_concurrently(self, calls: Sequence[ScriptCall], *, atomic: bool
                                ) -> list[Any]:
        """Every call at once (a cluster); see :meth:`_gather`."""
        return await self._gather([self._run_one(*call) for call in calls], atomic=atomic)

    async def _gather(self, coros: Sequence[Any], *, atomic: bool = False) -> list[Any]:
        """Every coroutine at once; the first error raises once all ended.

        A batch meant to be ``atomic`` (an append to several partitions) that failed
        only in part raises :class:`~rheo_flow.OutcomeUnknown`: some of it is stored,
        and running it again (same event ids) completes it.
        """
        results = await asyncio.gather(*coros, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if not errors:
            return results
        for error in errors:
            if not isinstance(error, Exception):
                raise error
        if atomic and len(errors) < len(results):
            raise OutcomeUnknown(
                f"{errors[0]} (the other partitions of the batch were written: append "
                "it again, with the same event ids, to complete it)")
        ambiguous = [e for e in errors if isinstance(e, OutcomeUnknown)]
        raise (ambiguous or errors)[0]

    async def _retry_missing(self, calls: Sequence[ScriptCall], results: list[Any],
                             transaction: bool) -> None:
        """Run again by source the calls whose script the server did not have."""
        missing = [i for i, r in enumerate(results) if is_no_script(r)]
        if missing:
            again = await self._pipeline([calls[i] for i in missing], transaction,
                                         by_source=True)
            for i, result in zip(missing, again, strict=True):
                results[i] = result

    async def _run_on_node(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """A cluster's call sent straight to the primary its slot map names, without the
        cluster client's routing (about half the cost of a call). Anything but a reply
        (a redirection after a failover or a resharding, a lost connection, an unknown
        script) sends it again through the client (:meth:`_run_one`), which refreshes
        the slot map and retries: only for scripts that may run twice (``_ON_NODE``)."""
        client = self._client
        try:
            node = client.get_node_from_key(keys[0]) if isinstance(client, RedisCluster) else None
            if node is not None:
                return await node.execute_command("EVALSHA", _SHAS[name], len(keys), *keys,
                                                  *args)
        except DRIVER_ERRORS:
            pass
        return await self._run_one(name, keys, args)

    async def _run_one(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self._client.evalsha(_SHAS[name], len(keys), *keys, *args)
        except rex.NoScriptError:
            pass
        except DRIVER_ERRORS as exc:
            raise self._translate(exc) from masked_cause(exc, self._scrub)
        try:
            return await self._client.eval(SCRIPTS[name], len(keys), *keys, *args)
        except DRIVER_ERRORS as exc:
            raise self._translate(exc) from masked_cause(exc, self._scrub)

    async def _pipeline(
        self, calls: Sequence[ScriptCall], transaction: bool, *, by_source: bool,
        reads: Sequence[Read] = (), before: Sequence[Read] = (),
    ) -> list[Any]:
        """One round trip (the commands ``before``, the calls, then the reads); an error
        reply stays in its place in the list (the replies of ``before`` are left out)."""
        pipe = self._client.pipeline(transaction=transaction)
        for command, *command_args in before:
            pipe.execute_command(command, *command_args)
        if by_source:
            for name, keys, args in calls:
                pipe.eval(SCRIPTS[name], len(keys), *keys, *args)
        else:
            shas = _SHAS
            for name, keys, args in calls:
                pipe.evalsha(shas[name], len(keys), *keys, *args)
        for name, *args in reads:
            pipe.execute_command(name.encode(), *args)
        try:
            return list(await pipe.execute(raise_on_error=False))[len(before):]
        except rex.NoScriptError as exc:
            # A transaction the server refused as a whole: nothing in it ran.
            return [exc] * len(calls)
        except rex.ExecAbortError as exc:
            if "NOSCRIPT" in str(exc) or "No matching script" in str(exc):
                return [rex.NoScriptError(str(exc))] * len(calls)
            raise self._translate(exc) from masked_cause(exc, self._scrub)
        except DRIVER_ERRORS as exc:
            raise self._translate(exc) from masked_cause(exc, self._scrub)
