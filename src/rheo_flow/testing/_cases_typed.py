"""Cases about typed event data: a model appended as an event's data comes back, through
a consumer declaring it, as an equal instance of the same model."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

from .._model._event import NewEvent
from .._model._typed import Models
from ._case import CaseEnv, case, check_equal


@dataclasses.dataclass
class _PlacedData:
    order_id: int
    total: float
    tags: list[str]
    note: str | None = None


def _models() -> dict[str, type]:
    """A model of each library installed (the dataclass always)."""
    found: dict[str, type] = {"dataclass": _PlacedData}
    if importlib.util.find_spec("msgspec") is not None:
        import msgspec

        found["msgspec"] = msgspec.defstruct(
            "PlacedStruct", [("order_id", int), ("total", float), ("tags", list[str]),
                             ("note", str | None, None)])
    if importlib.util.find_spec("pydantic") is not None:
        import pydantic

        found["pydantic"] = pydantic.create_model(
            "PlacedModel", order_id=(int, ...), total=(float, ...), tags=(list[str], ...),
            note=(str | None, None))
    return found


def _instance(model: type, n: int) -> Any:
    return model(order_id=n, total=n + 0.5, tags=["a", str(n)],
                 note=None if n % 2 else f"note {n}")


@case(rules=["typed.round_trip"])
async def case_a_model_round_trips(env: CaseEnv) -> None:
    """Models appended as data (a dataclass, and a msgspec Struct and a pydantic model
    when installed) are stored as their JSON and validate back into equal instances."""
    stream = await env.stream(partitions=2)
    models = _models()
    sent = {kind: [_instance(model, n) for n in range(3)] for kind, model in models.items()}
    await env.rheo.append(stream, [NewEvent(f"placed.{kind}", data, key=str(n))
                                   for kind, items in sent.items()
                                   for n, data in enumerate(items)])
    typed = Models({f"placed.{kind}": model for kind, model in models.items()})
    leases = await env.drain(stream, "g")
    received: dict[str, list[Any]] = {kind: [] for kind in models}
    for lease in leases:
        event = typed.typed(lease.event)
        received[event.type.removeprefix("placed.")].append(event.data)
        check_equal(type(event.data), models[event.type.removeprefix("placed.")],
                    f"the class of {event.type}'s data")
    for kind, items in sent.items():
        check_equal(sorted(received[kind], key=lambda m: m.order_id), items,
                    f"the {kind} instances consumed")
        check_equal(_lease_data(leases, f"placed.{kind}")[0],
                    {"order_id": 0, "total": 0.5, "tags": ["a", "0"], "note": "note 0"},
                    f"the stored JSON of the first {kind} event")
    await env.ack_ok(leases)


def _lease_data(leases: list[Any], event_type: str) -> list[Any]:
    """The JSON data of the leased events of ``event_type``, by order id."""
    return sorted((lease.event.data for lease in leases if lease.event.type == event_type),
                  key=lambda data: data["order_id"])
