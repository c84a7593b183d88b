"""The notebooks of notebooks/ run top to bottom without error (nbclient,
a fresh kernel each, in the notebooks' own directory, data they make
themselves).  Both run at once, in two kernels: the first test to ask
starts them, each test waits for its own."""
import asyncio
import os
import threading
import time
from typing import Any, Dict

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(REPO, "notebooks")
NOTEBOOKS = ["explore_extent_map.ipynb", "tune_sparse_threshold.ipynb"]
CELL_TIMEOUT = 300


def _needs():
    for name in ("nbclient", "nbformat", "ipykernel", "pandas", "matplotlib"):
        pytest.importorskip(name)


class Runs:
    """Executes every notebook in its own thread and kernel; get(name) waits."""

    def __init__(self) -> None:
        self.results: Dict[str, Any] = {}
        self.threads = {name: threading.Thread(target=self._run, args=(name,), daemon=True)
                        for name in NOTEBOOKS}
        for t in self.threads.values():
            t.start()

    def _run(self, name: str) -> None:
        import nbformat
        from nbclient import NotebookClient

        t0 = time.monotonic()
        try:
            nb = nbformat.read(os.path.join(NOTEBOOK_DIR, name), as_version=4)
            client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                    resources={"metadata": {"path": NOTEBOOK_DIR}})
            asyncio.run(client.async_execute())
            self.results[name] = (nb, None, time.monotonic() - t0)
        except BaseException as exc:   # reported by the notebook's own test
            self.results[name] = (None, exc, time.monotonic() - t0)

    def get(self, name: str):
        self.threads[name].join()
        return self.results[name]


@pytest.fixture(scope="module")
def runs():
    _needs()
    return Runs()


def outputs(nb, kind):
    """Every output of a kind: "text" (streams and text/plain), "html", "png"."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if kind == "text" and o.get("output_type") == "stream":
                out.append(o["text"])
            data = o.get("data", {})
            key = {"text": "text/plain", "html": "text/html", "png": "image/png"}[kind]
            if key in data:
                out.append(data[key])
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_clean(name):
    """Checked in without outputs: diffs stay readable, runs stay honest."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(os.path.join(NOTEBOOK_DIR, name), as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_explore_extent_map(runs):
    nb, exc, seconds = runs.get("explore_extent_map.ipynb")
    if exc is not None:
        raise exc
    html = outputs(nb, "html")
    assert any("<svg" in h and "imgcopy-extent-map" in h for h in html)   # ExtentMap view
    assert len(outputs(nb, "png")) >= 2                                  # the plots
    text = "".join(outputs(nb, "text"))
    assert "CopyPlan" in text and "compressed clusters:" in text
    assert seconds < 120, seconds


def test_tune_sparse_threshold(runs):
    nb, exc, seconds = runs.get("tune_sparse_threshold.ipynb")
    if exc is not None:
        raise exc
    assert len(outputs(nb, "png")) >= 2
    text = "".join(outputs(nb, "text"))
    assert "sparse_threshold=" in text and "write requests" in text
    assert seconds < 120, seconds
