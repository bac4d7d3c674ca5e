"""The tokenizer protocol shared by the trainer, and the character-level tokenizer of `arith`.

Every tokenizer (this one, and `ibpo_jax.data.hf.HFTokenizer`) offers:
  encode(text) -> list[int]         no special tokens added
  decode(ids) -> str                special tokens dropped
  vocab_size, pad_id, bos_id (None for most HF chat models), eos_id, eos_ids (tuple)
  is_delim: np.ndarray bool [vocab_size], True for tokens whose text contains a newline: the
    step delimiters of the comparison operator (DESIGN §2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

SPECIALS = ("<pad>", "<bos>", "<eos>")
# Everything `arith` writes, plus the rest of the alphabet and a little punctuation.
CHARS = ("\n", " ", *"0123456789", *"+-*/=().,:?!'",
         *"abcdefghijklmnopqrstuvwxyz", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int
    eos_ids: tuple[int, ...]
    is_delim: np.ndarray

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class CharTokenizer:
    """One id per character: <pad>=0, <bos>=1, <eos>=2, then `CHARS` in order.

    encode raises on a character outside the vocabulary (naming it and its position) rather than
    mapping it to an unknown token, so a data bug cannot silently train on garbage.
    """

    def __init__(self):
        self._itos = (*SPECIALS, *CHARS)
        self._stoi = {ch: i for i, ch in enumerate(self._itos) if i >= len(SPECIALS)}
        self.vocab_size = len(self._itos)
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.eos_ids = (self.eos_id,)
        self.is_delim = np.array([tok == "\n" for tok in self._itos], dtype=bool)
        self.is_delim.flags.writeable = False

    def encode(self, text: str) -> list[int]:
        try:
            return [self._stoi[ch] for ch in text]
        except KeyError:
            pos = next(i for i, ch in enumerate(text) if ch not in self._stoi)
            raise ValueError(
                f"CharTokenizer.encode: character {text[pos]!r} at position {pos} is not in the "
                f"vocabulary") from None

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"CharTokenizer.decode: id {i} is outside [0, {self.vocab_size})")
            if i >= len(SPECIALS):
                out.append(self._itos[i])
        return "".join(out)

    def to_hf(self):
        """A `transformers.PreTrainedTokenizerFast` that encodes and decodes exactly as this
        tokenizer (what an HF export of the run writes, `hf_io.save_tokenizer`): one id per
        character, the specials at their ids, no unknown token (a character outside the
        alphabet is an error)."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {name: i for i, name in enumerate(SPECIALS)}
        vocab.update({self.decode([i]): i for i in range(len(SPECIALS), self.vocab_size)})
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))  # not in vocab: an error
        # Every character its own piece, newlines and spaces included; decoding joins them.
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        name = {i: text for text, i in vocab.items()}
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token=name[self.pad_id], bos_token=name[self.bos_id],
            eos_token=name[self.eos_id])

