"""The options of the runtimes, declared once.

Every option of :class:`~rheo_flow.Group` (and the :class:`~rheo_flow.Consumer`
or ``@consumer`` it runs), :class:`~rheo_flow.Producer`,
:class:`~rheo_flow.pipeline.Pipeline` and the pipeline's
:class:`~rheo_flow.pipeline.Processors` and :class:`~rheo_flow.pipeline.Batcher`
settings is an :class:`Option` of :data:`OPTIONS`: its name, type, bounds,
default and a one-line doc. Each runtime is a :class:`Runtime` listing the
options it takes (with its own default where it differs) and the cross-option
:class:`Rule` s it applies, so that an option has the same bounds wherever it is
accepted and is refused with the same message. The docs' option tables are
checked against this schema (``tests/docs/test_docs_runtimes.py``).

Options given as keyword dicts (``Consumer(**options)``, ``@consumer(...)``,
``start(rheo, **options)``, ``Group(rheo, consumer, **options)``) go through
:meth:`Runtime.check_keys`: a key that is not an option but looks like one
(``concurency``) is refused with the closest option as a suggestion. Other keys
stay application keys (they reach ``Consumer.setup``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from .._model._errors import InvalidArgument
from .._model._validation import MAX_DELAY_MS, MAX_LEASE_MS, check_name
from ._backoff import Backoff
from ._retry_policy import RetryPolicy

__all__ = [
    "BATCHER",
    "CONSUMER",
    "GROUP",
    "MAX_CONCURRENCY",
    "MAX_DEMAND",
    "OPTIONS",
    "PIPELINE",
    "PROCESSORS",
    "PRODUCER",
    "REQUIRED",
    "RUNTIMES",
    "Option",
    "Rule",
    "Runtime",
    "check_partitions",
    "validate",
]

MAX_DEMAND: Final = 1_000_000
"""The most leases (or messages) a runtime holds or asks for at once."""
MAX_CONCURRENCY: Final = 10_000
"""The most tasks one stage runs at once."""
MAX_POLL_MS: Final = 3_600_000
MAX_ATTEMPTS: Final = 1_000_000
MAX_BATCH_SIZE: Final = 100_000
MAX_BATCH_TIMEOUT_S: Final = 86_400
MIN_LEASE_MS: Final = 10

SUGGESTION_CUTOFF: Final = 0.85
"""How close (``difflib`` ratio) an unknown key must be to an option to be taken for a
misspelling of it. At 0.85 ``concurency``, ``maxdemand``, ``partition`` and ``groups``
are misspellings; ``lease``, ``poll``, ``counter`` or ``partition_key`` are not."""

Kind = Literal["int", "seconds", "name", "text", "partitions", "choice", "instance", "callable",
               "object"]


class _Required:
    """The default of an option that must be given."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()
"""The default of an option without one: it must be given."""


