"""trainer.evaluation.evaluate: avg@k / pass@k over chunks, and its progress bar (problems
done, ETA, running accuracy), off unless asked."""

import types

import numpy as np
import pytest

from ibpo_jax.data.tokenizer import CharTokenizer
from ibpo_jax.trainer import evaluation

TOK = CharTokenizer()


class Task:
    def prompt_text(self, record):
        return f"q{record['id']}"


class Pool:
    """A response is correct when it spells the record's answer."""

    def score(self, records, texts):
        ok = [t == r["answer"] for r, t in zip(records, texts)]
        return np.array(ok, np.float32), [{"correct": c} for c in ok]


def generate(params, tokens, lengths, key):
    """Row i of a chunk answers "1" when its prompt is q<even>, else "2" (samples = 2)."""
    rows = []
    for prompt in tokens:
        text = TOK.decode([t for t in prompt.tolist() if t not in (TOK.pad_id, TOK.bos_id)])
        answer = "1" if int(text[1:]) % 2 == 0 else "2"
        rows += [TOK.encode(answer) + [TOK.eos_id]] * 2
    return types.SimpleNamespace(tokens=np.array(rows, np.int32),
                                 lengths=np.full(len(rows), 2, np.int32))


RECORDS = [{"id": i, "answer": "1"} for i in range(5)]  # 0, 2, 4 correct: 3 of 5


def _evaluate(**kw):
    return evaluation.evaluate(generate, None, records=RECORDS, task=Task(), tokenizer=TOK,
                               pool=Pool(), samples=2, chunk=2, max_prompt_len=8, **kw)


def test_accuracy_over_chunks_with_a_padded_last_one(capsys):
    out = _evaluate()
    assert out["eval_accuracy"] == pytest.approx(0.6)
    assert out["eval_pass_at_2"] == pytest.approx(0.6)
    assert capsys.readouterr().err == ""  # no bar unless asked


def test_progress_bar_counts_problems_with_the_running_accuracy(capsys):
    _evaluate(progress=True, desc="math500/test", leave=True)
    err = capsys.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith("math500/test: 100%") and "5/5" in final
    assert "acc=0.600" in final and ("problem/s" in final or "s/problem" in final)
    # The running accuracy after the first chunk (problems 0, 1: one right) was shown too.
    assert "2/5" in err and "acc=0.500" in err


class CheckerPool(Pool):
    """Pool whose checker reports a wrong response's first wrong step (as arith's does)."""

    def score(self, records, texts):
        reward, infos = super().score(records, texts)
        return reward, [{**i, "first_wrong_step": None if i["correct"] else 3} for i in infos]


def test_shown_samples_are_the_first_sample_of_the_first_problems_across_chunks():
    shown = []
    out = evaluation.evaluate(generate, None, records=RECORDS, task=Task(), tokenizer=TOK,
                              pool=CheckerPool(), samples=2, chunk=2, max_prompt_len=8,
                              shown=(3, shown))
    assert out["eval_accuracy"] == pytest.approx(0.6)  # showing changes nothing measured
    assert [(r["prompt"], r["response"], r["correct"]) for r in shown] == [
        ("q0", "1", True), ("q1", "2", False), ("q2", "1", True)]  # 3 spans two chunks
    assert [r["reward"] for r in shown] == [1.0, 0.0, 1.0]
    assert [r.get("first_wrong_step") for r in shown] == [None, 3, None]  # wrong ones only
