"""experiments/probes/gradient_probe.py: `variants`' section measures the seeds its command asked
for and reads every seed recorded (not as many as the item's runs have records)."""

import json

from experiments import items, items_registry
from experiments.probes import gradient_probe


def test_the_section_measures_the_asked_seeds_and_reads_every_recorded_one(tmp_path,
                                                                           monkeypatch):
    records = tmp_path / "runs"
    records.mkdir()
    for seed in (0, 1, 5):
        (records / f"gradient_probe_s{seed}.json").write_text(json.dumps({"seed": seed}))
    measured, shown = [], []
    monkeypatch.setattr(gradient_probe, "measure", lambda preset, extra, seed, batches, n:
                        measured.append(seed) or {"seed": seed})
    monkeypatch.setattr(gradient_probe, "section",
                        lambda recs, command: shown.extend(recs) or ["section"])

    def ctx(measure: bool) -> items.ProbeContext:  # the headline pair has 8 seeds recorded
        return items.ProbeContext(
            item=items_registry.ITEMS["variants"], task="arith", preset="arith_tiny", extra=(),
            seeds=8, asked=3, smoke=False, measure=measure, records_dir=records,
            runs_dir=tmp_path, out_dir=tmp_path, command="test")

    assert gradient_probe.section_of(ctx(measure=False)) == ["section"]
    assert measured == [] and [r["seed"] for r in shown] == [0, 1, 5]
    shown.clear()
    gradient_probe.section_of(ctx(measure=True))
    assert measured == [2]  # seeds 0..2 asked, 3..7 not measured
    assert [r["seed"] for r in shown] == [0, 1, 2, 5]
