"""Positional builders: filling a frozen, slotted dataclass without its ``__init__``.

Backends build events, leases, append records and settle results by the thousand
from values they already trust, and a frozen dataclass's ``__init__`` pays for an
``object.__setattr__`` per field. A builder fills an assignable twin class that has
the same slots, then gives the object the real class: the two layouts are the same,
so Python allows the switch, and the result is an ordinary, immutable instance of
the dataclass, several times cheaper to make. Every fast-built value of the package
goes through :func:`positional_builder`.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

__all__ = ["positional_builder"]


def positional_builder(cls: type[Any], doc: str) -> Callable[..., Any]:
    """A function taking ``cls``'s fields positionally, in declaration order (the ones
    with a default may be left out), and returning a ``cls`` built without ``__init__``.

    ``cls`` must be a ``@dataclass(frozen=True, slots=True)`` with no ``__post_init__``
    (a builder would skip it). ``doc`` becomes the builder's docstring. Callers annotate
    the result with the exact signature.
    """
    if not dataclasses.is_dataclass(cls) or "__slots__" not in vars(cls):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which a builder would skip")
    fields = dataclasses.fields(cls)
    names = [field.name for field in fields]
    if sorted(names) != sorted(vars(cls)["__slots__"]):
        raise TypeError(f"the slots of {cls.__name__} are not its fields")
    defaults: dict[str, Any] = {}
    params = []
    for field in fields:
        if field.default is not dataclasses.MISSING:
            defaults[f"_default_{field.name}"] = field.default
            params.append(f"{field.name}=_default_{field.name}")
        elif defaults:
            raise TypeError(f"{cls.__name__}.{field.name} has no default after one that has")
        else:
            params.append(field.name)
    # Generated, as dataclasses generates __init__: a loop over the fields would cost
    # what the builder is there to save. The twin is filled in the builder's own frame
    # (no __init__ call: one Python frame per value built, not two).
    assign = "".join(f"\n    value.{name} = {name}" for name in names)
    source = (
        f"def build({', '.join(params)}):\n"
        f"    value = new(Twin){assign}\n"
        f"    value.__class__ = cls\n"
        f"    return value\n"
    )
    # The twin has the class's bases (Generic for Event), so that the layouts match.
    namespace: dict[str, Any] = {"cls": cls, "new": object.__new__, **defaults,
                                 "Twin": types.new_class(
                                     f"_{cls.__name__}Slots",
                                     vars(cls).get("__orig_bases__", ()), {},
                                     lambda ns: ns.update({"__slots__": tuple(names)}))}
    exec(compile(source, f"<builder of {cls.__name__}>", "exec"), namespace)
    build: Callable[..., Any] = namespace["build"]
    build.__name__ = build.__qualname__ = f"build_{cls.__name__}"
    build.__doc__ = doc
    return build
