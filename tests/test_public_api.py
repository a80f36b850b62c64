"""The public surface: small, documented, sorted, and free of private names."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest

import rheo_flow
import rheo_flow.backends
import rheo_flow.pipeline
import rheo_flow.sync
import rheo_flow.testing.faults

CHECKED = [rheo_flow, rheo_flow.backends, rheo_flow.sync, rheo_flow.testing.faults]
"""Modules whose exports are checked for order and docstrings, methods included."""


def _public_modules() -> list[str]:
    names = ["rheo_flow"]
    for info in pkgutil.walk_packages(rheo_flow.__path__, "rheo_flow."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def _isort_key(name: str) -> tuple[int, list[int | str]]:
    # ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest, naturally.
    category = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return category, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _own_doc(obj: object) -> str | None:
    if inspect.isclass(obj):
        return obj.__dict__.get("__doc__")
    return inspect.getdoc(obj)


@pytest.mark.parametrize("module", CHECKED, ids=lambda m: m.__name__)
def test_all_is_sorted_unique_and_public(module: ModuleType) -> None:
    names = list(module.__all__)
    assert len(names) == len(set(names)), "duplicates in __all__"
    assert names == sorted(names, key=_isort_key)
    private = [n for n in names if n.startswith("_") and not (n.startswith("__")
                                                             and n.endswith("__"))]
    assert private == []


@pytest.mark.parametrize("module", CHECKED, ids=lambda m: m.__name__)
def test_every_exported_name_exists_and_is_documented(module: ModuleType) -> None:
    undocumented = []
    for name in module.__all__:
        obj = getattr(module, name)  # raises when a name does not exist
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj):
            doc = _own_doc(obj)
            if not doc or not doc.strip():
                undocumented.append(name)
    assert undocumented == []


def test_public_methods_of_exported_classes_are_documented() -> None:
    missing = []
    for module in CHECKED:
        for name in module.__all__:
            cls = getattr(module, name)
            if not inspect.isclass(cls) or issubclass(cls, BaseException):
                continue
            for attr, value in vars(cls).items():
                if attr.startswith("_"):
                    continue
                func = value.fget if isinstance(value, property) else value
                if isinstance(func, classmethod | staticmethod):
                    func = func.__func__
                if not inspect.isfunction(func) or (func.__doc__ or "").strip():
                    continue
                # An override documented on a base class is documented.
                if not any((getattr(base, attr).__doc__ or "").strip()
                           for base in cls.__mro__[1:] if hasattr(base, attr)):
                    missing.append(f"{name}.{attr}")
    assert missing == []


@pytest.mark.parametrize("name", _public_modules())
def test_every_public_module_declares_all(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    assert isinstance(getattr(module, "__all__", None), list | tuple), f"{name} has no __all__"
    for exported in module.__all__:
        assert hasattr(module, exported), f"{name}.__all__ names missing {exported!r}"


def test_version_matches_the_distribution() -> None:
    from importlib.metadata import version

    assert rheo_flow.__version__ == version("rheo-flow")


def test_core_types_are_reexported_not_private() -> None:
    assert rheo_flow.Rheo.__module__ == "rheo_flow._rheo"
    assert rheo_flow.Backend is rheo_flow.backends.Backend
    assert "MemoryBackend" in rheo_flow.backends.__all__


def test_backend_errors_carry_their_settle_kind() -> None:
    errors = {
        rheo_flow.BackendUnavailable: "backend_unavailable",
        rheo_flow.OutcomeUnknown: "ambiguous",
        rheo_flow.StoreLost: "failed",
    }
    for error, kind in errors.items():
        assert issubclass(error, rheo_flow.BackendError)
        assert error.__name__ in rheo_flow.__all__
        assert error("message").kind == kind
        assert rheo_flow.SettleKind(kind)


@pytest.mark.parametrize("cls", [rheo_flow.Group, rheo_flow.pipeline.Pipeline],
                         ids=lambda c: c.__name__)
def test_runtimes_run_until_empty_and_drain_with_hand_back(cls: type) -> None:
    """What ``rheo-flow worker`` relies on is public API of both runtimes."""
    run = inspect.signature(cls.run_until_empty)
    assert list(run.parameters) == ["self", "timeout"]
    assert "backlog" in (cls.run_until_empty.__doc__ or "")
    drain = inspect.signature(cls.drain).parameters["hand_back"]
    assert drain.kind is inspect.Parameter.KEYWORD_ONLY
    assert drain.default is False
    assert "hand_back=True" in (cls.drain.__doc__ or "")
    assert "hand_back" in (rheo_flow.Producer.hand_back_inflight.__doc__ or "")
