"""Every code cell of the notebooks runs, in order, in one namespace."""

import json
from pathlib import Path

import pytest

HERE = Path(__file__).parents[1] / "notebooks"
NOTEBOOKS = [HERE / "ibpo_walkthrough.ipynb"]


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


def test_appendix_a_notebook_on_smoke_runs(tmp_path, monkeypatch, smoke_data_dir):
    """notebooks/make_appendix_a.py --smoke: two smoke runs with the diagnostics every step,
    then the notebook executed on them, every figure rendered and the verdict printed."""
    from importlib import util

    import nbformat

    monkeypatch.setenv("IBPO_DATA_DIR", str(smoke_data_dir))
    spec = util.spec_from_file_location("make_appendix_a", HERE / "make_appendix_a.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--smoke", "--out", str(tmp_path)])
    nb = nbformat.read(tmp_path / "appendix_a.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not any(o.get("output_type") == "error" for o in c.outputs) for c in code)
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4
    text = "".join(o.get("text", "") for c in code for o in c.outputs)
    assert "claim (i)" in text and "claim (ii)" in text and "| (ii) PG variance" in text
    for name in ("appendix_a_pg_variance.png", "appendix_a_cov.png"):
        assert (tmp_path / name).stat().st_size > 1000
    # The trainer logs where the update's gradient goes at each diagnostic step (issue 16).
    rows = [json.loads(line) for run in (tmp_path / "runs").glob("smoke_s*")
            for line in (run / "metrics.jsonl").read_text().splitlines()]
    shares = [r["grad_share_before_error"] for r in rows if "grad_share_before_error" in r]
    assert shares and all(0 <= v <= 1 for v in shares)
    # The committed notebook is this generator's, with its outputs.
    committed = nbformat.read(HERE / "appendix_a.ipynb", as_version=4)
    assert [c.source for c in committed.cells] == [src for _, src in module.CELLS]
    assert any(c.outputs for c in committed.cells if c.cell_type == "code")


def test_appendix_a_export_keeps_the_notebooks_keys_up_to_the_cut(tmp_path):
    """--export copies a run compactly to ROWS/<task>/<run>/, its steps <= --until only."""
    from importlib import util

    spec = util.spec_from_file_location("make_appendix_a", HERE / "make_appendix_a.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = tmp_path / "reproduce" / "arith_long" / "ibpo_gspo_s0"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"seed": 0}')
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "pg_var": 0.1 * s, "tokens_per_s": 9.0}) + "\n"
        for s in (1, 20, 40)))
    (run / "appendix_a.jsonl").write_text("".join(
        json.dumps({"step": s, "phi": [0.5]}) + "\n" for s in (1, 20, 40)))
    module.export([run], tmp_path / "rows", until=20)
    out = tmp_path / "rows" / "arith_long" / "ibpo_gspo_s0"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "pg_var": 0.1}, {"step": 20, "pg_var": 2.0}]
    recs = [json.loads(line) for line in (out / "appendix_a.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 20]
    assert (out / "config.json").read_text() == '{"seed": 0}'