@dataclass(frozen=True, slots=True)
class Option:
    """One option: its name, type, bounds, default and a one-line doc.

    ``kind`` is the type: ``int`` (an ``int``, not a ``bool``), ``seconds`` (an
    ``int`` or ``float``, not NaN), ``name`` (a stream, group or consumer name),
    ``text`` (a non-empty string), ``partitions`` (``"all"`` or partition ids),
    ``choice`` (one of ``choices``), ``instance`` (an ``instance_of``), ``callable``
    or ``object`` (checked by the runtime itself: a handler, a stage's settings).
    Numbers are bounded by ``minimum`` (exclusive with ``exclusive_minimum``) and
    ``maximum`` (inclusive); ``nullable`` options also take ``None``.
    """

    name: str
    kind: Kind
    doc: str
    default: Any = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    exclusive_minimum: bool = False
    nullable: bool = False
    unit: str = ""
    """``ms`` or ``s``: what the number counts (named in error messages)."""
    choices: tuple[str, ...] = ()
    instance_of: type | None = None
    name_kind: str = ""
    """For ``name`` options: what :func:`check_name` calls the name."""
    alternative: str = ""
    """Something else the runtime accepts and checks itself (e.g. ``a BatchSize``)."""
    accepts: str = ""
    """For ``object`` options: what the docs' range column says."""
    counterpart: str = ""
    """The option other runtimes call this one (``max_inflight``: ``max_demand``)."""

    def bounds(self) -> str:
        """The bounds of a number in words (``1 to 1,000,000``), ``""`` for other kinds."""
        low, high = self.minimum, self.maximum
        if low is None:
            return "" if high is None else f"at most {_number(high)}"
        if self.exclusive_minimum:
            return f"above {_number(low)}" + ("" if high is None else f", at most {_number(high)}")
        if high is None:
            return f"at least {_number(low)}"
        return f"{_number(low)} to {_number(high)}"

    def _instance_type(self) -> type:
        """The class an ``instance`` option takes."""
        if self.instance_of is None:
            raise TypeError(f"option {self.name!r} is of kind 'instance' without instance_of")
        return self.instance_of

    def accepted(self) -> str:
        """What the option takes, in the words of the docs' range column."""
        if self.kind in ("int", "seconds"):
            text = self.bounds()
        elif self.kind == "name":
            text = "a name"
        elif self.kind == "text":
            text = "a non-empty string"
        elif self.kind == "partitions":
            text = '`"all"` or a non-empty list of partition ids'
        elif self.kind == "choice":
            text = " or ".join(f'`"{choice}"`' for choice in self.choices)
        elif self.kind == "instance":
            text = f"a `{self._instance_type().__name__}`"
        elif self.kind == "callable":
            text = "a function"
        else:
            text = self.accepts
        if self.alternative:
            text += f", or {self.alternative}"
        if self.nullable:
            text += ", or `None`"
        return text

    def validate(self, value: Any, label: str | None = None) -> Any:
        """``value`` if the option takes it (partitions normalised to a sorted list);
        :class:`InvalidArgument` naming the option, its bounds and ``value`` if not."""
        label = label or self.name
        if value is None and self.nullable:
            return None
        kind = self.kind
        if kind in ("int", "seconds"):
            if not self._in_bounds(value):
                noun = ("an integer" if kind == "int" else "a number") + {
                    "ms": " number of milliseconds", "s": " of seconds"}.get(self.unit, "")
                extra = (f" or {self.alternative.replace('`', '')}" if self.alternative
                         else "") + (" or None" if self.nullable else "")
                raise InvalidArgument(
                    f"{label} must be {noun} ({self.bounds()}){extra}, got {value!r}")
            return value
        if kind == "name":
            if not self.name_kind:
                return check_name(self.name, value)
            try:
                return check_name(self.name_kind, value)
            except InvalidArgument as exc:
                raise InvalidArgument(f"{label}: {exc}") from None
        if kind == "text":
            if not isinstance(value, str) or not value:
                raise InvalidArgument(f"{label} must be a non-empty string, got {value!r}")
            return value
        if kind == "partitions":
            return check_partitions(value, label)
        if kind == "choice":
            if value not in self.choices:
                options = " or ".join(f'"{choice}"' for choice in self.choices)
                raise InvalidArgument(f"{label} must be {options}, got {value!r}")
            return value
        if kind == "instance":
            cls = self._instance_type()
            if not isinstance(value, cls):
                raise InvalidArgument(f"{label} must be a {cls.__name__}"
                                      + (" or None" if self.nullable else "")
                                      + f", got {type(value).__name__}")
            return value
        if kind == "callable" and not callable(value):
            raise InvalidArgument(f"{label} must be callable"
                                  + (" or None" if self.nullable else "") + f", got {value!r}")
        return value

    def _in_bounds(self, value: object) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind == "int":
            if not isinstance(value, int):
                return False
        elif not isinstance(value, int | float) or math.isnan(value):
            return False
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.exclusive_minimum else value < low):
            return False
        return high is None or value <= high


def _number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}"


def check_partitions(value: object, label: str = "partitions") -> Literal["all"] | list[int]:
    """``"all"``, or a non-empty iterable of partition ids (ints >= 0) as a sorted list
    without repeats. (Whether the stream has them is checked on start.)"""
    if value == "all":
        return "all"
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidArgument(f'{label} must be "all" or a list of ids, got {value!r}')
    ids = list(value)
    if not ids:
        raise InvalidArgument(f'{label} must not be empty (use "all" for every partition)')
    for p in ids:
        if isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise InvalidArgument(f"{label} must list partition ids, integers >= 0: got {p!r}")
    return sorted(set(ids))


