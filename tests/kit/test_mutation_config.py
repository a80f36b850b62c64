"""Mutation testing (conformance/mutation.py) and pyproject's mutmut section agree."""

from __future__ import annotations

import importlib
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mutation() -> object:
    path = str(ROOT / "conformance")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module("mutation")


def test_mutation_testing_targets_the_same_files_everywhere() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    targets = _mutation().TARGETS  # type: ignore[attr-defined]
    assert config["only_mutate"] == targets["memory-sqlite"][1]
    assert targets["memory-sqlite"][0] == "memory,sqlite"
    for backends, patterns in targets.values():
        assert set(backends.split(",")) <= {"memory", "sqlite", "mongo"}
        for pattern in patterns:
            assert list(ROOT.glob(pattern)), f"{pattern} matches no file"
