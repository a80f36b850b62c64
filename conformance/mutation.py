"""Mutation testing of the conformance kit: how much of the backends' behaviour it pins.

Runs mutmut (configured in ``[tool.mutmut]`` of pyproject.toml) over the in-memory
and SQLite backends and the lease rules they share (the files of :data:`MUTATED`:
``memory.py``, the modules of the ``sqlite`` package, ``_shared.py`` and
``_transitions.py``; this list replaces pyproject's ``only_mutate``), with
``pytest conformance`` on ``RHEO_BACKENDS=memory,sqlite`` as the test suite, from
scratch (``mutants/`` is deleted first). Then it summarises the results per file,
lists every mutant the kit did not kill with a short diff, and applies the triage
file ``conformance/mutation-equivalent.toml``: survivors judged *equivalent* (no
change the contract can observe) leave the denominator::

    score = (killed + timeout) / (total - equivalent)

A timeout counts as detected: the suite did not pass. "no tests" mutants (in code no
conformance case runs) and "suspicious" ones count as not detected.

``--target mongo`` mutates the MongoDB backend's Python instead, with the kit on
``RHEO_BACKENDS=mongo``; ``--only NAME`` (a glob on mutmut's mutant names, e.g.
``'rheo_flow._backends.mongo._settle*'``) runs part of a target and keeps earlier
results, so a slow target is measured in pieces and the summary counts the mutants
run so far.

Usage (from the repository root or anywhere)::

    .venv/bin/python conformance/mutation.py [--max-children N] [--json | --markdown]
    .venv/bin/python conformance/mutation.py --report-only   # re-triage the last run
    .venv/bin/python conformance/mutation.py --files   # list what would be mutated, and stop
    .venv/bin/python conformance/mutation.py --target mongo --cases-only \\
        --only 'rheo_flow._backends.mongo._settle*'

The summary is printed (text, ``--json`` or ``--markdown``) and written to
``mutants/mutation-summary.json`` and ``mutants/mutation-summary.md`` (``mutants/``
is git-ignored). mutmut's progress goes to stderr.

Each triage entry matches mutants by stable features rather than mutmut's names
(which shift when code changes): ``file`` (a glob on the path), ``function``
(``Class.method`` or ``function``, a glob) and ``original`` / ``mutated``
(substrings of the removed / added lines of the mutant's diff); ``name`` (a glob
on mutmut's name) is possible too. An entry must say ``reason``. Entries that
match no surviving mutant are reported as stale.

The run is deterministic where it can be: Hypothesis runs derandomized and
without its example database (the stateful test draws the same examples each run).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
EQUIVALENTS = Path(__file__).resolve().parent / "mutation-equivalent.toml"
TARGETS: dict[str, tuple[str, list[str]]] = {
    "memory-sqlite": ("memory,sqlite", [
        "src/rheo_flow/_backends/memory/*.py",
        "src/rheo_flow/_backends/sqlite/*.py",
        "src/rheo_flow/_backends/_shared.py",
        "src/rheo_flow/_backends/_transitions.py",
    ]),
    "mongo": ("mongo", ["src/rheo_flow/_backends/mongo/*.py"]),
}
"""``--target``: the kit's backends (``RHEO_BACKENDS``) and the files mutmut mutates.

