"""docs/consumers.md and docs/pipeline.md stay true to the code.

Every ```python block of both pages runs (in a fresh process, in a temporary
directory, on ``memory://`` or a SQLite file there) and prints exactly what the
comments next to its ``print`` calls say; the option tables match the options
schema (``rheo_flow._runtime._options``: names, defaults and ranges) and the signatures;
the tables of outcomes, triggers and counters list what the code has. The index
links every page and benchmarks.md every suite.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from _doc_blocks import expected_output, python_blocks
from rheo_flow import Consumer, GroupStats, Producer, Rheo, SettleKind
from rheo_flow._runtime._options import (
    BATCHER,
    CONSUMER,
    PIPELINE,
    PROCESSORS,
    PRODUCER,
    REQUIRED,
    Runtime,
)
from rheo_flow.pipeline import (
    Batcher,
    BatchSize,
    BatchTrigger,
    Message,
    Pipeline,
    PipelineStats,
    Processors,
)
from test_docs import ROOT

RUNTIME_DOCS = ("docs/consumers.md", "docs/pipeline.md")

EXAMPLES = [
    pytest.param(code, id=f"{Path(doc).stem}-{number}")
    for doc in RUNTIME_DOCS
    for number, code in enumerate(python_blocks(ROOT / doc), start=1)
]


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs_and_prints_what_it_says(code: str, tmp_path: Path) -> None:
    expected = expected_output(code)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected


@pytest.mark.parametrize("doc", RUNTIME_DOCS)
def test_every_page_has_runnable_examples(doc: str) -> None:
    assert len(python_blocks(ROOT / doc)) >= 4


# Tables ---------------------------------------------------------------------------------


def _table(doc: str, heading: str, *, header: bool = False) -> list[list[str]]:
    """The body rows of the first table after the heading ``heading`` (any level),
    after its header row when ``header``."""
    text = (ROOT / doc).read_text()
    match = re.search(rf"^#+ {re.escape(heading)}$", text, flags=re.M)
    assert match, f"{doc} has no heading {heading!r}"
    rows: list[list[str]] = []
    for line in text[match.end():].splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table under {heading!r} in {doc}"
    return [rows[0], *rows[2:]] if header else rows[2:]


def _names(cell: str) -> list[str]:
    """The identifiers quoted in a cell (``await`` and call arguments left out)."""
    return re.findall(r"`(?:await )?(\w+)", cell)


def _literal(cell: str) -> Any:
    """The first quoted value of a cell as a Python literal (``NotImplemented`` when it is
    not one, e.g. ``Processors()`` or a word)."""
    match = re.search(r"`([^`]+)`", cell)
    if match is None:
        return NotImplemented
    try:
        return ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return NotImplemented


def test_consumer_options_table_matches_the_class_defaults() -> None:
    rows = _table("docs/consumers.md", "Options")
    documented = {_names(row[0])[0]: _literal(row[1]) for row in rows}
    assert documented == {name: getattr(Consumer, name) for name in Consumer.__annotations__}


def test_pipeline_options_table_matches_the_signature() -> None:
    parameters = inspect.signature(Pipeline).parameters
    options = {name: p.default for name, p in parameters.items()
               if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not p.empty}
    rows = _table("docs/pipeline.md", "Pipeline options")
    documented = {_names(row[0])[0]: row[1] for row in rows}
    assert set(documented) == set(options)
    for name, cell in documented.items():
        value = _literal(cell)
        if value is NotImplemented:  # built when the pipeline is: `Processors()`, "computed"
            assert options[name] is None, name
        else:
            assert value == options[name], name


def test_stage_settings_match_their_dataclasses() -> None:
    text = (ROOT / "docs/pipeline.md").read_text()
    for cls in (Processors, Batcher, BatchSize):
        match = re.search(rf"^`{cls.__name__}\((.*?)\)`", text, flags=re.M)
        assert match, f"pipeline.md does not show the settings of {cls.__name__}"
        call = ast.parse(f"f({match.group(1)})", mode="eval").body
        assert isinstance(call, ast.Call)
        shown: dict[str, Any] = {arg.id: dataclasses.MISSING for arg in call.args
                                 if isinstance(arg, ast.Name)}
        shown |= {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}
        assert shown == {f.name: f.default for f in dataclasses.fields(cls)}, cls.__name__


def test_producer_options_table_matches_the_signature() -> None:
    parameters = inspect.signature(Producer).parameters
    options = {name: p.default for name, p in parameters.items()
               if p.kind is inspect.Parameter.KEYWORD_ONLY}
    rows = _table("docs/pipeline.md", "The producer on its own")
    documented = {_names(row[0])[0]: _literal(row[1]) for row in rows}
    assert documented == options


OPTION_TABLES = [
    ("docs/consumers.md", "Options", CONSUMER),
    ("docs/pipeline.md", "Pipeline options", PIPELINE),
    ("docs/pipeline.md", "Processors", PROCESSORS),
    ("docs/pipeline.md", "Batchers", BATCHER),
    ("docs/pipeline.md", "The producer on its own", PRODUCER),
]


@pytest.mark.parametrize(("doc", "heading", "runtime"), OPTION_TABLES,
                         ids=[runtime.name for _, _, runtime in OPTION_TABLES])
def test_option_table_matches_the_schema(doc: str, heading: str, runtime: Runtime) -> None:
    """Every option the runtime takes with a default has a row, in the schema's order,
    with the schema's default and range (the words of ``Runtime.range_of``)."""
    head, *rows = _table(doc, heading, header=True)
    assert head[:3] == [head[0], "default", "range"], f"{doc} {heading}: columns {head}"
    documented = [_names(row[0])[0] for row in rows]
    assert documented == [name for name, default in runtime.defaults.items()
                          if default is not REQUIRED]
    for name, row in zip(documented, rows, strict=True):
        value = _literal(row[1])
        if value is NotImplemented:  # `Processors()`, "computed": built from None
            assert runtime.defaults[name] is None, name
        else:
            assert value == runtime.defaults[name], name
        assert row[2] == runtime.range_of(name), name


