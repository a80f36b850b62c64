"""Typed event data: pydantic v2 models, msgspec Structs and dataclasses (docs/typed-events.md).

At append, :func:`encode_model` turns a model instance straight into the JSON text
the append stores, with the model library's own encoder (``model_dump_json``,
``msgspec.json.encode``, orjson for dataclasses): no round trip through dicts.

At consumption, :class:`Models` maps event types to model classes: its
:meth:`~Models.typed` returns the event with ``data`` validated into the model,
decoded from the stored JSON text (``Model.model_validate_json``, a
``msgspec.json.Decoder``), and raises :class:`~rheo_flow.InvalidPayload` with the
field errors when it does not validate. Events of a type without a model pass
through unchanged (their ``data`` stays JSON).

Neither pydantic nor msgspec is imported here: a model's library is already
loaded when a model exists, and is found by the class's MRO (its ``__module__``
and name), so the core stays free of them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import orjson

from ._errors import InvalidArgument, InvalidPayload
from ._event import JSON, Event, decode_json, make_event, pending_json

__all__ = [
    "SCHEMA_VERSION_HEADER",
    "ModelKind",
    "Models",
    "Upcaster",
    "check_models",
    "encode_model",
    "model_kind",
    "schema_version",
]

SCHEMA_VERSION_HEADER: Final = "schema-version"
"""The header that carries the schema version of an event's data (missing: version 1).
An append of a model whose class sets ``__schema_version__`` stamps it."""

ModelKind = Literal["pydantic", "msgspec", "dataclass"]

Upcaster = Callable[[Any], Any]
"""Turns the data (JSON: a dict) of an old version into the current model's shape."""

_Encoder = Callable[[Any], str]
_ENCODERS: dict[type, tuple[_Encoder, str | None] | None] = {}
"""By class: the encoder of its instances and the version header to stamp, or None
for a class that is not a model (its instances go to the JSON encoder)."""


def model_kind(cls: object) -> ModelKind | None:
    """Which model library ``cls`` belongs to, or None when it is not a model class."""
    if not isinstance(cls, type):
        return None
    for base in cls.__mro__:
        module = base.__module__
        if base.__name__ == "BaseModel" and module.startswith("pydantic"):
            return "pydantic"
        if base.__name__ == "Struct" and module.startswith("msgspec"):
            return "msgspec"
    return "dataclass" if dataclasses.is_dataclass(cls) else None


def schema_version(cls: type) -> int | None:
    """The ``__schema_version__`` a model class declares (an int >= 1), or None."""
    version = getattr(cls, "__schema_version__", None)
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidArgument(f"{cls.__name__}.__schema_version__ must be an integer >= 1, "
                              f"got {version!r}")
    return version


def encode_model(data: object, headers: Mapping[str, str]
                 ) -> tuple[str, Mapping[str, str]] | None:
    """The compact JSON text of a model instance and its headers (with the version header
    when its class declares a version), or None when ``data`` is not a model."""
    cls = data.__class__
    try:
        known = _ENCODERS[cls]
    except KeyError:
        known = _ENCODERS[cls] = _encoder_of(cls)
    if known is None:
        return None
    encode, version = known
    if version is not None and SCHEMA_VERSION_HEADER not in headers:
        headers = {**headers, SCHEMA_VERSION_HEADER: version}
    return encode(data), headers


def _encoder_of(cls: type) -> tuple[_Encoder, str | None] | None:
    kind = model_kind(cls)
    if kind is None:
        return None
    version = schema_version(cls)
    text = None if version is None else str(version)
    if kind == "pydantic":
        return _pydantic_encode, text
    if kind == "msgspec":
        return _msgspec_encoder(), text
    return _dataclass_encode, text


def _pydantic_encode(model: Any) -> str:
    try:
        text: str = model.model_dump_json()
    except Exception as exc:  # pydantic_core.PydanticSerializationError
        raise _not_json(model, exc) from None
    return text


def _msgspec_encoder() -> _Encoder:
    msgspec = sys.modules["msgspec"]
    encode = msgspec.json.Encoder().encode

    def encode_struct(struct: Any) -> str:
        try:
            return encode(struct).decode()  # type: ignore[no-any-return]
        except (TypeError, msgspec.EncodeError) as exc:
            raise _not_json(struct, exc) from None

    return encode_struct


def _dataclass_encode(instance: Any) -> str:
    try:
        return orjson.dumps(instance).decode()
    except TypeError as exc:
        raise _not_json(instance, exc) from None


def _not_json(data: object, exc: Exception) -> InvalidArgument:
    """What an encoder's failure on a model instance is reported as."""
    return InvalidArgument(f"event data ({type(data).__name__}) is not "
                           f"JSON-serialisable: {exc}")


# Consumption -------------------------------------------------------------------------


class _Decoder:
    """Validates one event type's data into its model (from the JSON text when the event
    still holds it, else from the decoded data)."""

    __slots__ = ("errors", "from_data", "from_text", "message", "model")

    def __init__(self, model: type) -> None:
        self.model = model
        kind = model_kind(model)
        if kind == "msgspec" or (kind == "dataclass" and _loaded_or_importable("msgspec")):
            msgspec = sys.modules["msgspec"]
            self.from_text: Callable[[str | bytes], Any] = msgspec.json.Decoder(model).decode
            self.from_data: Callable[[JSON], Any] = lambda data: msgspec.convert(data, model)
            self.errors: tuple[type[Exception], ...] = (msgspec.ValidationError,
                                                        msgspec.DecodeError)
            self.message: Callable[[Exception], str] = str
        elif kind == "pydantic" or (kind == "dataclass" and _loaded_or_importable("pydantic")):
            pydantic = sys.modules["pydantic"]
            target: Any = model if kind == "pydantic" else pydantic.TypeAdapter(model)
            self.from_text = (target.model_validate_json if kind == "pydantic"
                              else target.validate_json)
            self.from_data = (target.model_validate if kind == "pydantic"
                              else target.validate_python)
            self.errors = (pydantic.ValidationError,)
            self.message = _pydantic_errors
        else:
            self.from_text = lambda text: _construct(model, decode_json(text))
            self.from_data = lambda data: _construct(model, data)
            self.errors = (TypeError,)
            self.message = str