The SQL of the SQLite backend is in ``.sql`` files, which mutmut does not mutate
(``mutation_server.py`` does). The MongoDB kit runs against its server (the CI
emulator is slow: sample it with ``--only``)."""
BACKENDS, MUTATED = TARGETS["memory-sqlite"]
"""The target of this run (``main`` sets them from ``--target``)."""

# mutmut's exit codes, as its stats module reads them (mutmut 3.x).
STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
    34: "skipped", 35: "suspicious", 36: "timeout", 37: "caught by type check",
    -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
    -11: "segfault", -9: "segfault", 2: "interrupted", None: "not checked",
}
DETECTED = {"killed", "timeout", "caught by type check", "segfault"}
"""Statuses in which the suite did not pass the mutant."""

# Run in a fresh interpreter: Hypothesis derandomized and without its database (so a
# failure found for one mutant is not replayed against the next), mutmut's
# configuration with MUTATED as its only_mutate (ONLY_MUTATE is set before this runs),
# and a check, right after mutmut has set up sys.path, that rheo_flow comes from
# mutants/ (not from an editable install of another checkout).
_CONFIGURE = """
import mutmut.configuration as c
_load = c._load_config
def _load_config():
    config = _load()
    config.only_mutate = list(ONLY_MUTATE)
    if CASES_ONLY:
        config.pytest_add_cli_args = [*config.pytest_add_cli_args, "-k", "not stateful"]
    return config
c._load_config = _load_config
c.reset_config()
"""
_BOOT = _CONFIGURE + """
import importlib.util, sys
from pathlib import Path
from hypothesis import settings
settings.register_profile("rheo-mutation", database=None, derandomize=True)
settings.load_profile("rheo-mutation")
import mutmut.__main__ as m
_setup = m.setup_source_paths
def setup_source_paths():
    _setup()
    origin = Path(importlib.util.find_spec("rheo_flow").origin).resolve()
    expected = (Path.cwd() / "mutants").resolve()
    if expected not in origin.parents or "rheo_flow" in sys.modules:
        sys.exit(f"rheo_flow would be imported from {origin}, not from {expected}")
    print(f"    rheo_flow imports from {origin.parent}", file=sys.__stdout__, flush=True)