_CATALOGUE: tuple[Option, ...] = (
    Option("stream", "name", "the stream to consume", default=REQUIRED),
    Option("group", "name", "the consumer group", default=REQUIRED),
    Option("handler", "object", "the pipeline's callbacks", default=REQUIRED,
           accepts="a handler object"),
    Option("max_demand", "int", "bound on leases (or messages) held at once", default=100,
           minimum=1, maximum=MAX_DEMAND),
    Option("max_inflight", "int", "bound on leases fetched and not yet settled",
           minimum=1, maximum=MAX_DEMAND, nullable=True, counterpart="max_demand"),
    Option("concurrency", "int", "how many tasks run at once", default=1,
           minimum=1, maximum=MAX_CONCURRENCY),
    Option("fetch_size", "int", "most leases one fetch asks for", minimum=1,
           maximum=MAX_DEMAND, nullable=True),
    Option("lease_ms", "int", "lease duration, renewed about every lease_ms / 2",
           default=30_000, minimum=MIN_LEASE_MS, maximum=MAX_LEASE_MS, unit="ms"),
    Option("poll_ms", "int", "idle wait before fetching again without push wake-ups",
           default=200, minimum=1, maximum=MAX_POLL_MS, unit="ms"),
    Option("consumer_id", "name", "this worker's identity (None: generated)",
           nullable=True, name_kind="consumer"),
    Option("partitions", "partitions", "the partitions consumed", default="all"),
    Option("max_attempts", "int", "the group's max_attempts, set on start (None: kept)",
           minimum=1, maximum=MAX_ATTEMPTS, nullable=True),
    Option("ordering", "choice", "the group's ordering, set at creation (None: kept)",
           choices=("none", "key"), nullable=True),
    Option("retry_policy", "instance", "the backoff of failed deliveries (None: RetryPolicy())",
           instance_of=RetryPolicy, nullable=True),
    Option("retry_delay_ms", "int", "fixed delay before a retried message comes back",
           minimum=0, maximum=MAX_DELAY_MS, nullable=True, unit="ms"),
    Option("on_failure", "choice", "what a failed message does", default="retry",
           choices=("retry", "reject")),
    Option("shutdown_timeout", "seconds", "seconds a drain waits by default", default=30.0,
           minimum=0, unit="s"),
    Option("backoff", "instance", "the fetch-failure schedule (None: Backoff())",
           instance_of=Backoff, nullable=True),
    Option("observer", "callable", "called with every SettleOutcome", nullable=True),
    Option("processors", "object", "the processor stage (None: Processors())",
           accepts="a `Processors`", nullable=True),
    Option("batchers", "object", "batcher name to Batcher", accepts="a mapping of names "
           "to `Batcher`", nullable=True),
    Option("context", "object", "passed to every callback", accepts="anything"),
    Option("models", "object", "the model each event type's data is validated into",
           accepts="a mapping of event types to model classes", nullable=True),
    Option("upcasters", "object", "what turns old versions' data into the model's shape",
           accepts="a mapping of (event type, version) to functions", nullable=True),
    Option("rate_limit", "object", "messages let into the processors per window",
           accepts="a `RateLimit` (or a `RateLimiter`)", nullable=True),
    Option("partition_by", "object", "what orders messages: equal values in sequence",
           accepts='`"key"`, `"partition"` or a function of the message', nullable=True),
    Option("name", "text", "the processor name handlers receive", default="default"),
    Option("batch_size", "int", "messages per batch (or a BatchSize)", default=100,
           minimum=1, maximum=MAX_BATCH_SIZE, alternative="a `BatchSize`"),
    Option("batch_timeout", "seconds", "seconds a batch waits for more after its first",
           default=1.0, minimum=0, exclusive_minimum=True, maximum=MAX_BATCH_TIMEOUT_S,
           unit="s"),
)

OPTIONS: Final[Mapping[str, Option]] = MappingProxyType({o.name: o for o in _CATALOGUE})
"""Every option of every runtime, by name."""


def validate(name: str, value: Any, label: str | None = None) -> Any:
    """``value`` checked against the option ``name`` (see :meth:`Option.validate`)."""
    return OPTIONS[name].validate(value, label)


@dataclass(frozen=True, slots=True)
class Rule:
    """A cross-option rule: ``option`` may not exceed ``at_most`` (when both are set)."""

    option: str
    at_most: str
    why: str

    def check(self, values: Mapping[str, Any]) -> None:
        """Raise :class:`InvalidArgument` when ``values`` break the rule."""
        value, bound = values.get(self.option), values.get(self.at_most)
        if value is not None and bound is not None and value > bound:
            raise InvalidArgument(f"{self.option} ({value}) cannot exceed {self.at_most} "
                                  f"({bound}): {self.why}")


CONCURRENCY_WITHIN_DEMAND: Final = Rule("concurrency", "max_demand",
                                        "a handler needs a lease to work on")
FETCH_WITHIN_DEMAND: Final = Rule("fetch_size", "max_demand",
                                  "never more than max_demand leases are held")
FETCH_WITHIN_INFLIGHT: Final = Rule("fetch_size", "max_inflight",
                                    "never more than max_inflight leases are held")


