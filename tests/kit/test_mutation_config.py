"""Mutation testing (conformance/mutation.py) and pyproject's mutmut section agree."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mutation_testing_targets_the_same_files_everywhere() -> None:
    root = ROOT
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    text = (root / "conformance" / "mutation.py").read_text()
    listed = text.split("MUTATED = [", 1)[1].split("]", 1)[0]
    assert config["only_mutate"] == [line.strip().strip(",").strip('"')
                                     for line in listed.strip().splitlines()]
    for pattern in config["only_mutate"]:
        assert list(root.glob(pattern)), f"{pattern} matches no file"
