"""CharTokenizer: round trips, special ids, the newline delimiter table, clear errors."""

import pickle

import numpy as np
import pytest

from ibpo_jax.data import arith
from ibpo_jax.data.tokenizer import CharTokenizer

TOK = CharTokenizer()


def test_round_trip_of_arith_texts():
    for record in arith.generate(arith.LADDER["level5"], 0, 20):
        for text in (arith.prompt_text(record), record["reference"]):
            ids = TOK.encode(text)
            assert len(ids) == len(text)
            assert TOK.decode(ids) == text


def test_specials_and_protocol_fields():
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id, TOK.eos_ids) == (0, 1, 2, (2,))
    assert TOK.decode([TOK.bos_id, *TOK.encode("1+1=2"), TOK.eos_id, TOK.pad_id]) == "1+1=2"
    assert TOK.vocab_size == len(set(TOK.encode("".join(TOK._itos[3:])))) + 3
    assert pickle.loads(pickle.dumps(TOK)).encode("Answer: 7") == TOK.encode("Answer: 7")


def test_is_delim_marks_exactly_newline():
    assert TOK.is_delim.dtype == np.bool_ and TOK.is_delim.shape == (TOK.vocab_size,)
    assert np.flatnonzero(TOK.is_delim).tolist() == TOK.encode("\n")
    with pytest.raises(ValueError):
        TOK.is_delim[0] = True  # shared table is read-only


def test_errors_name_the_culprit():
    with pytest.raises(ValueError, match=r"'é' at position 3"):
        TOK.encode("abcé")
    with pytest.raises(ValueError, match=r"id 999"):
        TOK.decode([3, 999])
