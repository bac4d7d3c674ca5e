"""experiments/refill.py: a record gains the kept keys it lacks from its own run's log, and
nothing else; a workdir that is not the record's run is refused."""

import json

from experiments import refill

CONFIG = {"algo": "gspo", "seed": 3}
LOG = [{"step": 0, "eval_accuracy": 0.5, "time_total_s": 1.0},
       {"step": 10, "reward_mean": 0.25, "frac_groups_all_same": 0.5, "kl": 0.1},
       {"step": 20, "reward_mean": 0.5, "frac_groups_all_same": 0.375, "eval_accuracy": 0.625}]


def _setup(tmp_path, *, config=CONFIG, log=LOG):
    records, runs = tmp_path / "records" / "arith", tmp_path / "runs"
    records.mkdir(parents=True)
    workdir = runs / "gspo_s3"
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(config))
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log)
                                           + '{"step": 30, "rew')  # a torn last line
    record = {"config": CONFIG, "commit": "abc", "cpu": "x",
              "rows": [{"step": 0, "eval_accuracy": 0.5}, {"step": 20, "reward_mean": 0.5,
                                                           "eval_accuracy": 0.625}]}
    (records / "gspo_s3.json").write_text(json.dumps(record))
    return records / "gspo_s3.json", runs, record


def test_adds_only_missing_kept_keys_at_the_records_steps(tmp_path):
    path, runs, record = _setup(tmp_path)
    assert refill.main(["--task", "arith", "--records", str(tmp_path / "records"),
                        str(runs)]) == 0
    new = json.loads(path.read_text())
    # frac_groups_all_same (recipe's metric) and time_total_s are kept, kl is not; step 10 is
    # not in the record.
    assert new["rows"] == [{"step": 0, "eval_accuracy": 0.5, "time_total_s": 1.0},
                           {"step": 20, "reward_mean": 0.5, "eval_accuracy": 0.625,
                            "frac_groups_all_same": 0.375}]
    assert {k: v for k, v in new.items() if k != "rows"} == {
        k: v for k, v in record.items() if k != "rows"}


def test_refuses_a_workdir_of_another_run(tmp_path, capsys):
    path, runs, record = _setup(tmp_path, config={**CONFIG, "seed": 4})
    refill.main(["--task", "arith", "--records", str(tmp_path / "records"), str(runs)])
    assert json.loads(path.read_text()) == record
    assert "is not the record's config" in capsys.readouterr().err
    changed = [dict(LOG[0]), LOG[1], {**LOG[2], "reward_mean": 0.75}]
    path, runs, record = _setup(tmp_path / "b", log=changed)
    refill.main(["--task", "arith", "--records", str(tmp_path / "b" / "records"), str(runs)])
    assert json.loads(path.read_text()) == record
    assert "differs from the record at step 20" in capsys.readouterr().err


def test_a_log_that_does_not_read_is_named_not_raised(tmp_path, capsys):
    path, runs, record = _setup(tmp_path)
    (runs / "gspo_s3" / "config.json").write_text("{not json")
    assert refill.main(["--task", "arith", "--records", str(tmp_path / "records"),
                        str(runs)]) == 0
    assert json.loads(path.read_text()) == record
    assert "does not read" in capsys.readouterr().err
    # A damaged line before the last: named, the record kept.
    (runs / "gspo_s3" / "config.json").write_text(json.dumps(CONFIG))
    (runs / "gspo_s3" / "metrics.jsonl").write_text('{"step": 0\n' + json.dumps(LOG[2]) + "\n")
    refill.main(["--task", "arith", "--records", str(tmp_path / "records"), str(runs)])
    assert json.loads(path.read_text()) == record
    assert "metrics.jsonl:1: unreadable" in capsys.readouterr().err
