"""Monte-Carlo step labels of the PRM (methods/prm/labels.py, DESIGN §7): a scripted sampler and
judge with hand-computed labels, then the real sampler on a tiny random model."""

import jax
import numpy as np
import pytest

from ibpo_jax.methods.prm import labels as prm_labels
from ibpo_jax.sampler import sampling
from tests.methods.test_prm_model import ARCH, OPTIONS, TOK, tiny_params

PAD, EOS, NL, BAD, WRONG_END = 0, 2, 3, 13, 11
IS_DELIM = np.zeros(16, bool)
IS_DELIM[NL] = True
N = 3  # completions per prefix


def _batch(rows, p, r):
    """(prompt tokens, response tokens) -> left-padded prompt [n, p], response [n, r] (junk 9
    after each length) and lengths."""
    prompt, response = np.full((len(rows), p), PAD), np.full((len(rows), r), 9)
    plen, rlen = np.zeros(len(rows), np.int32), np.zeros(len(rows), np.int32)
    for i, (q, a) in enumerate(rows):
        prompt[i, p - len(q):], response[i, :len(a)] = q, a
        plen[i], rlen[i] = len(q), len(a)
    return prompt.astype(np.int32), plen, response.astype(np.int32), rlen


class ScriptedSampler:
    """Completion s of every prompt is [10 + s, EOS]; records the prompts it is given."""

    def __init__(self):
        self.calls = []

    def __call__(self, params, prompts, prompt_lens, rng):
        self.calls.append((np.array(prompts), np.array(prompt_lens)))
        b = len(prompts)
        tokens = np.full((b * N, 4), PAD, np.int32)
        tokens[:, 0], tokens[:, 1] = np.tile(10 + np.arange(N), b), EOS
        return sampling.SampleOutput(tokens, np.full(b * N, 2, np.int32), np.zeros((b * N, 4)))


class Judge:
    """Correct = no BAD token and the last token before EOS is not WRONG_END."""

    def __init__(self):
        self.seen = []

    def __call__(self, rows, tokens, lengths):
        out = []
        for row, t, n in zip(rows, tokens, lengths):
            assert (t[n:] == PAD).all()  # pad after every length
            self.seen.append((int(row), t[:n].tolist()))
            body = t[:n][:-1] if n and t[n - 1] == EOS else t[:n]
            out.append(BAD not in body and (not len(body) or body[-1] != WRONG_END))
        return np.array(out)


