"""Extra rounds of an RL step (trainer/rounds.py): prompt-count buckets, the slot layout, the
joined update rows and their credit."""

import numpy as np
import pytest

from ibpo_jax.trainer import rounds


@pytest.mark.parametrize("m, n, want", [(0, 64, 8), (1, 64, 8), (16, 64, 16), (17, 64, 24),
                                        (64, 64, 64), (3, 2, 3)])
def test_padded_count_rounds_up_to_a_few_shapes(m, n, want):
    assert rounds.padded_count(m, n) == want


def _sampled(m, width=5, r=3):
    prompt = np.arange(m * width, dtype=np.int32).reshape(m, width) + 10
    return rounds.Sampled(prompt, np.full(m, 4, np.int32), np.full((m, r), 7, np.int32),
                          np.arange(1, m + 1, dtype=np.int32), np.full((m, r), -0.5, np.float32),
                          0)


def test_slot_arrays_put_each_result_at_its_row_and_leave_the_rest_invalid():
    got = _sampled(2)
    out = rounds.slot_arrays(6, np.array([4, 1]), got, np.array([1.0, -1.0]),
                             np.array([True, False]), np.array([True, True]), pad_id=0)
    np.testing.assert_array_equal(out["valid"], [0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(out["prompt"][4], got.prompt[0])
    np.testing.assert_array_equal(out["prompt"][1], got.prompt[1])
    np.testing.assert_array_equal(out["response_len"], [0, 2, 0, 0, 1, 0])
    np.testing.assert_array_equal(out["reward"], [0, -1, 0, 0, 1, 0])
    np.testing.assert_array_equal(out["correct"], [0, 0, 0, 0, 1, 0])
    invalid = ~out["valid"]
    assert (out["prompt_len"][invalid] == 1).all() and (out["prompt"][invalid] == 0).all()
    assert (out["sample_logp"][invalid] == 0).all()


def test_joined_rows_left_pad_the_first_round_prompts_to_the_second_round_width():
    import jax

    from ibpo_jax.runtime import sharding

    n, r = 4, 3
    first = rounds.FirstRound(
        records=[{}], prompt=np.array([[0, 5, 6]] * n, np.int32), prompt_len=np.full(n, 2),
        response=np.ones((n, r), np.int32), response_len=np.full(n, 3),
        sample_logp=np.zeros((n, r), np.float32), reward=np.array([1, -1, -1, 1], np.float32),
        correct=np.array([1, 0, 0, 1], bool), ended=np.ones(n, bool), texts=[""] * n)
    second = rounds.slot_arrays(n, np.array([1, 2]), _sampled(2), np.zeros(2), np.zeros(2, bool),
                                np.ones(2, bool), pad_id=0)
    mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
    out = rounds.joined(first, second, mesh, pad_id=0, kl_anchor=np.arange(2 * n))
    prompt = np.asarray(out.prompt)
    assert prompt.shape == (2 * n, 5)
    np.testing.assert_array_equal(prompt[0], [0, 0, 0, 5, 6])  # left padding keeps the end
    np.testing.assert_array_equal(prompt[n + 1], second["prompt"][1])
    np.testing.assert_array_equal(np.asarray(out.valid), [1, 1, 1, 1, 0, 1, 1, 0])
    np.testing.assert_array_equal(np.asarray(out.kl_anchor), np.arange(8))
    assert isinstance(out.reward, jax.Array)


def test_joined_credit_appends_the_second_round_and_can_zero_the_first_advantages():
    import jax.numpy as jnp

    from ibpo_jax.trainer.credit import Credit

    def cred(base):  # B = 1 group of G = 2 rows
        return Credit(phi=jnp.full((1, 2), base), first_error=jnp.full((1, 2), 1, jnp.int32),
                      shaped=jnp.full((1, 2), base + 1), adv=jnp.array([base, -base]))

    out = rounds.joined_credit(cred(0.5), cred(2.0))
    np.testing.assert_array_equal(np.asarray(out.adv), [0.5, -0.5, 2.0, -2.0])
    np.testing.assert_array_equal(np.asarray(out.phi), [[0.5, 0.5], [2.0, 2.0]])
    out = rounds.joined_credit(cred(0.5), cred(2.0), train_first=False)
    np.testing.assert_array_equal(np.asarray(out.adv), [0.0, 0.0, 2.0, -2.0])
    np.testing.assert_array_equal(np.asarray(out.shaped), [[1.5, 1.5], [3.0, 3.0]])  # kept


class _Recorder:
    """A sampler stand-in: response row i is [i + 1] * 3, length i % 3 + 1; records prompts."""

    def __call__(self, params, tokens, lengths, key):
        from ibpo_jax.sampler.sampling import SampleOutput

        self.tokens, n = tokens, len(tokens)
        resp = np.repeat(np.arange(1, n + 1, dtype=np.int32)[:, None], 3, 1)
        return SampleOutput(resp, np.arange(n, dtype=np.int32) % 3 + 1,
                            np.full((n, 3), -0.25, np.float32))


def test_sample_pads_the_prompt_count_to_a_bucket_and_keeps_the_real_rows():
    import jax

    from ibpo_jax.data.tokenizer import CharTokenizer
    from ibpo_jax.runtime import sharding

    tok, gen = CharTokenizer(), _Recorder()
    mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
    texts = ["1+2", "3*4", "5-6"]
    got = rounds.sample(gen, None, tok, texts, width=6, key=None, n=32, mesh=mesh,
                        response_width=3)
    assert gen.tokens.shape == (4, 6)  # 3 prompts padded to the bucket of 32 / 8 = 4
    np.testing.assert_array_equal(gen.tokens[3], gen.tokens[0])  # copies of the first
    assert got.prompt.shape == (3, 6) and got.response.shape == (3, 3)
    np.testing.assert_array_equal(got.response_len, [1, 2, 3])
    assert list(got.prompt_len) == [len(tok.encode(t)) + (tok.bos_id is not None) for t in texts]
    empty = rounds.sample(gen, None, tok, [], width=6, key=None, n=32, mesh=mesh,
                          response_width=5)
    assert empty.prompt.shape == (0, 6) and empty.response.shape == (0, 5)
