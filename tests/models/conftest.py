"""Fixtures shared by the model tests: a left-padded batch and a random HF model saved to
disk (GQA ratio 2, untied embeddings)."""

import numpy as np
import pytest

from tests.models.hf_helpers import hf_model, left_padded_batch, saved

LENGTHS = (9, 5, 1, 7)  # odd T = 9, left padding, a one-token row


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(np.random.default_rng(0), LENGTHS, vocab=128)


@pytest.fixture(scope="module")
def gqa2(tmp_path_factory):
    hf = hf_model(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    return hf, saved(hf, tmp_path_factory.mktemp("gqa2"))
