"""The text mutator of ``mutation_server.py``: one-line mutants of SQL and Lua files.

Kept apart from the runner so that it imports nothing but the standard library
(``tests/kit/test_server_mutation.py`` exercises it on small snippets).

A file is scanned once: comments and string literals are masked (replaced by
spaces, so columns stay put), the rest is split into tokens with their line and
column, and each operator walks the tokens with the little context it needs
(parenthesis depth, an UPDATE's SET list, a BETWEEN's AND, a PL/pgSQL function
body). Every mutant changes one line (a removed statement may blank the lines it
continues on) and is named by its file, line, operator, and the original and
mutated text of that line.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["OPERATORS", "ServerMutant", "apply", "language_of", "mutants_of"]

OPERATORS = ("cmp", "arith", "logic", "drop-cond", "not", "least-greatest", "min-max",
             "state", "stmt", "order")
"""Operator names, as mutants and reports carry them:

* ``cmp``: ``<``/``<=``, ``>``/``>=`` swapped; ``=`` to ``<>`` (Lua ``==``/``~=``) and back;
* ``arith``: ``+ 1`` to ``+ 0`` / ``- 1``, ``- 1`` to ``- 0`` / ``+ 1``;
* ``logic``: ``AND``/``OR`` (Lua ``and``/``or``) swapped;
* ``drop-cond``: a term of a WHERE / ON / IF condition or of an AND replaced by ``TRUE``
  (Lua: a term of an ``if`` / ``elseif`` condition by ``true``);
