"""The Lua conventions of the Redis backend (docs/architecture.md, "SQL and Lua
conventions"), checked on every script so that they keep holding: a header naming
KEYS, ARGV and the reply; keys and locals named for what they hold, not letters;
delivery states, settle marks and the PARKED score named once in ``common.lua``;
and the script texts the backend runs are the files with those preludes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rheo_flow._backends.redis._scripts import SCRIPTS

LUA = Path(__file__).resolve().parents[3] / "src" / "rheo_flow" / "_backends" / "redis" / "lua"


def _code(text: str) -> str:
    """The text without its comments (no string of the scripts holds ``--``)."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_has_a_header_naming_keys_argv_and_reply(name: str) -> None:
    lines = (LUA / f"{name}.lua").read_text(encoding="utf-8").splitlines()
    header = []
    for line in lines:
        if not line.startswith("--"):
            break
        header.append(line)
    assert header, name
    assert header[0].startswith(f"-- {name}: "), name
    for part in ("-- KEYS: ", "-- ARGV: ", "-- Reply: "):
        assert any(line.startswith(part) for line in header), (name, part)


@pytest.mark.parametrize("path", sorted(LUA.glob("*.lua")), ids=lambda p: p.stem)
def test_no_key_or_local_is_a_bare_letter(path: Path) -> None:
    code = _code(path.read_text(encoding="utf-8"))
    assert "unpack(KEYS" not in code
    for names in re.findall(r"\blocal\s+(?!function)([\w\s,]+?)\s*=", code):
        for local in (n.strip() for n in names.split(",")):
            assert len(local) > 1 or local in "ijk_", (path.name, local)


@pytest.mark.parametrize("path", sorted(LUA.glob("*.lua")), ids=lambda p: p.stem)
def test_states_marks_and_scores_are_named_in_common_only(path: Path) -> None:
    code = _code(path.read_text(encoding="utf-8"))
    if path.stem == "common":
        code = code.split("local function", 1)[1]
    assert not re.search(r"'[LAKR]\|", code), path.name
    assert not re.search(r"string\.byte\([^)]*\)\s*[~=]=\s*\d", code), path.name
    assert "4000000000000000" not in code, path.name
    assert not re.search(r"[~=]=\s*'[LAKR]'", code), path.name


def test_the_scripts_are_their_files_after_the_preludes() -> None:
    """What the headers point at (group_keys, the named states, the reply codes) is in
    the text each script runs: common.lua first, lookup.lua for settle and renew,
    fetch_partition.lua for fetch and fetch_many."""
    def read(part: str) -> str:
        return (LUA / f"{part}.lua").read_text(encoding="utf-8")

    second = {"settle": "lookup", "renew": "lookup", "fetch": "fetch_partition",
              "fetch_many": "fetch_partition"}
    for name, text in SCRIPTS.items():
        preludes = ("common", second[name]) if name in second else ("common",)
        assert text == "".join(map(read, (*preludes, name))), name