m.setup_source_paths = setup_source_paths
sys.argv = ["mutmut", *sys.argv[1:]]
m.cli()
"""


@dataclass
class Mutant:
    name: str
    file: str
    function: str
    status: str
    diff: str = ""
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    equivalent: str | None = None
    """The triage reason, when an equivalents entry matches."""


@dataclass
class Entry:
    reason: str
    name: str | None = None
    file: str | None = None
    function: str | None = None
    original: str | list[str] | None = None
    mutated: str | list[str] | None = None
    change: str | None = None
    """``"case"``: the mutant only changes letter case (quoted SQL literals kept);
    ``"sql-case"``: the same, on lines of SQL text (an SQL keyword, or a line that is
    one string literal, a piece of a statement split over lines)."""
    matches: int = 0

    def label(self) -> str:
        parts = [f"{k}={v!r}" for k, v in (("name", self.name), ("file", self.file),
                                          ("function", self.function),
                                          ("original", self.original),
                                          ("mutated", self.mutated),
                                          ("change", self.change)) if v is not None]
        return ", ".join(parts)

    def match(self, m: Mutant) -> bool:
        if self.name is not None and not fnmatch.fnmatchcase(m.name, self.name):
            return False
        if self.file is not None and not fnmatch.fnmatchcase(m.file, f"*{self.file}"):
            return False
        if self.function is not None and not fnmatch.fnmatchcase(m.function, self.function):
            return False
        if not _contains(self.original, m.removed) or not _contains(self.mutated, m.added):
            return False
        return self.change is None or _case_only(m, sql=self.change == "sql-case")


def _contains(wanted: str | list[str] | None, lines: list[str]) -> bool:
    """Whether some line contains ``wanted`` (or one of them); True when nothing is wanted."""
    if wanted is None:
        return True
    options = [wanted] if isinstance(wanted, str) else wanted
    return any(option in line for option in options for line in lines)


_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WHERE|FROM|JOIN|ORDER BY|SAVEPOINT|ROLLBACK"
                  r"|RELEASE|BEGIN|COMMIT|PRAGMA|CONFLICT|SET|AND|NULL|IN|MIN|MAX|COALESCE)\b",
                  re.IGNORECASE)


_LITERAL = re.compile(r'\s*f?"[^"]*"[\s,)]*$')
"""A line that is one string literal (a piece of an SQL statement split over lines)."""


def _case_only(m: Mutant, *, sql: bool) -> bool:
    """Whether the mutant only changes letter case, keeping every single-quoted literal."""
    if len(m.removed) != len(m.added) or m.removed == m.added:
        return False
    for old, new in zip(m.removed, m.added, strict=True):
        if old == new:
            continue
        if old.lower() != new.lower():
            return False
        if re.findall(r"'[^']*'", old) != re.findall(r"'[^']*'", new):
            return False
        if sql and not (_SQL.search(old) or _LITERAL.match(old)):
            return False
    return True


def load_entries(path: Path) -> list[Entry]:
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    entries = []
    for i, raw in enumerate(data.get("equivalent", []), 1):
        unknown = set(raw) - {"reason", "name", "file", "function", "original", "mutated",
                              "change"}
        if unknown or not raw.get("reason"):
            raise SystemExit(f"{path.name}: entry {i} has unknown keys {sorted(unknown)} "
                             "or no reason")
        if not set(raw) - {"reason", "file"}:
            raise SystemExit(f"{path.name}: entry {i} matches too broadly (give a function, "
                             "a name or a line)")
        if raw.get("change") not in (None, "case", "sql-case"):
            raise SystemExit(f"{path.name}: entry {i}: change must be 'case' or 'sql-case'")
        entries.append(Entry(**raw))
    return entries


def run_mutmut(max_children: int, only: list[str] | None = None) -> float:
    """Delete mutants/ and run mutmut from scratch (with ``only``: just the mutants
    whose names match, keeping earlier results); the run's wall time in seconds."""
    if MUTANTS.exists() and not only:
        shutil.rmtree(MUTANTS)
    # CI=true: a backend that cannot open fails its cases instead of skipping them
    # (mutmut's check that a broken function fails a test relies on it for MongoDB).
    env = dict(os.environ, RHEO_BACKENDS=BACKENDS, CI="true")
    env.pop("RHEO_MATRIX_PATH", None)  # never write the published matrix
    env.pop("MUTANT_UNDER_TEST", None)
    start = time.monotonic()
    # mutmut's spinner and counters go to stderr, so that stdout stays the summary.
    proc = subprocess.run(
        [sys.executable, "-c", _boot(_BOOT), "run", "--max-children", str(max_children),
         *(only or [])],
        cwd=ROOT, env=env, stdout=sys.stderr, check=False,
    )
    elapsed = time.monotonic() - start
    print(file=sys.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"mutmut run failed (exit {proc.returncode})")
    return elapsed


CASES_ONLY = False
"""``--cases-only``: the kit's cases alone, its stateful test deselected (as
``mutation_server.py`` measures by default)."""


def _boot(code: str) -> str:
    """``code`` to run with ``python -c``, after ``ONLY_MUTATE = MUTATED`` (and
    ``CASES_ONLY``)."""
    return f"ONLY_MUTATE = {MUTATED!r}\nCASES_ONLY = {CASES_ONLY!r}\n{code}"


