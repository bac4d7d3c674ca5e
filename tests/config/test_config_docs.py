"""--print-config: every field of the resolved config, with its documentation."""

import dataclasses
import subprocess
import sys

from ibpo_jax import config
from ibpo_jax.config import docs as config_docs


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


def test_the_resolved_config_is_printed_with_the_methods_sections():
    """After preset and overrides, with the defaults a section resolves (the loss's clip range)
    and the sections that live beside their methods (ibpo_jax/methods/), documented."""
    cfg = config.load("configs/score_grpo.py:smoke", [("prm.samples", "3")])
    out = {line.split(" = ")[0]: line for line in config_docs.lines(cfg)}
    assert out["loss.clip_eps_low"].startswith("loss.clip_eps_low = 0.2 ")  # GRPO's, not "auto"
    assert out["score.enabled"].startswith("score.enabled = true ")
    assert out["score.stage1_steps"].startswith("score.stage1_steps = 2 ")  # the smoke preset
    assert out["prm.samples"].startswith("prm.samples = 3 ")  # the override
    for key in ("score.enabled", "score.alpha", "prm.weight", "prm.head_width"):
        assert "  # " in out[key], key  # each with its documentation