def test_labels_by_hand():
    rows = [([5, 6], [5, NL, 6, NL, 7, EOS]),  # 2 sampled prefixes, then the response: right
            ([5], [5, NL, BAD, NL, 7, EOS]),  # the 2nd prefix holds an error: label 0
            ([5, 6, 7], [5, 6, 7, 8, NL, 9, EOS]),  # 1st prefix: 3 + 5 > 7 columns, dropped
            ([5], []),  # empty: no step
            ([5], [5, NL, WRONG_END]),  # truncated (no EOS): its last token ends a step
            ([5], [5, NL, 6, NL, 7, NL, 8, EOS])]  # 4 steps, the first 3 kept: all sampled
    prompt, plen, resp, rlen = _batch(rows, p=4, r=8)
    sampler, judge = ScriptedSampler(), Judge()
    out = prm_labels.monte_carlo_labels(
        generate=sampler, params=None, prompt=prompt, prompt_len=plen, response=resp,
        response_len=rlen, is_delim=IS_DELIM, judge=judge, num_completions=N, max_steps=3,
        max_prompt_len=7, pad_id=PAD, key=jax.random.key(0), chunk=3)
    t = 2 / 3  # completions 10 and 12 are right, 11 is WRONG_END
    np.testing.assert_allclose(out.labels, [[t, t, 1], [t, 0, 0], [0, 1, 0], [0, 0, 0],
                                            [t, 0, 0], [t, t, t]], rtol=1e-6)
    np.testing.assert_array_equal(out.valid, [[1, 1, 1], [1, 1, 1], [0, 1, 0], [0, 0, 0],
                                              [1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(np.where(out.valid, out.pos, -1),
                                  [[1, 3, 5], [1, 3, 5], [-1, 6, -1], [-1, -1, -1],
                                   [1, 2, -1], [1, 3, 5]])
    assert out.cost == N * 8 and out.dropped == 1
    # 8 prefixes in chunks of 3: every call sees 3 prompts of width 7 (the last padded).
    assert [c[0].shape for c in sampler.calls] == [(3, 7)] * 3
    np.testing.assert_array_equal(sampler.calls[0][0], [[0, 0, 0, 5, 6, 5, NL],
                                                        [0, 5, 6, 5, NL, 6, NL],
                                                        [0, 0, 0, 0, 5, 5, NL]])
    np.testing.assert_array_equal(sampler.calls[0][1], [4, 6, 3])
    np.testing.assert_array_equal(sampler.calls[2][0], [[0, 0, 5, 5, NL, 6, NL],
                                                        [5, 5, NL, 6, NL, 7, NL],
                                                        [0, 0, 5, 5, NL, 6, NL]])
    # The judge saw the 4 responses whose last step was kept, and every prefix + completion
    # (none of the padding prefix's).
    assert (1, [5, NL, BAD, NL, 11, EOS]) in judge.seen
    assert (4, [5, NL, WRONG_END]) in judge.seen
    assert len(judge.seen) == 4 + N * 8


def _arith_rows():
    q = "Start with 2. Add 2.\n"
    rows = [(q, "2+2=4\nAnswer: 4"), (q, "2+2=5\nAnswer: 5"), (q, "2+2=4\n")]
    return _batch([(TOK.encode(a), TOK.encode(b) + [TOK.eos_id]) for a, b in rows], p=24, r=16)


def test_real_sampler_shapes_budget_and_determinism():
    params = tiny_params()
    generate = sampling.generate_fn(ARCH, OPTIONS, max_new_tokens=6, eos_ids=TOK.eos_ids,
                                    num_samples=2, pad_id=TOK.pad_id)
    prompt, plen, resp, rlen = _arith_rows()

    def judge(rows, tokens, lengths):
        return np.array([TOK.decode(t[:n]).endswith("Answer: 4") for t, n in zip(tokens, lengths)])

    def run(key):
        return prm_labels.monte_carlo_labels(
            generate=generate, params=params, prompt=prompt, prompt_len=plen, response=resp,
            response_len=rlen, is_delim=TOK.is_delim, judge=judge, num_completions=2,
            max_steps=4, max_prompt_len=32, pad_id=TOK.pad_id, key=key, chunk=4)

    out = run(jax.random.key(0))
    assert out.labels.shape == out.valid.shape == out.pos.shape == (3, 4)
    assert out.labels.dtype == np.float32
    assert ((out.labels >= 0) & (out.labels <= 1)).all()
    # Steps: 2, 2, and "2+2=4\n" then EOS alone: 2 (the last one the whole response).
    np.testing.assert_array_equal(out.valid.sum(axis=1), [2, 2, 2])
    last = out.valid.sum(axis=1) - 1
    np.testing.assert_array_equal(out.labels[np.arange(3), last], [1.0, 0.0, 0.0])
    assert out.dropped == 0 and out.cost == 2 * 3  # one non-final prefix per response
    again = run(jax.random.key(0))
    np.testing.assert_array_equal(again.labels, out.labels)
    assert again.cost == out.cost


@pytest.mark.parametrize("bad", [dict(num_completions=0), dict(chunk=0)])
def test_rejects_bad_sizes(bad):
    prompt, plen, resp, rlen = _batch([([5], [5, EOS])], p=2, r=2)
    kwargs = dict(generate=ScriptedSampler(), params=None, prompt=prompt, prompt_len=plen,
                  response=resp, response_len=rlen, is_delim=IS_DELIM, judge=Judge(),
                  num_completions=N, max_steps=2, max_prompt_len=4, pad_id=PAD,
                  key=jax.random.key(0)) | bad
    with pytest.raises(ValueError):
        prm_labels.monte_carlo_labels(**kwargs)
