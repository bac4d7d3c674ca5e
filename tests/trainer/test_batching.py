"""trainer.batching.score_shared: rows every process holds (evaluation, second rounds) are
scored once in all, each process its share, and every process receives the whole; and
sharding.process_sum / process_max, which combine what each process took of its own rows."""

import numpy as np

from ibpo_jax.trainer import batching
from tests.trainer.multiprocess import script_in_two_processes

# Shared by the in-process test and the two-process script below.
_POOL = '''
import numpy as np


class CountingPool:
    """Reward 1 / -1 for text == answer; remembers which rows it was asked to score."""

    def __init__(self):
        self.seen = []

    def score(self, records, texts):
        self.seen += [r["id"] for r in records]
        ok = [t == r["answer"] for r, t in zip(records, texts)]
        return (np.array([1.0 if o else -1.0 for o in ok], np.float32),
                [{"correct": o} for o in ok])


def batch(n):
    records = [{"id": i, "answer": str(i)} for i in range(n)]
    return records, [str(i) if i % 3 else "wrong" for i in range(n)]
'''
_SCRIPT = _POOL + '''
import json
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import batching

sharding.initialize_distributed(True)
out = {}
for n in (7, 1, 0):
    pool = CountingPool()
    reward, correct = batching.score_shared(pool, *batch(n))
    out[n] = {"seen": pool.seen, "reward": reward.tolist(), "correct": correct.tolist(),
              "dtypes": [str(reward.dtype), str(correct.dtype)]}
import jax
out["sum"] = sharding.process_sum(np.array([jax.process_index() + 1, 10])).tolist()
known = np.full(4, -1)  # process 0 knows rows 0-1, process 1 rows 1-3 (row 1 held by both)
if jax.process_index() == 0:
    known[[0, 1]] = [5, 6]
else:
    known[[1, 2, 3]] = [6, -1, 2]
out["max"] = sharding.process_max(known).tolist()
print("RESULT " + json.dumps(out))
'''


def _namespace() -> dict:
    ns: dict = {}
    exec(_POOL, ns)  # noqa: S102 - the helpers above, also run by the subprocesses
    return ns


def _expected(n: int) -> tuple[list[float], list[bool]]:
    correct = [i % 3 != 0 for i in range(n)]
    return [1.0 if c else -1.0 for c in correct], correct


def test_one_process_scores_every_row_once():
    ns = _namespace()
    pool = ns["CountingPool"]()
    reward, correct = batching.score_shared(pool, *ns["batch"](7))
    assert pool.seen == list(range(7))
    assert (reward.tolist(), correct.tolist()) == _expected(7)
    assert reward.dtype == np.float32 and correct.dtype == bool


def test_two_processes_split_the_rows_and_both_get_every_score():
    """jax.distributed on one machine (CPU, one device a process): 7 rows split 3 / 4, a
    single row 0 / 1, none 0 / 0; the shares are disjoint and cover every row."""
    results = script_in_two_processes(_SCRIPT)
    assert [r["sum"] for r in results] == [[3, 20], [3, 20]]  # process_sum
    assert [r["max"] for r in results] == [[5, 6, -1, 2], [5, 6, -1, 2]]  # process_max
    for n, shares in ((7, ([0, 1, 2], [3, 4, 5, 6])), (1, ([], [0])), (0, ([], []))):
        assert [r[str(n)]["seen"] for r in results] == list(shares)
        for r in results:
            assert (r[str(n)]["reward"], r[str(n)]["correct"]) == _expected(n)
            assert r[str(n)]["dtypes"] == ["float32", "bool"]


def test_rows_are_decoded_scored_and_marked_ended_at_an_eos():
    """score_rows / score_all_rows: the verifier on the decoded responses (EOS dropped), and
    `ended` only where the last token within the length is an EOS."""
    from ibpo_jax.data.tokenizer import CharTokenizer

    tok, ns = CharTokenizer(), _namespace()
    eos, pad = tok.eos_id, tok.pad_id
    texts = ["0", "11", "wrong"]
    tokens = np.full((3, 6), pad, np.int32)
    for i, t in enumerate(texts):
        ids = tok.encode(t) + ([eos] if i != 1 else [])  # row 1 was cut before its EOS
        tokens[i, :len(ids)] = ids
    lengths = np.array([2, 2, 6], np.int32)
    records = [{"id": i, "answer": a} for i, a in enumerate(["0", "11", "2"])]
    reward, correct, ended, infos = batching.score_rows(ns["CountingPool"](), tok, records,
                                                        tokens, lengths)
    assert correct.tolist() == [True, True, False] and reward.tolist() == [1.0, 1.0, -1.0]
    assert ended.tolist() == [True, False, True] and [i["correct"] for i in infos] == [1, 1, 0]
    shared = batching.score_all_rows(ns["CountingPool"](), tok, records, tokens, lengths)
    assert [x.tolist() for x in shared] == [reward.tolist(), correct.tolist(), ended.tolist()]
    assert not batching.ended(tok, tokens[:1], np.array([0])).any()  # empty: not ended
