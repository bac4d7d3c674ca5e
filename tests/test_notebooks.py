"""Every code cell of the notebooks runs, in order, in one namespace."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, capsys):
    cells = json.loads(path.read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "first wrong (true): [None, None, 1, 2, 0, 3]" in out
    assert "first error (φ)   : [4 4 1 2 0 3]" in out
    residuals = {line.split()[0]: float(line.split()[3]) for line in out.splitlines()
                 if "residual =" in line}
    assert residuals["seq_mean_token_mean"] > 0.005 and residuals["token_mean"] == 0.0


def test_notebook_is_generated_from_its_script():
    from importlib import util

    spec = util.spec_from_file_location("make_walkthrough", NOTEBOOKS[0].with_name(
        "make_walkthrough.py"))
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cells = json.loads(NOTEBOOKS[0].read_text())["cells"]
    assert ["".join(c["source"]) for c in cells] == [src for _, src in module.CELLS]
