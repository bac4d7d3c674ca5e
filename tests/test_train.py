"""`python -m ibpo_jax.train` with a paper preset on one device and no mesh or distributed
override: only the checkpoint, the data files and, on CPU, lengths and counts small enough to
finish. The checkpoint is a random tiny HF Qwen3 (transformers + torch) with a byte-level BPE
tokenizer saved beside it; the data are the MATH-style fixtures."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ibpo_jax import config  # noqa: E402
from tests.data.test_hf import CHAT_TEMPLATE, SPECIALS, bytes_to_unicode  # noqa: E402
from tests.models.hf_helpers import hf_model, saved  # noqa: E402

ROOT = Path(__file__).parents[1]
FIXTURES = ROOT / "tests" / "data" / "fixtures"


def tiny_hf_checkpoint(path: Path) -> Path:
    """A random Qwen3ForCausalLM and a byte-level tokenizer with a Qwen3-style chat template
    in one directory, as a published checkpoint is laid out."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    eos = [fast.convert_tokens_to_ids("<|im_end|>"), fast.convert_tokens_to_ids("<|endoftext|>")]
    saved(hf_model(vocab_size=len(fast) + 3, max_position_embeddings=512), path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return path


@pytest.mark.parametrize("preset", ["qwen3_0.6b_math"])
def test_paper_preset_runs_on_one_device_without_mesh_or_distributed_overrides(preset,
                                                                                tmp_path):
    ckpt = tiny_hf_checkpoint(tmp_path / "ckpt")
    workdir = tmp_path / "run"
    # The fewest prompts per step the preset's batch splits allow (whole groups per
    # micro-batch and per sampler call).
    cfg = config.load(f"configs/ibpo_gspo.py:{preset}")
    micro = cfg.optim.microbatches if isinstance(cfg.optim.microbatches, int) else 1
    prompts = math.lcm(cfg.optim.minibatches * micro,
                       getattr(cfg.rollout, "sample_chunk", 0) or 1)
    cmd = [sys.executable, "-m", "ibpo_jax.train", f"--config=configs/ibpo_gspo.py:{preset}",
           f"--workdir={workdir}",
           f"--config.model.checkpoint={ckpt}",
           f"--config.task.path={FIXTURES / 'math_train.jsonl'}",
           f"--config.task.eval_path={FIXTURES / 'math500.jsonl'}",
           # CPU: lengths and counts small enough to finish (~2 CPU-minutes; 6 min wall on a
           # loaded 2-core host).
           f"--config.rollout.prompts_per_step={prompts}", "--config.rollout.max_prompt_len=96",
           "--config.rollout.max_new_tokens=8", "--config.train.steps=1",
           "--config.eval.num_prompts=2"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}  # one CPU device
    for var in ("JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS",
                "OMPI_COMM_WORLD_SIZE"):
        env.pop(var, None)  # a plain one-process launch
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 1]
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[1]
    assert (workdir / "hf_final" / "config.json").exists()
    run_config = json.loads((workdir / "config.json").read_text())
    assert run_config["train"]["distributed"] == "auto" and run_config["preset"] == preset
