"""Shared helpers for the model tests: tiny random HF Qwen3 models (the outside reference) and
batches with left padding."""

from __future__ import annotations

import numpy as np
import torch
import transformers

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            rope_theta=5000.0, max_position_embeddings=256, initializer_range=0.2)


def hf_model(*, seed: int = 0, **overrides) -> transformers.Qwen3ForCausalLM:
    """A random fp32 HF Qwen3ForCausalLM in eval mode (init std 0.2 so logits are not flat)."""
    cfg = {**TINY, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "tie_word_embeddings": False, **overrides}
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg)).eval()


def saved(model: transformers.PreTrainedModel, directory, **kwargs) -> str:
    model.save_pretrained(directory, **kwargs)
    return str(directory)


def left_padded_batch(rng: np.random.Generator, lengths, vocab: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """tokens, mask [B, max(lengths)] with each row's real tokens right-aligned."""
    t = max(lengths)
    tokens = np.zeros((len(lengths), t), np.int64)
    mask = np.zeros((len(lengths), t), np.int64)
    for b, n in enumerate(lengths):
        tokens[b, t - n:] = rng.integers(1, vocab, n)
        mask[b, t - n:] = 1
    return tokens, mask


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """HF logits with positions counted over real tokens (as HF `generate` does)."""
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    with torch.no_grad():
        out = model(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask),
                    position_ids=torch.from_numpy(positions))
    return out.logits.numpy()