def _loaded_or_importable(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _construct(model: type, data: JSON) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"expected an object, got {type(data).__name__}")
    return model(**data)


def _pydantic_errors(exc: Exception) -> str:
    """``field.path: message`` per error (without the input values, which may be secret)."""
    errors = exc.errors(include_url=False, include_input=False)  # type: ignore[attr-defined]
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '$'}: {e['msg']}" for e in errors)


class Models:
    """The model of each event type a consumer declares, and the upcasters of old versions.

    ``models`` maps an event type to a pydantic v2 model, msgspec Struct or dataclass
    class; ``upcasters`` maps ``(type, version)`` to a function turning that version's
    data (JSON) into the current model's shape, applied before validation to events
    whose ``schema-version`` header (missing: 1) is that version.
    """

    __slots__ = ("_current", "_decoders", "_upcasters", "models", "upcasters")

    def __init__(self, models: Mapping[str, type],
                 upcasters: Mapping[tuple[str, int], Upcaster] | None = None) -> None:
        self.models: Mapping[str, type] = dict(models)
        """The model class of each event type."""
        self.upcasters: Mapping[tuple[str, int], Upcaster] = dict(upcasters or {})
        """The upcaster of each (event type, old version)."""
        self._decoders = {event_type: _Decoder(model) for event_type, model in models.items()}
        self._current = {event_type: str(schema_version(model) or 1)
                         for event_type, model in models.items()}
        self._upcasters = {event_type for event_type, _ in self.upcasters}

    def typed(self, event: Event) -> Event:
        """``event`` with its data validated into its type's model (``event`` itself for a
        type without a model); :class:`~rheo_flow.InvalidPayload` when it does not
        validate (or an upcaster fails)."""
        decoder = self._decoders.get(event.type)
        if decoder is None:
            return event
        return make_event(event.stream, event.partition, event.sequence, event.id, event.type,
                          self._validate(event, decoder), event.key, event.headers,
                          event.appended_at_ms)

    def validated(self, event: Event) -> Any:
        """The data of ``event`` validated into its type's model (its JSON data for a type
        without a model); :class:`~rheo_flow.InvalidPayload` when it does not validate."""
        decoder = self._decoders.get(event.type)
        return event.data if decoder is None else self._validate(event, decoder)

    def _validate(self, event: Event, decoder: _Decoder) -> Any:
        try:
            if event.type in self._upcasters:
                return self._upcast(event, decoder)
            pending = pending_json(event)
            if pending is None:
                return decoder.from_data(event.data)
            return decoder.from_text(pending.text)
        except decoder.errors as exc:
            raise InvalidPayload(event.type, decoder.model, decoder.message(exc)) from None

    def _upcast(self, event: Event, decoder: _Decoder) -> Any:
        version = event.headers.get(SCHEMA_VERSION_HEADER, "1")
        upcaster = (None if version == self._current[event.type]
                    else self.upcasters.get((event.type, _int(version))))
        if upcaster is None:
            return decoder.from_data(event.data)
        try:
            data = upcaster(event.data)
        except Exception as exc:
            raise InvalidPayload(
                event.type, decoder.model,
                f"upcaster of version {version} failed: {type(exc).__name__}: {exc}") from None
        return decoder.from_data(data)


def _int(text: str) -> int:
    return int(text) if text.isdigit() else -1


def check_models(models: object, upcasters: object = None, label: str = "models"
                 ) -> Models | None:
    """``models`` and ``upcasters`` (an option's values) as :class:`Models`, None when no
    model is declared; :class:`~rheo_flow.InvalidArgument` naming what is wrong."""
    if models is None or (isinstance(models, Mapping) and not models):
        if upcasters:
            raise InvalidArgument("upcasters need models: declare the model of each type")
        return None
    if isinstance(models, Models):
        return models
    if not isinstance(models, Mapping):
        raise InvalidArgument(f"{label} must map event types to model classes, "
                              f"got {type(models).__name__}")
    for event_type, model in models.items():
        if not isinstance(event_type, str) or not event_type:
            raise InvalidArgument(f"{label} keys must be event types (strings), "
                                  f"got {event_type!r}")
        if model_kind(model) is None:
            raise InvalidArgument(
                f"{label}[{event_type!r}] must be a pydantic model, msgspec Struct or "
                f"dataclass class, got {model!r}")
    found = _check_upcasters(upcasters, models)
    return Models(models, found)


def _check_upcasters(upcasters: object, models: Mapping[str, Any]
                     ) -> dict[tuple[str, int], Upcaster]:
    if upcasters is None:
        return {}
    if not isinstance(upcasters, Mapping):
        raise InvalidArgument("upcasters must map (event type, version) to functions, "
                              f"got {type(upcasters).__name__}")
    for key, fn in upcasters.items():
        if (not isinstance(key, tuple) or len(key) != 2 or key[0] not in models
                or isinstance(key[1], bool) or not isinstance(key[1], int) or key[1] < 1):
            raise InvalidArgument(
                f"upcasters keys must be (event type, version >= 1) of a type in models, "
                f"got {key!r}")
        if not callable(fn):
            raise InvalidArgument(f"upcasters[{key!r}] must be callable, got {fn!r}")
    return dict(upcasters)
