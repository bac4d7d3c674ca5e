"""HF tokenizer wrapper on a locally built byte-level BPE tokenizer with a Qwen3-style chat
template: protocol fields, is_delim from the vocabulary, the thinking switch, task prompts."""

import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ibpo_jax.data import get_task
from ibpo_jax.data.hf import load_tokenizer

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# Written for this test in the style of Qwen3's template: ChatML turns, and an empty think
# block after the assistant header when enable_thinking is false.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages if m['role'] != 'system' %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")


def bytes_to_unicode():
    """GPT-2's byte <-> printable character table (the ByteLevel alphabet), rebuilt here."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A byte-level BPE whose merges make multi-byte tokens with and without newlines."""
    b2u = bytes_to_unicode()
    alphabet = [b2u[b] for b in range(256)]
    nl, sp = b2u[ord("\n")], b2u[ord(" ")]
    merges = [(nl, nl), (".", nl), ("a", nl), ("a" + nl, "b"), (sp, "x"), ("4", "2"),
              ("A", "n")]
    vocab = {tok: i for i, tok in enumerate(alphabet + [a + b for a, b in merges])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=SPECIALS)
    fast.chat_template = CHAT_TEMPLATE
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    eos = [fast.convert_tokens_to_ids("<|im_end|>"), fast.convert_tokens_to_ids("<|endoftext|>")]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return str(path)


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def test_protocol_fields(tok):
    inner = tok.tokenizer
    assert tok.vocab_size == len(inner) == 256 + 7 + len(SPECIALS)
    assert tok.eos_id == inner.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_ids == (tok.eos_id, inner.convert_tokens_to_ids("<|endoftext|>"))
    assert tok.pad_id == inner.convert_tokens_to_ids("<|endoftext|>")
    assert tok.bos_id is None
    text = "Answer: 42.\n\na\nb x\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode("hi") + [tok.eos_id]) == "hi"  # specials dropped


def test_is_delim_matches_the_byte_level_vocabulary(tok):
    u2b = {u: b for b, u in bytes_to_unicode().items()}
    tokens = tok.tokenizer.convert_ids_to_tokens(list(range(tok.vocab_size)))
    expected = np.array([t not in SPECIALS and b"\n" in bytes(u2b[c] for c in t)
                         for t in tokens])
    assert np.array_equal(tok.is_delim, expected)
    newline_tokens = sorted(tok.decode([i]) for i in np.flatnonzero(tok.is_delim))
    assert newline_tokens == sorted(["\n", "\n\n", ".\n", "a\n", "a\nb"])


def test_vocab_size_padding(tok_dir, tok):
    padded = load_tokenizer(tok_dir, vocab_size=tok.vocab_size + 5)
    assert padded.vocab_size == tok.vocab_size + 5
    assert np.array_equal(padded.is_delim[: tok.vocab_size], tok.is_delim)
    assert not padded.is_delim[tok.vocab_size:].any()
    with pytest.raises(ValueError, match="smaller than"):
        load_tokenizer(tok_dir, vocab_size=10)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(os.path.join(tok_dir, "nope"))


def test_chat_prompt_thinking_switch(tok):
    assert tok.chat_prompt("Hi?") == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.chat_prompt("Hi?", enable_thinking=False, system="Be brief.") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_math_and_code_task_prompts(tok):
    math = get_task("math500", path=os.path.join(FIXTURES, "math500.jsonl"), tokenizer=tok,
                    enable_thinking=False)
    record = math.split("test")[1]
    assert math.prompt_text(record) == (
        "<|im_start|>user\nSolve $x^2 = 9$ for $x > 0$.\n\nPlease reason step by step, and put "
        "your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\n")
    code = get_task("livecodebench", path=os.path.join(FIXTURES, "livecodebench.jsonl"),
                    tokenizer=tok)
    functional = code.split("test")[1]
    prompt = code.prompt_text(functional)
    assert prompt.startswith("<|im_start|>user\nGiven an integer array nums")
    assert "```python\nclass Solution:\n    def maxPairSum(self" in prompt
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_missing_chat_template_is_named(tok_dir, tmp_path):
    config = json.load(open(os.path.join(tok_dir, "tokenizer_config.json")))
    config.pop("chat_template", None)
    for name in ("tokenizer.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(tok_dir, name)):
            (tmp_path / name).write_text(open(os.path.join(tok_dir, name)).read())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    bare = load_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="has no chat template"):
        bare.chat_prompt("x")
