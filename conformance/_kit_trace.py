"""Which conformance cases can see a mutant: from a trace of the unmutated kit.

A kit run with ``RHEO_MUT_TRACE`` (``_mutation_boot.py``) records, per case, the SQL
text the PostgreSQL and SQLite backends send and the Redis scripts they call. A
mutant changes one *unit*: a PL/pgSQL function (``postgres/functions/*.sql``,
``fn:<name>``), a section of ``postgres/statements.sql`` (``sql:<name>``) or of
SQLite's ``statements.sql`` (``sqlite:<name>``), or a Lua script (``lua:<name>``,
``redis/lua/<name>.lua``). A case that never runs that unit, directly or through a
function that calls it, runs exactly as without the mutant, so only the cases that
run it can kill it. Anything else (the migrations and schemas, ``common.lua``, a
unit no case was seen to run) gets the whole kit: the choice only ever leaves out
cases that cannot fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ROOT / "src" / "rheo_flow" / "_backends"

_SCHEMA = re.compile(r'"[A-Za-z_][A-Za-z0-9_]*"\.')
_CALL = re.compile(r"\{s\}\.(\w+)\s*\(")
_FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION \{s\}\.(\w+)\(")
_SECTION = re.compile(r"^-- name: ([a-z_]+)\n", re.MULTILINE)
_LUA_PRELUDES = {"lookup": ("settle", "renew")}
"""Lua files prepended to some scripts only (``_scripts.py``'s ``_PRELUDES``)."""


def _flat(text: str) -> str:
    """``text`` with its schema names as ``{s}`` and its whitespace collapsed."""
    return " ".join(_SCHEMA.sub("{s}.", text).split())


def _pg_functions() -> dict[str, set[str]]:
    """Each PL/pgSQL function and the functions of the schema its body calls."""
    calls: dict[str, set[str]] = {}
    for path in sorted((BACKENDS / "postgres" / "functions").glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        starts = [(m.start(), m.group(1)) for m in _FUNCTION.finditer(text)]
        for i, (start, name) in enumerate(starts):
            end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
            body = text[start:end].split("\n", 1)[-1]
            calls.setdefault(name, set()).update(_CALL.findall(body))
    return calls


def _pg_sections() -> dict[str, str]:
    text = (BACKENDS / "postgres" / "statements.sql").read_text(encoding="utf-8")
    parts = _SECTION.split(text)
    return {name: _flat("\n".join(line for line in body.splitlines()
                                  if not line.lstrip().startswith("--")))
            for name, body in zip(parts[1::2], parts[2::2], strict=True)}


_KEYED_ONLY = frozenset({"fn:fetch_scan", "fn:release_keys"})
"""Functions that run only for key-ordered groups (``fetch`` and ``settle`` call them
only then): a case that made no such group never ran them."""


_SQLITE_NAME = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)
_SLOT = re.compile(r"\{(\w+)\}")


def _sqlite_sections() -> dict[str, list[str]]:
    """Each section of SQLite's ``statements.sql`` as the fragments its executed text
    holds in order: other sections spliced in (``_sql.py``'s rule), split at the
    slots a caller fills with ``str.format``."""
    text = (BACKENDS / "sqlite" / "statements.sql").read_text(encoding="utf-8")
    parts = _SQLITE_NAME.split(text)
    raw = {name: "\n".join(line.rstrip() for line in body.splitlines()
                           if line.strip() and not line.lstrip().startswith("--"))
           for name, body in zip(parts[1::2], parts[2::2], strict=True)}

    def splice(body: str) -> str:
        return _SLOT.sub(lambda m: splice(raw[m[1]]) if m[1] in raw else m[0], body)

    return {name: [f for f in (_flat(x) for x in _SLOT.split(splice(body))[::2]) if f]
            for name, body in raw.items()}


def _holds(flat: str, fragments: list[str]) -> bool:
    at = 0
    for fragment in fragments:
        at = flat.find(fragment, at)
        if at < 0:
            return False
        at += len(fragment)
    return bool(fragments)


def units_of(text: str, functions: dict[str, set[str]], sections: dict[str, str],
             sqlite: dict[str, list[str]] | None = None) -> set[str]:
    """The units one traced call ran (``pg:<sql>``, ``sqlite:<sql>``, ``lua:<script>``
    or ``group:key``)."""
    kind, _, body = text.partition(":")
    if kind in ("lua", "group"):
        return {text}
    if kind == "sqlite":
        flat = _flat(body)
        return {f"sqlite:{name}" for name, fragments in (sqlite or {}).items()
                if _holds(flat, fragments)}
    flat = _flat(body)
    units = {f"sql:{name}" for name, section in sections.items() if section and section in flat}
    todo = [name for name in _CALL.findall(flat) if name in functions]
    while todo:
        name = todo.pop()
        if f"fn:{name}" not in units:
            units.add(f"fn:{name}")
            todo.extend(functions.get(name, ()))
    return units


def load_trace(path: Path) -> dict[str, set[str]]:
    """Case name -> the units it ran, from a trace file."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    functions, sections, sqlite = _pg_functions(), _pg_sections(), _sqlite_sections()
    per_text = [units_of(t, functions, sections, sqlite) for t in raw["texts"]]
    out: dict[str, set[str]] = {}
    for case, indexes in raw["cases"].items():
        units = set().union(*(per_text[i] for i in indexes))
        out[case] = units if "group:key" in units else units - _KEYED_ONLY
    return out


def unit_of(file: str, function: str) -> set[str] | None:
    """The units a mutant of ``function`` in ``file`` changes; ``None``: any case may see it."""
    known = re.fullmatch(r"\w+", function) is not None
    if "/postgres/functions/" in file:
        return {f"fn:{function}"} if known else None
    if file.endswith("postgres/statements.sql"):
        return {f"sql:{function}"} if known else None
    if file.endswith("sqlite/statements.sql"):
        return {f"sqlite:{function}"} if known else None
    if "/redis/lua/" in file:
        stem = Path(file).name.removesuffix(".lua")
        if stem == "common":
            return None
        return {f"lua:{s}" for s in _LUA_PRELUDES.get(stem, (stem,))}
    return None


def cases_for(file: str, function: str, trace: dict[str, set[str]] | None) -> list[str] | None:
    """The cases that run the mutated unit; ``None`` means the whole kit."""
    units = unit_of(file, function)
    if units is None or not trace:
        return None
    chosen = sorted(case for case, ran in trace.items() if ran & units)
    return chosen or None