* ``not``: ``NOT`` / ``not`` removed;
* ``least-greatest``: ``LEAST``/``GREATEST`` swapped (SQL);
* ``min-max``: ``min(``/``max(`` (SQL) and ``math.min``/``math.max`` (Lua) swapped;
* ``state``: a state constant swapped: 0/1 and 2/3 where compared with or assigned to a
  state column (``state``, ``settled_by``, ``ordering``, ``p_op``) or as a THEN/ELSE of a
  CASE assigned to one; Lua's delivery states ``'L'``/``'A'`` and ``'K'``/``'R'`` (and
  their bytes 76/65, 75/82);
* ``stmt``: a statement removed: a PL/pgSQL statement of a function body replaced by
  ``NULL;``; a Lua statement that is a ``redis.call(`` or ``bulk(`` call (or a one-line
  ``if`` holding one) removed;
* ``order``: ``ASC``/``DESC`` swapped, and ``DESC`` added to an ORDER BY item without one.
"""


@dataclass
class ServerMutant:
    """One mutant: ``lines`` (0-based, first = ``line - 1``) replaced by ``replacement``."""

    file: str
    line: int
    """1-based number of the line the mutant changes (its first, for a removed statement)."""
    op: str
    original: str
    mutated: str
    function: str
    """The enclosing PL/pgSQL function, statements.sql section or Lua local function
    (``<script>`` outside any)."""
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    span: int = 1
    """How many lines the mutant replaces (more than one for a removed statement)."""

    @property
    def key(self) -> str:
        """A stable identity: file, line, operator, original and mutated line."""
        digest = hashlib.sha1("\0".join(
            [self.file, str(self.line), self.op, self.original, self.mutated]).encode())
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}:{self.op}:{digest.hexdigest()[:8]}"


def language_of(path: str) -> str:
    """``"lua"``, ``"pgsql"`` (PostgreSQL) or ``"sqlite"`` (SQLite's SQL)."""
    if path.endswith(".lua"):
        return "lua"
    if "/sqlite/" in path or path.startswith("sqlite/"):
        return "sqlite"
    return "pgsql"


def apply(text: str, m: ServerMutant) -> str:
    """``text`` (the original file) with the mutant ``m`` applied."""
    lines = text.split("\n")
    start = m.line - 1
    if lines[start] != m.original:
        raise ValueError(f"{m.key}: line {m.line} is not {m.original!r}")
    lines[start:start + m.span] = [m.mutated] + [""] * (m.span - 1)
    return "\n".join(lines)


# --- Scanning -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Tok:
    text: str
    line: int  # 0-based
    col: int

    @property
    def up(self) -> str:
        return self.text.upper()


_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|\$\w*\$|\$\d+|:=|=>|::|<=|>=|<>|!=|~=|==|"
                    r"\.\.\.?|->>|->|\|\||\S")


def _mask(text: str, lang: str) -> list[str]:
    """The lines of ``text`` with comments and string literals (and SQL quoted
    identifiers) replaced by spaces; delimiters of strings are kept as quotes."""
    out = []
    chars = list(text)
    i, n = 0, len(chars)
    while i < n:
        c = chars[i]
        if c == "-" and i + 1 < n and chars[i + 1] == "-":
            j = text.find("\n", i)
            j = n if j < 0 else j
            if lang == "lua" and text.startswith("--[[", i):
                j = text.find("]]", i)
                j = n if j < 0 else j + 2
            for k in range(i, j):
                if chars[k] != "\n":
                    chars[k] = " "
            i = j
            continue
        if c in "'\"":
            j = i + 1
            while j < n:
                if lang == "lua" and chars[j] == "\\":
                    j += 2
                    continue
                if chars[j] == c:
                    if lang != "lua" and j + 1 < n and chars[j + 1] == c:
                        j += 2
                        continue
                    break
                if chars[j] == "\n" and lang == "lua":
                    break
                j += 1
            for k in range(i + 1, min(j, n)):
                if chars[k] != "\n":
                    chars[k] = " "
            i = j + 1
            continue
        if c == "/" and lang != "lua" and text.startswith("/*", i):
            j = text.find("*/", i)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if chars[k] != "\n":
                    chars[k] = " "
            i = j
            continue
        i += 1
    out = "".join(chars).split("\n")
    return out


def _tokens(masked: list[str], lines: list[str]) -> list[Tok]:
    """The tokens of the masked lines; a statements file's ``-- name:`` line (a comment,
    masked) ends the statement before it, as a ``;`` token would."""
    out = []
    for ln, line in enumerate(masked):
        if lines[ln].startswith("-- name:"):
            out.append(Tok(";", ln, 0))
        out.extend(Tok(m.group(), ln, m.start()) for m in _TOKEN.finditer(line))
    return out


def _functions(lines: list[str], lang: str) -> list[str]:
    """The enclosing function (or statement section) of each line."""
    names, current = [], "<script>" if lang == "lua" else "<file>"
    fn_re = re.compile(r"CREATE OR REPLACE FUNCTION \{s\}\.(\w+)", re.IGNORECASE)
    for line in lines:
        if lang == "lua":
            m = re.match(r"local function (\w+)", line)
            if m:
                current = m[1]
            names.append(current)
            if line.startswith("end") and current != "<script>":
                current = "<script>"
            continue
        m = fn_re.search(line) or re.match(r"-- name: (\w+)", line)
        if m:
            current = m[1]
        names.append(current)
    return names


# --- Operators ----------------------------------------------------------------------

_CMP_SQL = {"<": ["<="], "<=": ["<"], ">": [">="], ">=": [">"], "=": ["<>"], "<>": ["="],
            "!=": ["="]}
_CMP_LUA = {"<": ["<="], "<=": ["<"], ">": [">="], ">=": [">"], "==": ["~="], "~=": ["=="]}
_STATE_COLUMN = re.compile(r"(^|\.|_)(state|settled_by|ordering|op)$", re.IGNORECASE)
_STATE_SWAP = {"0": "1", "1": "0", "2": "3", "3": "2"}
_LUA_STATE = {"L": "A", "A": "L", "K": "R", "R": "K"}
_LUA_BYTE = {"76": "65", "65": "76", "75": "82", "82": "75"}
_CLAUSE_END = {"AND", "OR", "WHERE", "ORDER", "GROUP", "LIMIT", "FOR", "RETURNING", "OFFSET",
               "JOIN", "LEFT", "RIGHT", "INNER", "CROSS", "UNION", "THEN", "HAVING", "INTO",
               "WINDOW", "LOOP", "ON", "WHEN", "ELSE", "END", "FILTER"}
_ITEM_END = {"LIMIT", "FOR", "OFFSET", "ASC", "DESC", "NULLS", "ROWS", "RANGE", "INTO",
             "FROM", "WHERE", "UNION"}


@dataclass
class _Edit:
    line: int
    col: int
    end: int  # column after the replaced text, on the same line
    text: str
    op: str


class _Scan:
    def __init__(self, text: str, lang: str) -> None:
        self.lang = lang
        self.lines = text.split("\n")
        self.masked = _mask(text, lang)
        self.toks = _tokens(self.masked, self.lines)
        self.depth = self._depths()
        self.between: set[int] = set()

    def _depths(self) -> list[int]:
        """The parenthesis depth before each token."""
        out, d = [], 0
        for t in self.toks:
            if t.text == ")":
                d -= 1
            out.append(d)
            if t.text == "(":
                d += 1
        return out

    def prev(self, i: int, k: int = 1) -> Tok | None:
        return self.toks[i - k] if i - k >= 0 else None

    def next(self, i: int, k: int = 1) -> Tok | None:
        return self.toks[i + k] if i + k < len(self.toks) else None

    def line_masked(self, ln: int) -> str:
        return self.masked[ln]


def _edit_at(t: Tok, new: str, op: str) -> _Edit:
    return _Edit(t.line, t.col, t.col + len(t.text), new, op)


def _sql_assignments(s: _Scan) -> set[int]:
    """Token indexes of the ``=`` of SET lists (UPDATE ... SET a = ..., b = ...; function
    options ``SET name = value``; ON CONFLICT DO UPDATE SET) and of PRAGMA lines."""
    out: set[int] = set()
    toks = s.toks
    for i, t in enumerate(toks):
        if t.up == "PRAGMA":
            for j in range(i + 1, len(toks)):
                if toks[j].line != t.line:
                    break
                if toks[j].text == "=":
                    out.add(j)
        if t.up != "SET":
            continue
        depth = s.depth[i]
        j = i + 1
        while j + 1 < len(toks):
            # target (ident) then "="
            if toks[j + 1].text == "=":
                out.add(j + 1)
            else:
                break
            # skip to the next "," at this depth, or the end of the list
            k = j + 2
            while k < len(toks):
                if s.depth[k] < depth or (s.depth[k] == depth and (
                        toks[k].text == ";" or toks[k].up in {
                            "FROM", "WHERE", "RETURNING", "SET", "LANGUAGE", "AS",
                            "RETURNS"})):
                    k = -1
                    break
                if s.depth[k] == depth and toks[k].text == ",":
                    break
                k += 1
            if k < 0 or k >= len(toks):
                break
            j = k + 1
    return out


def _between_ands(s: _Scan) -> set[int]:
    out: set[int] = set()
    for i, t in enumerate(s.toks):
        if t.up == "BETWEEN":
            for j in range(i + 1, len(s.toks)):
                if s.depth[j] == s.depth[i] and s.toks[j].up == "AND":
                    out.add(j)
                    break
    return out


def _is_operand_end(t: Tok | None) -> bool:
    return t is not None and (t.text[0].isalnum() or t.text[0] in "_)]'\"$")


def _sql_edits(s: _Scan) -> Iterator[_Edit]:
    toks = s.toks
    assign = _sql_assignments(s)
    between = s.between = _between_ands(s)
    state_case: list[int] = []  # depths of CASE expressions assigned to a state column
    for i, t in enumerate(toks):
        up = t.up
        p, n = s.prev(i), s.next(i)
        # cmp
        if t.text in _CMP_SQL and i not in assign:
            for new in _CMP_SQL[t.text]:
                yield _edit_at(t, new, "cmp")
        # arith
        if t.text in "+-" and len(t.text) == 1 and n is not None and n.text == "1" \
                and _is_operand_end(p) and n.line == t.line:
            other = "-" if t.text == "+" else "+"
            yield _Edit(t.line, t.col, n.col + 1, f"{t.text} 0", "arith")
            yield _Edit(t.line, t.col, n.col + 1, f"{other} 1", "arith")
        # logic
        if up in ("AND", "OR") and i not in between and not (n is not None and n.up == "REPLACE"):
            yield _edit_at(t, _case_like(t.text, "OR" if up == "AND" else "AND"), "logic")
        # not
        if up == "NOT" and n is not None:
            keep = (n.up == "NULL" and (p is None or p.up != "IS")) or \
                (p is not None and p.up == "IF" and n.up == "EXISTS")
            if not keep and n.line == t.line:
                yield _Edit(t.line, t.col, n.col, "", "not")
        # least / greatest, min / max
        if up in ("LEAST", "GREATEST") and n is not None and n.text == "(":
            yield _edit_at(t, _case_like(t.text, "GREATEST" if up == "LEAST" else "LEAST"),
                           "least-greatest")
        if up in ("MIN", "MAX") and n is not None and n.text == "(":
            yield _edit_at(t, _case_like(t.text, "MAX" if up == "MIN" else "MIN"), "min-max")
        # state constants
        if t.text in _STATE_SWAP:
            before = (p is not None and p.text in ("=", "<>", "!=", "<", ">", "<=", ">=")
                      and s.prev(i, 2) is not None
                      and _STATE_COLUMN.search(s.prev(i, 2).text))  # type: ignore[union-attr]
            after = (n is not None and n.text in ("=", "<>", "!=")
                     and s.next(i, 2) is not None
                     and _STATE_COLUMN.search(s.next(i, 2).text))  # type: ignore[union-attr]
            in_case = bool(state_case) and p is not None and p.up in ("THEN", "ELSE")
            if before or after or in_case:
                yield _edit_at(t, _STATE_SWAP[t.text], "state")
        if up == "CASE" and p is not None and i - 1 in assign and \
                _STATE_COLUMN.search(s.prev(i, 2).text):  # type: ignore[union-attr]
            state_case.append(s.depth[i])
        elif up == "END" and state_case and s.depth[i] == state_case[-1]:
            state_case.pop()
        # order
        if up in ("ASC", "DESC"):
            yield _edit_at(t, _case_like(t.text, "DESC" if up == "ASC" else "ASC"), "order")
        if up == "BY" and p is not None and p.up == "ORDER":
            yield from _order_items(s, i + 1)
        # dropped conditions
        if up in ("WHERE", "ON", "IF", "ELSIF") or (up == "AND" and i not in between):
            if up == "ON" and n is not None and n.up in ("CONFLICT", "COMMIT"):
                continue
            yield from _drop_term(s, i + 1)


def _case_like(old: str, new: str) -> str:
    return new.lower() if old.islower() else new


def _term_end(s: _Scan, start: int, stops: set[str]) -> int | None:
    """Index of the last token of the term starting at ``start`` (on its line), or None
    when the term crosses lines or is followed by an OR."""
    toks = s.toks
    d0 = s.depth[start]
    j = start
    last = None
    while j < len(toks):
        t = toks[j]
        if s.depth[j] < d0 or (s.depth[j] == d0 and (t.text in (";", ",")
                                                      or t.up in stops)):
            break
        last = j
        j += 1
    if last is None or toks[last].line != toks[start].line:
        return None
    if j < len(toks) and toks[j].up == "OR" and s.depth[j] == d0:
        return None
    if j < len(toks) and toks[j].up == "AND" and j in s.between:
        return None
    return last


def _drop_term(s: _Scan, start: int) -> Iterator[_Edit]:
    if start >= len(s.toks):
        return
    first = s.toks[start]
    if first.up in ("TRUE", "NOT") and s.next(start) is not None and \
            s.next(start).up in _CLAUSE_END:  # type: ignore[union-attr]
        return
    if first.up in ("TRUE", "EXISTS") or (first.up == "NOT" and s.next(start) is not None
                                           and s.next(start).up == "EXISTS"):  # type: ignore[union-attr]
        return
    last = _term_end(s, start, _CLAUSE_END)
    if last is None or (last == start and first.up == "TRUE"):
        return
    end_tok = s.toks[last]
    yield _Edit(first.line, first.col, end_tok.col + len(end_tok.text), "TRUE", "drop-cond")


def _order_items(s: _Scan, start: int) -> Iterator[_Edit]:
    """``DESC`` after each ORDER BY item with no direction (items on one line)."""
    toks = s.toks
    d0 = s.depth[start] if start < len(toks) else 0
    j = start
    while j < len(toks):
        k = j
        last = None
        explicit = False
        while k < len(toks):
            t = toks[k]
            if s.depth[k] < d0 or (s.depth[k] == d0 and (t.text in (",", ";")
                                                          or t.up in _ITEM_END)):
                break
            last = k
            k += 1
        if k < len(toks) and toks[k].up in ("ASC", "DESC", "NULLS"):
            explicit = True
        if last is None:
            return
        if not explicit and toks[last].line == toks[j].line:
            end = toks[last]
            yield _Edit(end.line, end.col + len(end.text), end.col + len(end.text), " DESC",
                        "order")
        # past the direction, to the next item
        while k < len(toks) and s.depth[k] == d0 and toks[k].up in ("ASC", "DESC", "NULLS",
                                                                    "FIRST", "LAST"):
            k += 1
        if k < len(toks) and s.depth[k] == d0 and toks[k].text == ",":
            j = k + 1
            continue
        return


def _function_bodies(s: _Scan) -> list[tuple[int, int]]:
    """Token index ranges (BEGIN+1, END) of PL/pgSQL function bodies' statement parts."""
    out = []
    toks = s.toks
    i = 0
    while i < len(toks):
        if toks[i].text.startswith("$") and toks[i].text.endswith("$") and len(toks[i].text) > 1:
            tag = toks[i].text
            j = i + 1
            while j < len(toks) and toks[j].text != tag:
                j += 1
            begin = next((k for k in range(i + 1, j) if toks[k].up == "BEGIN"), None)
            if begin is not None:
                out.append((begin + 1, j))
            i = j + 1
            continue
        i += 1
    return out


_NOT_STATEMENT = {"END", "IF", "ELSIF", "ELSE", "LOOP", "FOR", "WHILE", "BEGIN", "DECLARE",
                  "RETURN", "NULL", "EXCEPTION", "WHEN"}


def _plpgsql_statements(s: _Scan) -> Iterator[tuple[int, int]]:
    """(first line, last line) of each removable statement of the function bodies."""
    toks = s.toks
    for begin, end in _function_bodies(s):
        i = begin
        while i < end:
            t = toks[i]
            if t.up in ("THEN", "ELSE", "LOOP", ";"):
                i += 1
                continue
            # a statement starts at t; find its ";" at depth 0 relative to t
            j = i
            while j < end and not (toks[j].text == ";" and s.depth[j] == s.depth[i]):
                j += 1
            if j >= end:
                break
            head = t.up
            nxt = s.next(i)
            removable = (head not in _NOT_STATEMENT
                         or (head == "RETURN" and nxt is not None and nxt.up == "QUERY"))
            if head in ("IF", "ELSIF", "ELSE", "FOR", "WHILE", "LOOP", "WHEN"):
                # step into the block: the statement part starts after THEN / LOOP
                k = i + 1
                while k < end and toks[k].up not in ("THEN", "LOOP"):
                    k += 1
                i = k + 1
                continue
            line_starts = s.masked[t.line][:t.col].strip() == ""
            line_ends = s.masked[toks[j].line][toks[j].col + 1:].strip() == ""
            if removable and line_starts and line_ends:
                yield t.line, toks[j].line
            i = j + 1


def _lua_edits(s: _Scan) -> Iterator[_Edit]:
    toks = s.toks
    for i, t in enumerate(toks):
        p, n = s.prev(i), s.next(i)
        if t.text in _CMP_LUA:
            for new in _CMP_LUA[t.text]:
                yield _edit_at(t, new, "cmp")
        if t.text in "+-" and len(t.text) == 1 and n is not None and n.text == "1" \
                and _is_operand_end(p) and n.line == t.line and not _appends(s, i):
            other = "-" if t.text == "+" else "+"
            yield _Edit(t.line, t.col, n.col + 1, f"{t.text} 0", "arith")
            yield _Edit(t.line, t.col, n.col + 1, f"{other} 1", "arith")
        if t.text in ("and", "or"):
            yield _edit_at(t, "or" if t.text == "and" else "and", "logic")
        if t.text == "not" and n is not None and n.line == t.line:
            yield _Edit(t.line, t.col, n.col, "", "not")
        if t.text in ("min", "max") and p is not None and p.text == "." \
                and s.prev(i, 2) is not None and s.prev(i, 2).text == "math":  # type: ignore[union-attr]
            yield _edit_at(t, "max" if t.text == "min" else "min", "min-max")
        if t.text == "'" and n is not None and n.text == "'" and n.col == t.col + 2:
            letter = s.lines[t.line][t.col + 1]
            if letter in _LUA_STATE:
                yield _Edit(t.line, t.col, t.col + 3, f"'{_LUA_STATE[letter]}'", "state")
        if t.text in _LUA_BYTE and p is not None and p.text in ("==", "~="):
            yield _edit_at(t, _LUA_BYTE[t.text], "state")
        if t.text in ("if", "elseif"):
            yield from _lua_drop_terms(s, i + 1)


def _appends(s: _Scan, i: int) -> bool:
    """Whether the ``+`` at ``i`` is in a table append, ``t[#t + 1] = v`` (not a boundary)."""
    return (i >= 3 and s.toks[i - 3].text == "[" and s.toks[i - 2].text == "#"
            and s.toks[i + 2].text == "]" if i + 2 < len(s.toks) else False)


def _lua_drop_terms(s: _Scan, start: int) -> Iterator[_Edit]:
    """Each top-level ``and`` term of an if / elseif condition (on one line) -> true."""
    toks = s.toks
    d0 = s.depth[start] if start < len(toks) else 0
    terms: list[tuple[int, int]] = []
    j = start
    begin = start
    while j < len(toks) and toks[j].line == toks[start].line:
        if s.depth[j] == d0 and toks[j].text == "or":
            return
        if s.depth[j] == d0 and toks[j].text in ("and", "then"):
            terms.append((begin, j - 1))
            begin = j + 1
            if toks[j].text == "then":
                break
        j += 1
    else:
        return
    for a, b in terms:
        if b < a or (a == b and toks[a].text == "true"):
            continue
        yield _Edit(toks[a].line, toks[a].col, toks[b].col + len(toks[b].text), "true",
                    "drop-cond")


def _lua_statements(s: _Scan) -> Iterator[tuple[int, int]]:
    """(first, last line) of Lua statements that are a redis.call / bulk call or a
    one-line ``if`` holding one."""
    for ln, line in enumerate(s.masked):
        code = line.strip()
        if not (code.startswith(("redis.call(", "bulk(")) or (
                code.startswith("if ") and code.endswith(" end") and "redis.call(" in code)):
            continue
        depth, last = 0, ln
        for k in range(ln, len(s.masked)):
            depth += s.masked[k].count("(") - s.masked[k].count(")")
            last = k
            if depth <= 0:
                break
        yield ln, last


def mutants_of(path: str, text: str) -> list[ServerMutant]:
    """Every mutant of the file ``path`` (its repository path) with contents ``text``,
    in line order, each once."""
    lang = language_of(path)
    s = _Scan(text, lang)
    functions = _functions(s.lines, lang)
    edits = list(_lua_edits(s) if lang == "lua" else _sql_edits(s))
    out: dict[str, ServerMutant] = {}
    for e in edits:
        original = s.lines[e.line]
        mutated = original[:e.col] + e.text + original[e.end:]
        if mutated == original:
            continue
        m = ServerMutant(path, e.line + 1, e.op, original, mutated, functions[e.line],
                         removed=[original], added=[mutated])
        out.setdefault(m.key, m)
    statements = (_lua_statements(s) if lang == "lua"
                  else _plpgsql_statements(s) if lang == "pgsql" else iter(()))
    for first, last in statements:
        original = s.lines[first]
        indent = original[:len(original) - len(original.lstrip())]
        replacement = "" if lang == "lua" else f"{indent}NULL;"
        m = ServerMutant(path, first + 1, "stmt", original, replacement, functions[first],
                         removed=s.lines[first:last + 1], added=[replacement],
                         span=last - first + 1)
        out.setdefault(m.key, m)
    return sorted(out.values(), key=lambda m: (m.line, OPERATORS.index(m.op), m.mutated))
