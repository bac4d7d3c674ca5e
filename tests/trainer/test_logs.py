"""trainer.logs: grouped TensorBoard tags (read back from the event file), the logging backends
and their config, evaluation samples in samples.jsonl and as text, the truncation warning."""

import importlib.util
import json
import struct
import sys

import pytest
from tensorboardX.proto import event_pb2

from ibpo_jax import config
from ibpo_jax.trainer import logs

GROUPS = ("train", "eval", "credit", "appendix_a", "time")
ROW = {"reward_mean": 0.5, "accuracy": 0.25, "kl": 0.01, "prompts_truncated": 0,
       "phi_mean": 3.0, "adv_mass_before_error": 0.4, "first_error_agreement": 0.9,
       "cov_y_phi": 0.2, "lambda_max": 1.5, "adv_var": 0.3, "pg_var_ratio": 0.8,
       "eval_accuracy": 0.7, "eval_pass_at_4": 0.9, "time_rollout_s": 1.0, "tokens_per_s": 99.0,
       "time_pg_var_s": 0.5, "note": "strings are not scalars"}
SAMPLES = [{"prompt": "2+3=", "response": "5", "reward": 1.0, "correct": True},
           {"prompt": "7-4=", "response": "2\nso 2", "reward": 0.0, "correct": False,
            "first_wrong_step": 0}]


def read_events(workdir):
    """(tag, step, kind) of every summary value in the run's TensorBoard event files, read
    from their TFRecord framing (u64 length, u32 crc, payload, u32 crc)."""
    out = []
    for path in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos: pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12: pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                out.append((v.tag, event.step, v.WhichOneof("value")))
    return out


def _log(tmp_path, last_step=-1, **kw):
    return logs.RunLog(tmp_path, total_steps=10, last_step=last_step, progress=False, **kw)


@pytest.mark.parametrize("key, group", [
    ("eval_accuracy", "eval"), ("eval_pass_at_4", "eval"), ("time_update_s", "time"),
    ("tokens_per_s", "time"), ("cov_y_phi", "appendix_a"), ("adv_var_gspo", "appendix_a"),
    ("pg_noise_ratio_gspo", "appendix_a"), ("grad_share_before_error", "appendix_a"),
    ("phi_mean", "credit"), ("adv_sign_flip_frac", "credit"), ("cancellation_residual", "credit"),
    ("first_error_agreement", "credit"), ("kl", "train"), ("prompts_truncated", "train")])
def test_tag_groups_keys(key, group):
    assert logs.tag(key) == f"{group}/{key}"  # the key itself stays: grep-able in both


def test_event_file_holds_grouped_scalars_and_sample_text_while_jsonl_keys_stay_flat(tmp_path):
    log = _log(tmp_path)
    log.write(0, ROW)
    log.samples(0, "arith", SAMPLES)
    log.close()
    events = read_events(tmp_path)
    scalars = {tag for tag, step, kind in events if kind == "simple_value" and step == 0}
    assert scalars == {logs.tag(k) for k in ROW if k != "note"}
    assert {t.split("/")[0] for t in scalars} == set(GROUPS)  # every group used, no other
    texts = [tag for tag, _, kind in events if kind == "tensor"]
    assert texts and all(t.startswith("samples/arith") for t in texts)
    row = logs.read_metrics(tmp_path / "metrics.jsonl")[0]
    assert set(row) == {"step", *ROW}  # metrics.jsonl: the flat keys the reproduction reads


def test_samples_go_to_samples_jsonl_and_a_resume_drops_the_killed_runs(tmp_path):
    log = _log(tmp_path)
    log.samples(0, "arith", SAMPLES)
    log.samples(4, "arith", SAMPLES[:1])
    log.close()
    rows = logs.read_metrics(tmp_path / "samples.jsonl")
    assert [(r["step"], r["benchmark"], r["correct"]) for r in rows] == [
        (0, "arith", True), (0, "arith", False), (4, "arith", True)]
    assert rows[1]["first_wrong_step"] == 0 and rows[1]["response"] == "2\nso 2"
    _log(tmp_path, last_step=2).close()  # resumed from a step-2 checkpoint
    assert [r["step"] for r in logs.read_metrics(tmp_path / "samples.jsonl")] == [0, 0]


def test_sample_text_shows_each_sample_verbatim_with_its_verdict():
    text = logs.sample_text(SAMPLES)
    assert "**sample 0**: reward 1, correct" in text
    assert "**sample 1**: reward 0, wrong, first wrong step 0" in text
    assert "    7-4=2\n    so 2" in text  # indented: a code block, every line


def test_truncation_warning_appears_once_with_the_count_and_the_key(tmp_path, capsys):
    log = _log(tmp_path, max_prompt_len=64)
    log.write(1, {"prompts_truncated": 0})
    assert "max_prompt_len" not in capsys.readouterr().err
    log.write(2, {"prompts_truncated": 3})
    log.write(3, {"prompts_truncated": 5})
    log.close()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "max_prompt_len" in ln]
    assert len(lines) == 1
    assert "3 prompt(s) of step 2" in lines[0]
    assert "config.rollout.max_prompt_len=64" in lines[0]


def test_jsonl_only_writes_no_event_files(tmp_path):
    log = _log(tmp_path, backends=("jsonl",))
    log.write(0, ROW)
    log.close()
    assert not (tmp_path / "tensorboard").exists()
    assert logs.read_metrics(tmp_path / "metrics.jsonl")[0]["kl"] == ROW["kl"]


def test_backends_key_parses_and_names_a_bad_value():
    cfg = config.load("configs/ibpo_gspo.py:smoke", [("logging.backends", " jsonl ,tensorboard")])
    assert cfg.logging.names() == ("jsonl", "tensorboard")
    assert config.RunConfig().logging.names() == ("tensorboard", "jsonl")
    for value, problem in [("jsonl,neptune", "unknown backend 'neptune'; valid: jsonl, "
                                             "tensorboard, wandb"),
                           ("tensorboard", "must include jsonl"),
                           ("jsonl,jsonl", "a backend is repeated")]:
        with pytest.raises(config.ConfigError, match=problem) as e:
            config.load("configs/ibpo_gspo.py:smoke", [("logging.backends", value)])
        assert str(e.value).startswith(f"config.logging.backends={value!r}")
    with pytest.raises(config.ConfigError, match="config.logging.samples=-1"):
        config.load("configs/ibpo_gspo.py:smoke", [("logging.samples", "-1")])


def test_wandb_without_the_package_fails_in_one_line_naming_the_extra(monkeypatch, tmp_path):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else find(name, *a))
    with pytest.raises(config.ConfigError) as e:
        config.load("configs/ibpo_gspo.py:smoke", [("logging.backends", "tensorboard,jsonl,wandb")])
    assert "pip install 'ibpo-jax[wandb]'" in str(e.value) and "\n" not in str(e.value)
    # The log itself refuses too (a config built elsewhere), before touching the workdir.
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 5}) + "\n")
    with pytest.raises(logs.LoggingBackendError, match=r"pip install 'ibpo-jax\[wandb\]'"):
        _log(tmp_path, last_step=1, backends=("jsonl", "wandb"))
    assert logs.read_metrics(tmp_path / "metrics.jsonl") == [{"step": 5}]  # not truncated
