"""The text mutator of conformance/mutation_server.py, on small SQL and Lua snippets."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _conformance_module(name: str) -> ModuleType:
    path = str(ROOT / "conformance")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


mutator = _conformance_module("_server_mutator")

PLPGSQL = """\
-- settle: a comment with state = 1 AND x < 2 that is never mutated
CREATE OR REPLACE FUNCTION {s}.settle(p_op smallint, p_lo bigint)
RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $fn$
BEGIN
    UPDATE {s}.deliveries d SET state = 2, attempt = d.attempt + 1, reason = 'a < b'
    WHERE d.group_id = p_lo AND d.state = 1 AND d.seq BETWEEN p_lo AND p_lo + 10;
    IF NOT FOUND THEN
        PERFORM {s}.advance(LEAST(p_lo, 3));
    END IF;
    SELECT d.seq FROM {s}.deliveries d WHERE d.seq >= p_lo ORDER BY d.seq LIMIT 1;
END
$fn$;
"""

LUA = """\
-- common: x == 1 and not y (a comment)
local function bump(D, f)
  local r = redis.call('HGET', D, 'a == b')
  if r == 'L' and not f then
    redis.call('HSET', D, 'f', f + 1)
  end
  local out = {}
  out[#out + 1] = math.min(f, 3)
  return r
end
"""


def _by_op(mutants: list, op: str) -> list[tuple[str, str]]:
    return [(m.original.strip(), m.mutated.strip()) for m in mutants if m.op == op]


def test_sql_operators_are_found() -> None:
    ms = mutator.mutants_of("src/rheo_flow/_backends/postgres/functions/settle.sql", PLPGSQL)
    ops = {m.op for m in ms}
    assert ops >= {"cmp", "arith", "logic", "drop-cond", "not", "least-greatest", "state",
                   "stmt", "order"}
    mutated = {m.mutated.strip() for m in ms}
    assert "WHERE d.group_id <> p_lo AND d.state = 1 AND d.seq BETWEEN p_lo AND p_lo + 10;" \
        in mutated
    assert "WHERE d.group_id = p_lo OR d.state = 1 AND d.seq BETWEEN p_lo AND p_lo + 10;" \
        in mutated
    assert "WHERE TRUE AND d.state = 1 AND d.seq BETWEEN p_lo AND p_lo + 10;" in mutated
    assert "IF FOUND THEN" in mutated
    assert "PERFORM {s}.advance(GREATEST(p_lo, 3));" in mutated
    assert "SELECT d.seq FROM {s}.deliveries d WHERE d.seq > p_lo ORDER BY d.seq LIMIT 1;" \
        in mutated
    assert "SELECT d.seq FROM {s}.deliveries d WHERE d.seq >= p_lo ORDER BY d.seq DESC LIMIT 1;" \
        in mutated
    # state constants: compared with a state column, or assigned to one
    assert ("WHERE d.group_id = p_lo AND d.state = 0 AND d.seq BETWEEN p_lo AND p_lo + 10;"
            in mutated)
    assert any("SET state = 3," in m for m in mutated)
    # arithmetic boundaries
    assert any("attempt = d.attempt + 0," in m for m in mutated)
    assert any("attempt = d.attempt - 1," in m for m in mutated)
    # removed statements: the UPDATE (two lines) and the PERFORM, by NULL;
    stmts = [m for m in ms if m.op == "stmt"]
    assert {m.line for m in stmts} == {7, 10, 12}
    update = next(m for m in stmts if m.line == 7)
    assert update.span == 2
    assert update.mutated == "    NULL;"


def test_sql_skips_comments_literals_assignments_and_between() -> None:
    ms = mutator.mutants_of("src/rheo_flow/_backends/postgres/functions/settle.sql", PLPGSQL)
    assert all(m.line != 1 for m in ms)  # the comment line
    for m in ms:
        # the string literal 'a < b' is never changed
        if "'a < b'" in m.original:
            assert "'a < b'" in m.mutated or m.op == "stmt"
    # "=" of a SET list and of a function option is an assignment, not a comparison
    assert not any("state <> 2" in m.mutated or "plan_cache_mode <>" in m.mutated for m in ms)
    # BETWEEN's AND is not a logical AND
    assert not any("BETWEEN p_lo OR" in m.mutated for m in ms)
    # CREATE OR REPLACE is not a condition
    assert not any("CREATE AND REPLACE" in m.mutated for m in ms)


def test_lua_operators_are_found_and_literals_skipped() -> None:
    ms = mutator.mutants_of("src/rheo_flow/_backends/redis/lua/common.lua", LUA)
    assert all(m.line != 1 for m in ms)  # the comment line
    assert ("if r == 'L' and not f then", "if r ~= 'L' and not f then") in _by_op(ms, "cmp")
    assert ("if r == 'L' and not f then", "if r == 'L' or not f then") in _by_op(ms, "logic")
    assert ("if r == 'L' and not f then", "if r == 'L' and f then") in _by_op(ms, "not")
    assert ("if r == 'L' and not f then", "if true and not f then") in _by_op(ms, "drop-cond")
    assert ("if r == 'L' and not f then", "if r == 'A' and not f then") in _by_op(ms, "state")
    assert ("out[#out + 1] = math.min(f, 3)", "out[#out + 1] = math.max(f, 3)") \
        in _by_op(ms, "min-max")
    assert ("redis.call('HSET', D, 'f', f + 1)", "redis.call('HSET', D, 'f', f + 0)") \
        in _by_op(ms, "arith")
    # the string 'a == b' is left alone; a table append index is not a boundary
    assert not any("'a ~= b'" in m.mutated for m in ms)
    assert not any("#out + 0" in m.mutated or "#out - 1" in m.mutated for m in ms)
    # a statement that is a redis.call is removed; an assignment from one is not
    assert [m.line for m in ms if m.op == "stmt"] == [5]


def test_identities_are_stable_and_mutants_apply() -> None:
    path = "src/rheo_flow/_backends/postgres/functions/settle.sql"
    first = mutator.mutants_of(path, PLPGSQL)
    again = mutator.mutants_of(path, PLPGSQL)
    assert [m.key for m in first] == [m.key for m in again]
    assert len({m.key for m in first}) == len(first)
    for m in first:
        text = mutator.apply(PLPGSQL, m)
        lines = text.split("\n")
        assert lines[m.line - 1] == m.mutated
        assert len(lines) == len(PLPGSQL.split("\n"))  # removed statements leave blanks
    # a change elsewhere in the file keeps the identity of a mutant on an unchanged line
    edited = PLPGSQL.replace("LIMIT 1;", "LIMIT 2;")
    keys = {m.key for m in mutator.mutants_of(path, edited)}
    assert next(m for m in first if m.op == "not").key in keys
    with pytest.raises(ValueError, match="is not"):
        mutator.apply(edited.replace("IF NOT FOUND", "IF NOT  FOUND"),
                      next(m for m in first if m.op == "not"))


def test_languages_and_the_mutated_files() -> None:
    assert mutator.language_of("src/rheo_flow/_backends/redis/lua/fetch.lua") == "lua"
    assert mutator.language_of("src/rheo_flow/_backends/sqlite/statements.sql") == "sqlite"
    assert mutator.language_of("src/rheo_flow/_backends/postgres/statements.sql") == "pgsql"
    server = _conformance_module("mutation_server")
    files = server.target_files(None)
    backends = {server.backend_of(f) for f in files}
    assert backends == {"postgres", "redis", "sqlite"}
    assert server.target_files(["postgres/functions/*"]) == [
        f for f in files if "/postgres/functions/" in f]
    for f in files:  # every shipped file scans without error
        mutator.mutants_of(f, (ROOT / f).read_text(encoding="utf-8"))
    # the triage file parses, and each entry has a reason
    assert all(e.reason for e in server.base.load_entries(server.EQUIVALENTS))


def test_statement_sections_end_at_their_name_line() -> None:
    text = ("-- name: first\nSELECT name FROM {s}.streams ORDER BY name\n\n"
            "-- name: second\nSELECT part, seq FROM {s}.events WHERE stream_id = $1\n")
    ms = mutator.mutants_of("src/rheo_flow/_backends/postgres/statements.sql", text)
    order = [m.mutated for m in ms if m.op == "order"]
    assert order == ["SELECT name FROM {s}.streams ORDER BY name DESC"]
    assert {m.function for m in ms} == {"first", "second"}
    assert "SELECT part, seq FROM {s}.events WHERE TRUE" in {m.mutated for m in ms}


def test_on_conflict_is_not_a_join_condition() -> None:
    text = "-- name: insert\nINSERT INTO t (a) VALUES ($1)\nON CONFLICT (a) DO NOTHING\n"
    ms = mutator.mutants_of("src/rheo_flow/_backends/postgres/statements.sql", text)
    assert not any("ON TRUE" in m.mutated for m in ms)


trace = _conformance_module("_kit_trace")


def test_a_traced_call_runs_its_function_and_the_functions_it_calls(tmp_path: Path) -> None:
    functions = {"fetch": {"fetch_scan", "release_keys"}, "fetch_scan": set(),
                 "release_keys": set(), "settle": {"release_keys"}}
    sections = {"append": "INSERT INTO {s}.events (seq) VALUES ($1)"}
    call = 'pg:SELECT * FROM "rheo_conformance_1".fetch($1, $2)'
    assert trace.units_of(call, functions, sections) == {
        "fn:fetch", "fn:fetch_scan", "fn:release_keys"}
    insert = 'pg:INSERT INTO "s_apart".events (seq)\n   VALUES ($1) RETURNING seq'
    assert trace.units_of(insert, functions, sections) == {"sql:append"}
    assert trace.units_of("lua:fetch", functions, sections) == {"lua:fetch"}


def test_cases_for_a_mutant_are_those_that_ran_its_unit(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(
        '{"texts": ["pg:SELECT * FROM \\"x\\".fetch($1)", "group:key", "lua:redrive",'
        ' "lua:settle"], "cases": {"test_plain": [0], "test_keyed": [0, 1],'
        ' "test_redrive": [2], "test_settle": [3]}}', encoding="utf-8")
    ran = trace.load_trace(path)
    assert "fn:fetch_scan" not in ran["test_plain"]  # no key-ordered group: never ran
    pg = "src/rheo_flow/_backends/postgres/functions/fetch_keyed.sql"
    assert trace.cases_for(pg, "fetch_scan", ran) == ["test_keyed"]
    assert trace.cases_for(pg.replace("fetch_keyed", "fetch"), "fetch", ran) == [
        "test_keyed", "test_plain"]
    lua = "src/rheo_flow/_backends/redis/lua/"
    assert trace.cases_for(lua + "redrive.lua", "own_record", ran) == ["test_redrive"]
    assert trace.cases_for(lua + "lookup.lua", "<script>", ran) == ["test_settle"]
    # The whole kit: shared code, a unit no case ran, migrations, no trace.
    assert trace.cases_for(lua + "common.lua", "advance", ran) is None
    assert trace.cases_for(lua + "replay.lua", "<script>", ran) is None
    migration = "src/rheo_flow/_backends/postgres/migrations/v1_tables.sql"
    assert trace.cases_for(migration, "<script>", ran) is None
    assert trace.cases_for(pg, "fetch_scan", None) is None


def test_a_sqlite_statement_is_found_in_what_ran_with_its_slots_filled() -> None:
    sections = trace._sqlite_sections()
    assert sections["list_streams"], "the section has text"
    ran = "sqlite:" + " ".join(sections["list_streams"])
    assert "sqlite:list_streams" in trace.units_of(ran, {}, {}, sections)
    # A statement with a slot the caller fills: its fragments, in order.
    assert trace._holds("DELETE FROM t WHERE id IN (?, ?) AND g = ?",
                        ["DELETE FROM t WHERE id IN (", ") AND g = ?"])
    assert not trace._holds("AND g = ? DELETE FROM t WHERE id IN (?)",
                            ["DELETE FROM t WHERE id IN (", ") AND g = ?"])
    sqlite = "src/rheo_flow/_backends/sqlite/statements.sql"
    assert trace.unit_of(sqlite, "rewind") == {"sqlite:rewind"}
    assert trace.unit_of("src/rheo_flow/_backends/sqlite/schema.sql", "x") is None
