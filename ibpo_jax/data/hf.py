"""Hugging Face tokenizers from a local directory, with the chat prompt and the is_delim table.

`load_tokenizer(path)` wraps `transformers.AutoTokenizer` (no hub access: `path` must be a local
directory holding tokenizer.json / tokenizer_config.json, and for chat prompts a chat template)
behind the same protocol as `CharTokenizer` (see `ibpo_jax.data.tokenizer`).

is_delim (DESIGN §2): token i is a step delimiter when the text of token i alone contains a
newline. It is computed once by decoding every id, so byte-level BPE vocabularies (Qwen's "Ċ",
"ĊĊ", ".Ċ" ...) are handled by the tokenizer's own decoder rather than by guessing at its
internal spelling.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np


class HFTokenizer:
    """The tokenizer protocol over a transformers tokenizer.

    vocab_size is len(tokenizer) unless a larger `vocab_size` (the model's padded embedding size,
    e.g. 151936 for Qwen3 against 151669 tokens) was given; is_delim is False on the padding ids.
    pad_id falls back to eos_id when the tokenizer defines no pad token.
    eos_ids: eos_id first, then any other ids of generation_config.json's eos_token_id.
    """

    def __init__(self, tokenizer, *, eos_ids: Sequence[int] = (), vocab_size: int | None = None):
        self.tokenizer = tokenizer
        n = len(tokenizer)
        if vocab_size is not None and vocab_size < n:
            raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's {n} tokens")
        self.vocab_size = n if vocab_size is None else vocab_size
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} defines no eos token")
        self.eos_id = int(tokenizer.eos_token_id)
        self.eos_ids = tuple(dict.fromkeys([self.eos_id, *map(int, eos_ids)]))
        self.pad_id = self.eos_id if tokenizer.pad_token_id is None else int(tokenizer.pad_token_id)
        self.bos_id = None if tokenizer.bos_token_id is None else int(tokenizer.bos_token_id)
        texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        is_delim = np.zeros(self.vocab_size, dtype=bool)
        is_delim[:n] = ["\n" in t for t in texts]
        is_delim.flags.writeable = False
        self.is_delim = is_delim

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def chat_prompt(self, user_text: str, *, enable_thinking: bool = True,
                    system: str | None = None) -> str:
        """The prompt string for one user turn, ending where the assistant's reply starts.

        enable_thinking is passed to the chat template (Qwen3's thinking switch).
        """
        if not self.tokenizer.chat_template:
            raise ValueError(
                f"tokenizer {self.tokenizer.name_or_path!r} has no chat template; add one to its "
                "tokenizer_config.json (or chat_template.jinja)")
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user_text}]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking)


def load_tokenizer(path: str | os.PathLike, *, vocab_size: int | None = None) -> HFTokenizer:
    """HFTokenizer for the local tokenizer directory `path` (never contacts a hub)."""
    from transformers import AutoTokenizer

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    eos_ids: list[int] = []
    gen_config = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_config):
        with open(gen_config, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id")
        eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return HFTokenizer(tokenizer, eos_ids=eos_ids, vocab_size=vocab_size)
