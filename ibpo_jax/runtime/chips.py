"""Accelerator specs for the plan's roofline and the accelerator check's MFU.

Vendor datasheet figures per chip (one GPU, or one TPU chip): dense bf16 peak FLOP/s (no
sparsity), HBM capacity and HBM bandwidth. `usable_hbm` is what a JAX process may plan for:
on GPU, XLA preallocates `XLA_PYTHON_CLIENT_MEM_FRACTION` of the memory (0.75 unless set; the
README's GPU command sets 0.95), and the plan keeps the rest as headroom.
"""

from __future__ import annotations

import dataclasses

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    platform: str  # "gpu" or "tpu"
    bf16_flops: float  # dense bf16 peak FLOP/s
    hbm_bytes: int
    hbm_bytes_per_s: float
    usable_fraction: float  # of hbm_bytes a run may plan for (see the module docstring)

    @property
    def usable_hbm(self) -> int:
        return int(self.hbm_bytes * self.usable_fraction)


CHIPS = {c.name: c for c in (
    # NVIDIA datasheets (SXM parts): A100 80GB 312 TFLOP/s bf16, 2,039 GB/s; H100 SXM
    # 989 TFLOP/s, 3.35 TB/s; H200 989 TFLOP/s, 141 GB, 4.8 TB/s.
    Chip("a100-80gb", "gpu", 312e12, 80 * GIB, 2.039e12, 0.95),
    Chip("h100", "gpu", 989e12, 80 * GIB, 3.35e12, 0.95),
    # H100 PCIe (device kind "NVIDIA H100 PCIe"): 756 TFLOP/s bf16 dense, 2.0 TB/s HBM2e; an
    # H100 of unstated form factor is taken as the SXM part above.
    Chip("h100-pcie", "gpu", 756e12, 80 * GIB, 2.0e12, 0.95),
    Chip("h200", "gpu", 989e12, 141 * 10 ** 9, 4.8e12, 0.95),
    # Google Cloud TPU system architecture pages, per chip.
    Chip("tpu-v4", "tpu", 275e12, 32 * GIB, 1.228e12, 0.95),
    Chip("tpu-v5e", "tpu", 197e12, 16 * GIB, 0.819e12, 0.95),
    Chip("tpu-v5p", "tpu", 459e12, 95 * GIB, 2.765e12, 0.95),
    Chip("tpu-v6e", "tpu", 918e12, 32 * GIB, 1.64e12, 0.95),
)}

_ALIASES = {"a100": "a100-80gb", "v4": "tpu-v4", "v5e": "tpu-v5e", "v5p": "tpu-v5p",
            "v6e": "tpu-v6e", "h100-80gb": "h100"}


class UnknownChipError(ValueError):
    """--hardware names no chip of the table; the message lists the valid names."""


def chip(name: str) -> Chip:
    """The chip called `name` (case-insensitive; a few aliases such as "a100", "v5p")."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in CHIPS:
        raise UnknownChipError(f"unknown hardware {name!r}; valid: {', '.join(CHIPS)}")
    return CHIPS[key]


def from_device_kind(kind: str) -> Chip | None:
    """The chip of a `jax.Device.device_kind` string ("NVIDIA H100 80GB HBM3", "TPU v5p"),
    or None when the table has no match."""
    k = kind.lower().replace(" ", "")
    for needle, name in (("a100", "a100-80gb"), ("h100pcie", "h100-pcie"), ("h100", "h100"),
                         ("h200", "h200"), ("v4", "tpu-v4"), ("v5lite", "tpu-v5e"),
                         ("v5e", "tpu-v5e"), ("v5p", "tpu-v5p"), ("v6", "tpu-v6e")):
        if needle in k:
            return CHIPS[name]
    return None
