"""ibpo-jax: IBPO and token-gradient-cancellation RL for LLM reasoning, in JAX/Flax."""

from setuptools import find_packages, setup

# jax 0.10.2 is the newest release for Python 3.11; 0.11 and later need Python >= 3.12, where
# pip picks them. The accelerator extras are jax's own (docs/install.md); torch stays in "dev"
# (HF parity tests), so an accelerator install never pulls a CUDA torch.
JAX = "jax>=0.6,<0.13"

setup(
    name="ibpo-jax",
    version="0.1.0",
    description="Implicit Behavioral Policy Optimization (IBPO) for LLM reasoning in JAX/Flax",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ibpo_jax", "ibpo_jax.*"]),
    python_requires=">=3.10",
    install_requires=[
        JAX,
        "flax>=0.10,<0.13",
        "optax>=0.2.4,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
        "transformers>=4.51,<6",  # Qwen3 support landed in 4.51
        "safetensors>=0.4,<1",
        "ml_collections>=0.1.1,<2",
        "tensorflow-datasets>=4.9.7,<5",
        "array-record>=0.7,<1",
        "numpy>=1.26,<3",
        "ml_dtypes>=0.4",  # bfloat16 in numpy (safetensors io)
        "math-verify>=0.7,<1",
        "tensorboardX>=2.6,<3",
        "tqdm>=4.66,<5",
        "pyarrow>=14,<30",  # parquet benchmark files (AIME 2024, Codeforces)
        "matplotlib>=3.8,<4",  # the reproduction's plots and the Appendix A notebook
    ],
    extras_require={
        "cuda12": [JAX.replace("jax", "jax[cuda12]", 1)],  # NVIDIA GPUs, CUDA 12 from pip
        "tpu": [JAX.replace("jax", "jax[tpu]", 1)],  # Cloud TPU VMs (libtpu from PyPI)
        # Viewing DIR/tensorboard/ (`tensorboard --logdir DIR`); the run writes it without.
        "tensorboard": ["tensorboard>=2.14,<3"],
        "wandb": ["wandb>=0.17,<1"],  # config.logging.backends=tensorboard,jsonl,wandb
        "dev": [
            "pytest>=8,<10",
            "pytest-xdist>=3.5,<4",
            "hypothesis>=6.100,<7",
            "rapidfuzz>=3.9,<4",
            "chex>=0.1.88,<0.2",
            # CPU torch for the HF parity tests; `make` installs the local CPU wheel first so
            # this range is already satisfied and pip never pulls a CUDA build.
            "torch>=2.4,<2.15",
            "trl>=0.20,<2",  # the peer in experiments/benchmarks/bench_rl_step.py
            "ruff>=0.6",
            # Executes notebooks/appendix_a.ipynb with its outputs (make notebooks, and CI).
            "nbformat>=5.9,<6",
            "nbclient>=0.10,<1",
            "ipykernel>=6.29,<8",
        ],
    },
)