def mutated_files() -> list[str]:
    """The files mutmut would mutate, as its own configuration (with MUTATED) selects them.

    Exits when a pattern of MUTATED matches no file: a moved or renamed module.
    """
    listing = _CONFIGURE + """
from mutmut.utils.file_utils import walk_mutatable_files
for path in walk_mutatable_files():
    print(path)
"""
    out = subprocess.run([sys.executable, "-c", _boot(listing)], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    files = sorted(Path(p).as_posix() for p in out)
    unmatched = [pattern for pattern in MUTATED
                 if not any(fnmatch.fnmatch(f, pattern) for f in files)]
    if unmatched:
        raise SystemExit(f"MUTATED patterns that match no file: {unmatched}")
    return files


def _functions(path: Path) -> dict[str, list[str]]:
    """The functions of a module as mutmut names them (``function`` or ``Class.method``),
    with their source lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: dict[str, list[str]] = {}

    def add(name: str, node: ast.stmt) -> None:
        found[name] = lines[node.lineno - 1:node.end_lineno]

    for node in ast.parse("\n".join(lines)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add(node.name, node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    add(f"{node.name}.{item.name}", item)
    return found


def stray_entries(entries: list[Entry], files: list[str]) -> list[str]:
    """Triage entries that match no code: their file glob names no mutated file, their
    function glob no function of those files, or their ``original`` no line of those
    functions (code that moved, was renamed or rewritten)."""
    functions = {f: _functions(ROOT / f) for f in files}
    stray = []
    for e in entries:
        named = [source for f in files if e.file is None or fnmatch.fnmatchcase(f, f"*{e.file}")
                 for name, source in functions[f].items()
                 if e.function is None or fnmatch.fnmatchcase(name, e.function)]
        if not any(_contains(e.original, source) for source in named):
            stray.append(e.label())
    return stray


def _function_of(name: str) -> str:
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    func, cls = orig_function_and_class_names_from_key(name)
    return f"{cls}.{func}" if cls else func


def collect() -> list[Mutant]:
    """Every mutant of the last run, with diffs for those the suite did not detect."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    os.chdir(ROOT)  # mutmut's helpers read mutants/ relative to the working directory
    mutants: list[Mutant] = []
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        source = meta.relative_to(MUTANTS).with_suffix("")  # src/.../memory.py
        data = json.loads(meta.read_text(encoding="utf-8"))
        for name, code in data["exit_code_by_key"].items():
            m = Mutant(name=name, file=source.as_posix(), function=_function_of(name),
                       status=STATUS_BY_EXIT_CODE.get(code, "suspicious"))
            if m.status not in DETECTED:
                m.diff = get_diff_for_mutant(name, path=source)
                lines = m.diff.splitlines()[2:]  # past the ---/+++ header
                m.removed = [ln[1:] for ln in lines if ln.startswith("-")]
                m.added = [ln[1:] for ln in lines if ln.startswith("+")]
            mutants.append(m)
    return mutants


def short_diff(m: Mutant) -> str:
    return "\n".join([f"- {ln.strip()}" for ln in m.removed]
                     + [f"+ {ln.strip()}" for ln in m.added])


def apply_triage(mutants: list[Mutant], entries: list[Entry]) -> None:
    """Mark each undetected mutant an entry matches as equivalent (the first entry's
    reason), and count every entry's matches (``mutation_server.py`` shares this)."""
    for m in mutants:
        if m.status in DETECTED:
            continue
        for e in entries:
            if e.match(m):
                e.matches += 1
                if m.equivalent is None:
                    m.equivalent = e.reason


def summarise(mutants: list[Mutant], entries: list[Entry], elapsed: float | None) -> dict[str, Any]:
    apply_triage(mutants, entries)
    per_file: dict[str, dict[str, int]] = {}
    for m in mutants:
        counts = per_file.setdefault(m.file, {"total": 0, "equivalent": 0})
        counts["total"] += 1
        counts[m.status] = counts.get(m.status, 0) + 1
        counts["equivalent"] += m.equivalent is not None
    totals: dict[str, int] = {}
    for counts in per_file.values():
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v

    def score(c: dict[str, int]) -> float | None:
        detected = sum(c.get(s, 0) for s in DETECTED)
        return detected / (c["total"] - c["equivalent"]) if c["total"] > c["equivalent"] else None

    for counts in [*per_file.values(), totals]:
        counts["score"] = score(counts)  # type: ignore[assignment]
    survivors = [m for m in mutants if m.status not in DETECTED]
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "backends": BACKENDS,
        "run_seconds": None if elapsed is None else round(elapsed, 1),
        "per_file": per_file,
        "totals": totals,
        "survivors": [asdict(m) | {"short_diff": short_diff(m)} for m in survivors],
        "stale_equivalents": [{"entry": e.label(), "reason": e.reason}
                              for e in entries if e.matches == 0],
    }


