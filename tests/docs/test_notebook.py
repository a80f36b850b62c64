"""examples/tour.ipynb runs top to bottom on a copy, in a kernel of this interpreter."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import ROOT

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

NOTEBOOK = ROOT / "examples" / "tour.ipynb"


def _outputs(cell: dict) -> list[dict]:
    return list(cell.get("outputs", []))


def test_tour_notebook_runs_and_shows_its_tables_and_chart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernelspec of its own, so the kernel is this venv's python whatever else is installed.
    prefix = tmp_path / "kernels"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix),
                    "--name", "python3"], check=True, capture_output=True)
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    copy = tmp_path / "tour.ipynb"
    shutil.copy(NOTEBOOK, copy)
    notebook = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell

    code = [c for c in notebook.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in _outputs(c)]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    tables = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    settled = [t for t in tables if "<th>lag</th>" in t]
    assert settled, "no lag table"
    # After the group ran: every partition at 0.
    final = settled[1]
    assert all(f"<tr><td>{p}</td><td>0</td></tr>" in final for p in range(4)), final
    assert any("unsupported payment method" in t for t in tables)
    assert any("acked 200" in "".join(o.get("text", "")) for o in outputs)
