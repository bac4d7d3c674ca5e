"""--print-config: every field of the resolved config, with its documentation."""

import dataclasses
import subprocess
import sys

from ibpo_jax import config, config_docs


def _leaves(section, prefix=""):
    for f in dataclasses.fields(section):
        v = getattr(section, f.name)
        yield from (_leaves(v, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v)
                    else [f"{prefix}{f.name}"])


def test_every_key_printed_once_with_its_overridden_value():
    cfg = config.load("configs/ibpo_gspo.py:smoke", [("ibpo.lam", "0.3")])
    out = config_docs.lines(cfg)
    keys = [line.split(" = ")[0] for line in out]
    assert keys == list(_leaves(cfg))
    assert any(line.startswith("ibpo.lam = 0.3 ") for line in out)


def test_field_docs_read_from_the_section_source():
    docs = config_docs.field_docs(config.OptimConfig)
    assert "lr" in docs and docs["lr"]  # every optimizer knob is documented
    documented = sum("  # " in line for line in config_docs.lines(config.RunConfig()))
    assert documented >= 0.8 * len(list(_leaves(config.RunConfig())))


def test_cli_prints_and_exits_without_starting_a_run(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ibpo_jax.train", "--print-config",
                        "--config=configs/gspo.py:arith_long", f"--workdir={tmp_path}/w"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert 'algo = "gspo"' in r.stdout and "task.arith.num_steps = 8" in r.stdout
    assert not (tmp_path / "w").exists()