def _fmt_score(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


COLUMNS = ["total", "killed", "timeout", "survived", "no tests", "suspicious", "equivalent"]


def to_text(s: dict[str, Any]) -> str:
    out = [f"Mutation testing of the conformance kit ({s['backends']}), {s['date']}"]
    if s["run_seconds"] is not None:
        out.append(f"run time: {s['run_seconds']:.0f} s")
    width = max(len(f) for f in s["per_file"]) + 2
    out.append("file".ljust(width) + "".join(c.rjust(11) for c in [*COLUMNS, "score"]))
    for name, c in [*s["per_file"].items(), ("total", s["totals"])]:
        out.append(name.ljust(width) + "".join(str(c.get(k, 0)).rjust(11) for k in COLUMNS)
                   + _fmt_score(c["score"]).rjust(11))
    open_ = [m for m in s["survivors"] if m["equivalent"] is None]
    out.append(f"\nNot detected and not triaged as equivalent: {len(open_)}")
    for m in open_:
        out.append(f"\n{m['name']}  [{m['status']}]  {m['file']}  {m['function']}")
        out.extend(f"    {ln}" for ln in m["short_diff"].splitlines())
    equivalent = [m for m in s["survivors"] if m["equivalent"] is not None]
    out.append(f"\nEquivalent (from {EQUIVALENTS.name}): {len(equivalent)}")
    for m in equivalent:
        first = m["short_diff"].splitlines()[-1] if m["short_diff"] else ""
        out.append(f"  {m['name']}: {m['equivalent']}\n      {first}")
    if s["stale_equivalents"]:
        out.append(f"\nStale entries in {EQUIVALENTS.name} (match no surviving mutant):")
        out.extend(f"  {e['entry']}  ({e['reason']})" for e in s["stale_equivalents"])
    return "\n".join(out) + "\n"


def score_table(per_file: dict[str, dict[str, Any]], totals: dict[str, Any],
                columns: list[str], *, code: bool = False) -> list[str]:
    """The markdown rows of a per-file score table with a total row (file names in
    backticks with ``code``)."""
    rows = ["| file | " + " | ".join(columns) + " | score |",
            "|---|" + "---:|" * (len(columns) + 1)]
    for name, c in [*per_file.items(), ("**total**", totals)]:
        shown = f"`{name}`" if code and name != "**total**" else name
        rows.append(f"| {shown} | " + " | ".join(str(c.get(k, 0)) for k in columns)
                    + f" | {_fmt_score(c['score'])} |")
    return rows


def to_markdown(s: dict[str, Any]) -> str:
    t = s["totals"]
    detected = sum(t.get(k, 0) for k in DETECTED)
    out = [
        "## Mutation score",
        "",
        f"Measured {s['date']} by `conformance/mutation.py` (mutmut; `pytest conformance` on "
        f"`RHEO_BACKENDS={s['backends']}`"
        + (f", {s['run_seconds'] / 60:.0f} minutes" if s["run_seconds"] else "") + ").",
        "",
        f"**Score: {_fmt_score(t['score'])}** = detected {detected} (killed + timeout) / "
        f"({t['total']} mutants - {t['equivalent']} equivalent); without the triage "
        f"{_fmt_score(detected / t['total'] if t['total'] else None)}.",
        "",
        *score_table(s["per_file"], t, COLUMNS),
    ]
    open_ = [m for m in s["survivors"] if m["equivalent"] is None]
    out += ["", f"### Survivors the kit should catch ({len(open_)})", ""]
    for m in open_:
        out += [f"- `{m['function']}` in `{m['file']}` ({m['status']}, `{m['name']}`)",
                "  ```diff", *[f"  {ln}" for ln in m["short_diff"].splitlines()], "  ```"]
    equivalent = [m for m in s["survivors"] if m["equivalent"] is not None]
    out += ["", f"### Equivalent survivors ({len(equivalent)})", "", "<details>", "",
            "| mutant | function | change | why equivalent |", "|---|---|---|---|"]
    for m in equivalent:
        change = "; ".join(ln for ln in m["short_diff"].splitlines() if ln.startswith("+"))
        change = change.replace("|", "\\|").replace("`", "'")
        out.append(f"| `{m['name'].rsplit('.', 1)[-1]}` | `{m['function']}` | `{change}` "
                   f"| {m['equivalent']} |")
    out += ["", "</details>"]
    if s["stale_equivalents"]:
        out += ["", f"Stale entries in `{EQUIVALENTS.name}` (match nothing):", ""]
        out += [f"- {e['entry']} ({e['reason']})" for e in s["stale_equivalents"]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2,
                        help="parallel mutant workers (default: the CPU count)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the summary as JSON")
    out.add_argument("--markdown", action="store_true", help="print a markdown section")
    parser.add_argument("--report-only", action="store_true",
                        help="do not run mutmut; summarise the results in mutants/")
    parser.add_argument("--target", choices=sorted(TARGETS), default="memory-sqlite",
                        help="which backends' Python to mutate (default memory-sqlite)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only the mutants whose mutmut name matches (a glob, e.g. "
                        "'rheo_flow._backends.mongo._settle*'); repeatable; the summary "
                        "then counts the mutants measured so far")
    parser.add_argument("--cases-only", action="store_true",
                        help="run the kit's cases without its stateful test (the MongoDB "
                        "emulator takes minutes over it)")
    parser.add_argument("--files", action="store_true",
                        help="list the files mutmut would mutate and check the triage "
                        "file, then stop (a quick self-check)")
    args = parser.parse_args(argv)
    global BACKENDS, MUTATED, CASES_ONLY
    BACKENDS, MUTATED = TARGETS[args.target]
    CASES_ONLY = args.cases_only

    entries = load_entries(EQUIVALENTS)  # a broken triage file fails before the long run
    if args.files:
        files = mutated_files()
        print("\n".join(files))
        # One triage file serves every target: an entry is stray when it matches
        # the code of none.
        every = sorted({p.relative_to(ROOT).as_posix() for _, globs in TARGETS.values()
                        for g in globs for p in ROOT.glob(g)})
        stray = stray_entries(entries, every)
        if stray:
            raise SystemExit(f"{EQUIVALENTS.name}: entries naming no mutated file or no "
                             f"function of one: {stray}")
        print(f"{len(entries)} triage entries, each naming a function of a mutated file",
              file=sys.stderr)
        return 0
    elapsed = None
    if args.report_only:
        if not MUTANTS.exists():
            raise SystemExit("no mutants/ to report on: run without --report-only first")
        previous = MUTANTS / "mutation-summary.json"
        if previous.exists():
            elapsed = json.loads(previous.read_text(encoding="utf-8")).get("run_seconds")
    else:
        elapsed = run_mutmut(args.max_children, args.only)
    mutants = [m for m in collect()
               if any(fnmatch.fnmatch(m.file, pattern) for pattern in MUTATED)]
    if args.only or args.target != "memory-sqlite":
        # A sample: mutants not run yet are unmeasured, not undetected.
        mutants = [m for m in mutants if m.status != "not checked"]
    summary = summarise(mutants, entries, elapsed)
    (MUTANTS / "mutation-summary.json").write_text(json.dumps(summary, indent=2) + "\n",
                                                   encoding="utf-8")
    (MUTANTS / "mutation-summary.md").write_text(to_markdown(summary), encoding="utf-8")
    if args.json:
        print(json.dumps(summary, indent=2))
    elif args.markdown:
        print(to_markdown(summary), end="")
    else:
        print(to_text(summary), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
