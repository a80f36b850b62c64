"""The README and docs stay true to the code: their examples run, their tables match."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import rheo_flow
from _doc_blocks import python_blocks
from rheo_flow import InvalidArgument, MissingExtra
from rheo_flow._backends._urls import backend_from_url

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_URLS = [
    "memory://",
    "sqlite:///:memory:",
    "postgresql://postgres@127.0.0.1:5432/test",
    "redis://127.0.0.1:6379/0",
    "mongodb://127.0.0.1:27017/rheo_test",
]


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md"])
def test_first_example_runs(doc: str, tmp_path: Path) -> None:
    code = python_blocks(ROOT / doc)[0]
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_readme_has_exactly_two_setup_commands() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/rheo-flow demo",
        "python3 -m venv .venv && .venv/bin/pip install -e '.[all,test]' && .venv/bin/pytest",
    ]


def _documented_capabilities() -> dict[str, dict[str, bool]]:
    text = (ROOT / "docs/backends.md").read_text()
    table = text.split("<!-- capability-table:start -->")[1]
    table = table.split("<!-- capability-table:end -->")[0]
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in table.strip().splitlines()]
    header, body = rows[0], rows[2:]
    # A cell may qualify its value after a colon ("yes: with AOF, see below").
    return {name: {row[0]: row[i].split(":")[0].strip() == "yes" for row in body}
            for i, name in enumerate(header) if i > 0}


def test_capability_table_matches_every_shipped_backend() -> None:
    shipped: dict[str, dict[str, bool]] = {}
    unavailable: list[str] = []
    for url in SAMPLE_URLS:
        try:
            backend = backend_from_url(url)
        except MissingExtra:
            continue
        except InvalidArgument as exc:  # a backend not written yet
            unavailable.append(str(exc))
            continue
        shipped[backend.name] = backend.capabilities.as_dict()
    assert all("not available in this version" in e for e in unavailable), unavailable
    assert _documented_capabilities() == shipped


def test_docs_links_resolve() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+\.md)\)", doc.read_text()):
            if "://" in target:  # a page on the web, not in this repository
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_settle_table_in_docs_matches_the_code() -> None:
    for doc in ("README.md", "docs/concepts.md"):
        text = (ROOT / doc).read_text()
        rows = dict(re.findall(r"^\| `(\w+)` \|[^|]*\| `(\w+)`", text, flags=re.M))
        assert rows == {k.value: k.decision.value for k in rheo_flow.SettleKind}, doc


def test_nothing_points_outside_the_repository() -> None:
    """The contract lives in docs/: no code or doc cites a design file kept elsewhere."""
    outside = re.compile(r"DESIGN(\.md| section)|\.\./shared|shared/reference")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("src", "docs", "tests", "conformance", "benchmarks", "examples")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in {".py", ".md"} and path.name != "test_docs.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if outside.search(line)
    ]
    assert not offenders, f"references outside the repository: {offenders}"


def test_the_notebook_is_linked_with_its_extra_and_command() -> None:
    """README and docs/index.md point at examples/tour.ipynb, name the ``examples``
    extra and the command that runs it; the extra holds what that command needs."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    needed = {re.split(r"[<>=\[]", d)[0] for d in extras["examples"]}
    assert {"nbclient", "ipykernel", "matplotlib"} <= needed
    assert "rheo-flow[examples]" in extras["test"]
    for doc in ("README.md", "docs/index.md"):
        text = (ROOT / doc).read_text()
        assert "examples/tour.ipynb" in text, doc
        assert "'.[examples]'" in text, doc
        assert "jupyter execute examples/tour.ipynb" in text, doc
