"""The documentation site (mkdocs.yml) builds cleanly and covers every page and public name.

The build runs ``mkdocs build --strict`` (broken links and anchors fail it) into a
temporary directory, so nothing is written into the repository.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rheo_flow

if importlib.util.find_spec("mkdocs") is None and os.environ.get("CI", "").lower() not in (
        "1", "true", "yes"):
    # Outside CI a checkout without the docs extra skips; under CI=true the import
    # below fails (the test extra installs the docs extra).
    pytest.skip("mkdocs is not installed: pip install -e '.[docs]'", allow_module_level=True)

import yaml  # PyYAML comes with mkdocs (the docs extra, part of the test extra)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _public_modules() -> list[str]:
    """``rheo_flow`` and every submodule with no underscore-led part in its name."""
    submodules = sorted(
        info.name
        for info in pkgutil.walk_packages(rheo_flow.__path__, "rheo_flow.")
        if not any(part.startswith("_") for part in info.name.split("."))
    )
    return ["rheo_flow", *submodules]


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def _config() -> dict[str, Any]:
    # safe_load: the config must carry no !!python/name tags.
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert isinstance(config, dict)
    return config


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )
    if out.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{out.stdout}{out.stderr}", pytrace=False)
    return site_dir


def test_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "reference" / "index.html").is_file()
    assert not list(site.rglob("*.py")), "a Python file of docs/ was published as a page"


def test_every_public_module_has_a_reference_page() -> None:
    directives = {
        match
        for page in (DOCS / "reference").rglob("*.md")
        for match in re.findall(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"),
                                flags=re.M)
    }
    missing = [name for name in _public_modules() if name not in directives]
    assert not missing, f"public modules without a `::: module` page in docs/reference/: {missing}"


def test_every_public_name_is_in_the_api_reference(site: Path) -> None:
    ids = {
        anchor
        for page in (site / "reference").rglob("*.html")
        for anchor in re.findall(r'id="([^"]+)"', page.read_text(encoding="utf-8"))
    }
    missing = [
        f"{name}.{export}"
        for name in _public_modules()
        for export in getattr(importlib.import_module(name), "__all__", ())
        if f"{name}.{export}" not in ids
    ]
    assert not missing, f"public names missing from the API reference: {missing}"


def test_every_docs_page_is_in_the_nav() -> None:
    config = _config()
    assert config.get("docs_dir", "docs") == "docs"
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert sorted(pages - set(nav)) == [], "pages missing from the nav of mkdocs.yml"



_SHALLOW_ITEM = re.compile(r"^ {1,3}(?:[-*+]|\d+\.) ")
"""A list item indented by 1 to 3 spaces: MkDocs' Markdown needs 4 to nest it."""


def test_no_docs_page_nests_a_list_by_fewer_than_four_spaces() -> None:
    shallow = []
    for page in sorted(DOCS.rglob("*.md")):
        fenced = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and _SHALLOW_ITEM.match(line):
                shallow.append(f"{page.relative_to(DOCS)}:{number}: {line.strip()}")
    assert not shallow, "sub-bullets indented by fewer than 4 spaces (they render as " \
        "siblings of their parent):\n" + "\n".join(shallow)


def test_cli_page_nested_lists_are_nested(site: Path) -> None:
    html = (site / "cli" / "index.html").read_text(encoding="utf-8")
    start = html.index("Faults are injected on purpose")
    item = html[start:html.index("</li>\n</ul>", start)]
    assert "<ul>" in item, "the fault sub-bullets of docs/cli.md are not inside their <li>"
    assert "stale_lease" in item


def test_long_code_lines_wrap(site: Path) -> None:
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"pre > code\s*\{[^}]*white-space:\s*pre-wrap", css)
    assert 'href="../stylesheets/extra.css"' in (site / "cli" / "index.html").read_text(
        encoding="utf-8")