def test_default_max_inflight_is_the_documented_sum() -> None:
    pipeline = Pipeline(Rheo("memory://"), stream="s", group="g",
                        handler=_Noop(), batchers={"default": Batcher()})
    assert pipeline.producer.max_demand == 4 * 10 * 2 + 100 * 2
    assert "`4 * 10 * 2 + 100 * 2 = 280`" in (ROOT / "docs/pipeline.md").read_text()


class _Noop:
    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        return message


def test_pipeline_stats_are_all_named() -> None:
    text = (ROOT / "docs/pipeline.md").read_text()
    paragraph = text.split("`pipeline.stats()` is a\nsnapshot:", 1)[1].split("\n\n", 1)[0]
    assert set(_names(paragraph)) >= {f.name for f in dataclasses.fields(PipelineStats)}


def test_decision_table_matches_the_classifier() -> None:
    rows = _table("docs/consumers.md", "Settling and the decision table")
    documented = {kind: row[1] for row in rows for kind in _names(row[0])}
    assert documented == {kind.value: kind.decision.value for kind in SettleKind}


def test_group_stats_table_lists_every_counter() -> None:
    rows = _table("docs/consumers.md", "Stats and observer")
    documented = [_names(row[0])[0] for row in rows]
    fields = [f.name for f in dataclasses.fields(GroupStats)]
    derived = [name for name, value in vars(GroupStats).items() if isinstance(value, property)]
    assert [name for name in documented if name in fields] == fields  # in their order
    assert sorted(documented) == sorted(fields + derived)


def test_trigger_table_lists_every_trigger() -> None:
    rows = _table("docs/pipeline.md", "Batches and triggers")
    assert {_names(row[0])[0] for row in rows} == set(get_args(BatchTrigger))


def test_message_table_lists_every_public_member() -> None:
    rows = _table("docs/pipeline.md", "Messages")
    documented = {name for row in rows for name in _names(row[0])}
    assert documented == {name for name in dir(Message) if not name.startswith("_")}


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", [*RUNTIME_DOCS, "docs/benchmarks.md", "docs/index.md"])
def test_anchors_resolve(doc: str) -> None:
    page = ROOT / doc
    for target, anchor in re.findall(r"\]\(([\w-]*\.md)?#([\w-]+)\)", page.read_text()):
        linked = page.parent / target if target else page
        assert anchor in _anchors(linked), f"{doc} links to a missing anchor {target}#{anchor}"


# Index and benchmarks ---------------------------------------------------------------------


def test_index_links_every_page() -> None:
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", (ROOT / "docs/index.md").read_text()))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages | {"sinks.md"} <= linked


def test_benchmarks_page_lists_every_suite(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/run.py"), "no-such-suite"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    match = re.search(r"available: (.+)", out.stderr)
    assert out.returncode != 0, out.stderr
    assert match, out.stderr
    suites = {name.strip() for name in match.group(1).split(",")}
    rows = _table("docs/benchmarks.md", "Suites")
    assert {_names(row[0])[0] for row in rows} == suites
