"""docs/notebooks/first-run.ipynb runs (nbclient, the kernel of this Python) on the bundled data in
under two minutes, and what it prints and plots is what its runs wrote: the summary it reads is the
run folder's summary.json, the control is a round-0 run, the curve is drawn."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the docs extra: pip install -e '.[docs]'")
nbclient = pytest.importorskip("nbclient", reason="the docs extra: pip install -e '.[docs]'")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "docs" / "notebooks" / "first-run.ipynb"
#: Appended to a copy of the notebook: what the test compares with the run folders.
PROBE = """import json as _json
print("PROBE", _json.dumps({"trained": trained["folder"], "control": control["folder"],
                            "means": [mean, c_mean], "cis": [ci, c_ci], "plotted": [val_x, val_y]}))"""


def test_the_committed_notebook_has_no_outputs() -> None:
    """The site runs it at build time; committed outputs would be numbers no command regenerates."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def test_the_notebook_runs_and_shows_what_its_runs_wrote(tmp_path: Path) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp_path)}  # its run folders (tempfile.mkdtemp) land in the test's folder
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the kernel is a child process: it inherits this environment
    start = time.perf_counter()
    try:
        nbclient.NotebookClient(notebook, timeout=240, kernel_name="python3", resources={"metadata": {
            "path": str(tmp_path)}}).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    seconds = time.perf_counter() - start
    assert seconds < 120, f"the notebook took {seconds:.0f} s (it must take under two minutes)"

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    probe = json.loads(next(line for line in text.splitlines() if line.startswith("PROBE "))[len("PROBE "):])
    trained = json.loads((Path(probe["trained"]) / "summary.json").read_text())
    control = json.loads((Path(probe["control"]) / "summary.json").read_text())
    assert Path(probe["trained"]).is_relative_to(tmp_path)
    # What it printed is what the run folders hold.
    mean, c_mean = probe["means"]
    assert mean == pytest.approx(100 * trained["test"]["accuracy"]) and c_mean == pytest.approx(100 * control["test"]["accuracy"])
    assert f"fl-proto: test accuracy {mean:.2f} ± {probe['cis'][0]:.2f} %" in text
    assert f"untrained: test accuracy {c_mean:.2f} ± {probe['cis'][1]:.2f} %" in text
    assert trained["algorithm"] == control["algorithm"] == "fl-proto"
    assert control["control"] == "untrained" and control["rounds"] == 0 and trained["rounds"] == 20
    # The curve: round 0 (the initial score) and every 4th round's validation accuracy from metrics.jsonl.
    rounds = [json.loads(line) for line in (Path(probe["trained"]) / "metrics.jsonl").read_text().splitlines()]
    val_x, val_y = probe["plotted"]
    assert val_x == [0, 4, 8, 12, 16, 20]
    assert val_y[1:] == [100 * r["val_accuracy"] for r in rounds if "val_accuracy" in r]
    assert val_y[0] == 100 * trained["initial_score"]["accuracy"]
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 1, "the accuracy curve"
    # What training adds: the demo's federated method is well above its untrained network.
    assert mean - probe["cis"][0] > c_mean + probe["cis"][1]
