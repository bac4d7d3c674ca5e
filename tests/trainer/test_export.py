"""The trainer's HF export (`hf_io.save_hf` + `hf_io.save_tokenizer`, as `Trainer.export_hf`
writes them) is a directory transformers uses as is: its tokenizer, chat template, end and
pad ids, and a `generate` that stops at the end of a reply."""

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ibpo_jax import models  # noqa: E402
from ibpo_jax.data import arith, hf  # noqa: E402
from ibpo_jax.data.tokenizer import CharTokenizer  # noqa: E402
from ibpo_jax.models import hf_io  # noqa: E402
from tests.models.hf_helpers import hf_model, saved  # noqa: E402
from tests.test_train import tiny_hf_checkpoint  # noqa: E402


def _export(model, tokenizer, path):
    models.save_hf(model, path, config_extra=hf_io.special_ids(tokenizer))
    hf_io.save_tokenizer(tokenizer, path)
    return path


def test_export_of_an_hf_checkpoint_carries_its_tokenizer_and_stops_at_its_end(tmp_path):
    source = tiny_hf_checkpoint(tmp_path / "source")
    ours = hf.load_tokenizer(source)
    out = _export(models.load_hf(source), ours, tmp_path / "export")

    theirs = transformers.AutoTokenizer.from_pretrained(source)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "What is 12 + 30?\nLet's think: 42.\n"
    assert len(tok) == len(theirs) and tok.encode(text) == theirs.encode(text) == ours.encode(text)
    assert tok.chat_template == theirs.chat_template is not None
    messages = [{"role": "user", "content": "hi"}]
    assert (tok.apply_chat_template(messages, tokenize=False)
            == theirs.apply_chat_template(messages, tokenize=False))
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert (tok.eos_token_id, tok.pad_token_id) == (im_end, endoftext)

    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.generation_config.eos_token_id == [im_end, endoftext]  # the source's file
    assert (model.config.eos_token_id, model.config.pad_token_id) == ([im_end, endoftext],
                                                                       endoftext)
    prompt = torch.tensor([tok.encode(text)])
    # Every token but <|im_end|> suppressed: a generate that knows the end stops after it,
    # one that does not runs on to max_new_tokens.
    others = [i for i in range(model.config.vocab_size) if i != im_end]
    with torch.no_grad():
        ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=8, suppress_tokens=others)
    assert ids[0, prompt.shape[1]:].tolist() == [im_end]


def test_export_with_the_char_tokenizer_encodes_the_same_ids(tmp_path):
    chars = CharTokenizer()
    source = saved(hf_model(vocab_size=chars.vocab_size), tmp_path / "source")
    out = _export(models.load_hf(source), chars, tmp_path / "export")

    tok = transformers.AutoTokenizer.from_pretrained(out)
    record = arith.make_record(12, "+-", [30, 7], id="x")
    texts = [arith.prompt_text(record), record["reference"],
             "Compute 12 + 30 - 7:\n12 + 30 = 42\n42 - 7 = 35\nAnswer: 35", " a B?!'(.,:)*/= "]
    for text in texts:
        ids = chars.encode(text)
        assert tok.encode(text) == ids and tok.encode(text, add_special_tokens=False) == ids
        assert tok.decode(ids + [chars.eos_id], skip_special_tokens=True) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) == chars.vocab_size
    with pytest.raises(Exception, match="WordLevel"):  # like CharTokenizer: no unknown token
        tok.encode("é")
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "pad_token_id": 0, "eos_token_id": 2}

    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    prompt = torch.tensor([tok.encode(texts[0])])
    others = [i for i in range(chars.vocab_size) if i != chars.eos_id]
    with torch.no_grad():
        ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=8, suppress_tokens=others)
    assert ids[0, prompt.shape[1]:].tolist() == [chars.eos_id]
