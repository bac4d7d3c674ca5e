"""The rollout knobs of issue 45 end to end on the `smoke` preset (IBPO-GSPO): dynamic sampling
with DAPO's soft overlong penalty, run on one device, then on a (2, 2, 2) mesh of 8 fake CPU
devices (same metrics up to float rounding), then killed after its step-2 checkpoint and
resumed (the same metrics, bitwise: the extra rounds' keys and the data position)."""

import pytest

from tests.trainer.knob_harness import SMOKE_EXACT, run_match_mesh_resume, smoke_cfg

KNOBS = {"rollout.dynamic_sampling": True, "rollout.max_sampling_rounds": 2,
         "reward.overlong": "soft", "reward.overlong_buffer": 16,
         "diagnostics.grad_var_every": 2}  # pg_var over the live groups, on the mesh too
COUNTS = ("groups_filtered", "sampling_rounds", "trajectories_sampled", "groups_mixed",
          "tokens_sampled")


@pytest.mark.usefixtures("one_device")
def test_dynamic_sampling_and_soft_overlong_match_the_mesh_and_resume_bitwise(smoke_data_dir,
                                                                              tmp_path):
    ref = run_match_mesh_resume(smoke_data_dir, tmp_path, KNOBS, exact=SMOKE_EXACT + COUNTS)
    b, g = 4, 4
    longest = smoke_cfg(smoke_data_dir, KNOBS).rollout.max_new_tokens
    for prev, row in zip(ref, ref[1:]):
        rounds = row["sampling_rounds"]
        assert 1 <= rounds <= 2 and row["trajectories_sampled"] == rounds * b * g
        # Throughput counts every round's tokens, the dropped groups' included.
        assert 0 < row["tokens_sampled"] <= rounds * b * g * longest
        # Every sampled trajectory is in the budget, the dropped groups' included.
        assert row["budget_trajectories"] - prev["budget_trajectories"] == rounds * b * g
        assert row["groups_mixed"] == min(b, rounds * b - row["groups_filtered"])
        # One more round only when the first fell short of B mixed groups.
        assert (rounds == 2) == (row["groups_filtered"] > 0)
        assert -1.0 <= row["overlong_penalty_mean"] <= 0.0
        assert 0.0 <= row["frac_truncated"] <= 1.0
    assert any(r["sampling_rounds"] == 2 for r in ref[1:])  # the smoke base: ~half all-same
    # The batch metrics describe the trained groups only, every one of them mixed: the
    # fillers of a step short of B are left out (they are counted in groups_filtered).
    for row in ref[1:]:
        assert row["frac_groups_all_same"] == 0.0


@pytest.mark.usefixtures("one_device")
def test_slot_refill_trains_on_the_samples_of_one_call_over_all_prompts(smoke_data_dir,
                                                                        tmp_path,
                                                                        plain_smoke_rows):
    """rollout.refill with 2 of the 4 prompts' rows in slots: the samples of the plain run
    (one call over every prompt, the same key), so the same tokens every step (a chunked
    call without refill draws other uniforms), and the same updates (on-policy, one update a
    step: the sampler's log-probs are not read)."""
    from ibpo_jax.trainer import loop

    rows = loop.run(smoke_cfg(smoke_data_dir, {"rollout.refill": True, "rollout.sample_chunk": 2,
                                               "mesh.data": 1}), workdir=tmp_path)
    assert len(rows) == len(plain_smoke_rows) == 5
    for got, want in zip(rows, plain_smoke_rows):
        assert {k: got[k] for k in SMOKE_EXACT if k in want} == \
            {k: want[k] for k in SMOKE_EXACT if k in want}
        assert got.get("logprob_mismatch", 0.0) == pytest.approx(
            want.get("logprob_mismatch", 0.0), abs=1e-5)