@dataclass(frozen=True, slots=True)
class Runtime:
    """What one runtime accepts: its options with their defaults here, and its rules."""

    name: str
    defaults: Mapping[str, Any]
    """Every option it accepts (in order), with its default in this runtime."""
    rules: tuple[Rule, ...] = ()
    prefix: str = ""
    """Put before an option's name in error messages (``processors concurrency``)."""
    elsewhere: Mapping[str, str] = field(default_factory=dict)
    """Keys that belong to another part of the API, with where to pass them instead."""

    @property
    def names(self) -> tuple[str, ...]:
        """The options it accepts."""
        return tuple(self.defaults)

    def option(self, name: str) -> Option:
        """One of its options."""
        if name not in self.defaults:
            raise KeyError(f"{name!r} is not an option of {self.name}")
        return OPTIONS[name]

    def validate(self, name: str, value: Any) -> Any:
        """``value`` checked against its option ``name``."""
        return self.option(name).validate(value, f"{self.prefix}{name}")

    def resolve(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every value of ``values`` validated (in order), then the rules applied;
        the values as validated (partitions as a sorted list)."""
        checked = {name: self.validate(name, value) for name, value in values.items()}
        for rule in self.rules:
            rule.check(checked)
        return checked

    def range_of(self, name: str) -> str:
        """What ``name`` takes here, in the words of the docs' range column."""
        text = self.option(name).accepted()
        for rule in self.rules:
            if rule.option == name:
                head, sep, tail = text.partition(", or ")
                text = f"{head}, at most `{rule.at_most}`{sep}{tail}"
        return text

    def unknown(self, key: str, where: str = "") -> str | None:
        """Why ``key`` is refused as an option key here, or ``None`` when it is an option
        or an application key (no option is close to it). ``where`` says where the key
        was found (``class attribute of Billing``)."""
        if key in self.defaults:
            return None
        runtime = f"{self.name} ({where})" if where else self.name
        if key in self.elsewhere:
            return f"{key!r} is not an option of {runtime}: {self.elsewhere[key]}"
        counterpart = OPTIONS[key].counterpart if key in OPTIONS else ""
        matches = ([counterpart] if counterpart in self.defaults
                   else difflib.get_close_matches(key, self.names, n=1,
                                                  cutoff=SUGGESTION_CUTOFF))
        if not matches:
            return None
        return f"unknown option {key!r} for {runtime}; did you mean {matches[0]!r}?"

    def check_keys(self, keys: Iterable[object], where: str = "") -> None:
        """Refuse the keys that look like misspelt options (see :meth:`unknown`)."""
        for key in keys:
            problem = self.unknown(key, where) if isinstance(key, str) else None
            if problem is not None:
                raise InvalidArgument(problem)


def _defaults(*names: str, **overrides: Any) -> dict[str, Any]:
    out = {name: OPTIONS[name].default for name in names}
    for name, value in overrides.items():
        if name not in out:
            raise ValueError(f"a default for {name!r}, which is not among {names}")
        out[name] = value
    return out


_GROUP_OPTIONS = ("stream", "group", "max_demand", "concurrency", "fetch_size", "lease_ms",
                  "poll_ms", "consumer_id", "partitions", "max_attempts", "ordering",
                  "retry_policy", "shutdown_timeout", "models", "upcasters")

CONSUMER: Final = Runtime(
    "Consumer",
    _defaults(*_GROUP_OPTIONS, stream=None, group=None),
    rules=(CONCURRENCY_WITHIN_DEMAND, FETCH_WITHIN_DEMAND),
    elsewhere={
        "observer": "pass it to start() or Group(), which take it besides the options",
        "backoff": "pass it to start() or Group(), which take it besides the options",
    },
)
"""A :class:`~rheo_flow.Consumer`'s options (class attributes, constructor and
``@consumer`` keywords); ``stream`` and ``group`` are required when it starts."""

GROUP: Final = Runtime("Group", CONSUMER.defaults, CONSUMER.rules)
"""The options of ``start(rheo, **options)`` and ``Group(rheo, consumer, **options)``."""

PRODUCER: Final = Runtime(
    "Producer",
    _defaults("stream", "group", "max_demand", "fetch_size", "lease_ms", "poll_ms",
              "consumer_id", "partitions", "max_attempts", "ordering", "backoff", "observer",
              "shutdown_timeout"),
    rules=(FETCH_WITHIN_DEMAND,),
)

PIPELINE: Final = Runtime(
    "Pipeline",
    _defaults("stream", "group", "handler", "processors", "batchers", "context", "rate_limit",
              "max_inflight", "fetch_size", "lease_ms", "poll_ms", "consumer_id", "partitions",
              "max_attempts", "ordering", "on_failure", "retry_delay_ms", "retry_policy",
              "shutdown_timeout", "models", "upcasters"),
    rules=(FETCH_WITHIN_INFLIGHT,),
)

PROCESSORS: Final = Runtime(
    "Processors",
    _defaults("concurrency", "max_demand", "partition_by", "name", concurrency=4,
              max_demand=10),
    prefix="processors ",
)
"""``max_demand`` here is the messages one processor task takes at a time."""

BATCHER: Final = Runtime(
    "Batcher",
    _defaults("batch_size", "batch_timeout", "concurrency", "partition_by"),
    prefix="batcher ",
)

RUNTIMES: Final[Mapping[str, Runtime]] = MappingProxyType(
    {r.name: r for r in (CONSUMER, GROUP, PRODUCER, PIPELINE, PROCESSORS, BATCHER)})
"""Every runtime by name."""
