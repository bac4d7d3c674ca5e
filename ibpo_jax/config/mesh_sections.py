"""The mesh's config sections: the training mesh (`mesh`) and the sampler's own
(`mesh.rollout`); `ibpo_jax.config` assembles them into `RunConfig`."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config.schema import ConfigError, Section


@dataclasses.dataclass(frozen=True)
class RolloutMeshConfig(Section):
    """Where rollouts are sampled (trainer/offpolicy.py: the parameters are resharded onto it
    once per step). One axis may be -1: it takes the devices the others leave."""

    KEY = "mesh.rollout"
    devices: int = 0
    """Devices that sample; 0 = the training mesh samples (the default). Else the last
    `devices` devices with `dedicated`, the first `devices` (shared with training) without."""
    dedicated: bool = False
    """The sampling devices train nothing: the training mesh takes the other devices."""
    data: int = -1
    """The rollout mesh's data axis (rows split, weights replicated); -1 = the rest."""
    fsdp: int = 1
    """Its fsdp axis (rows split too); -1 = the rest."""
    tensor: int = 1
    """Its tensor axis (each matmul split); -1 = the rest."""

    def check(self):
        self._nonneg("devices")
        self._require("dedicated", not self.dedicated or self.devices > 0,
                      "needs config.mesh.rollout.devices > 0")
        _check_axes(self)


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
    """One axis may be -1: it takes the devices the others leave (sharding.make_mesh)."""

    KEY = "mesh"
    data: int = -1
    """Data parallelism (weights replicated); -1 = the devices the others leave."""
    fsdp: int = 1
    """Devices the parameters are sharded over (FSDP); -1 = the rest."""
    tensor: int = 1
    """Devices each matmul is split over (tensor parallelism); -1 = the rest."""
    rollout: RolloutMeshConfig = dataclasses.field(default_factory=RolloutMeshConfig)
    """The sampler's own mesh (default: the training mesh samples)."""

    def check(self):
        _check_axes(self)


def _check_axes(section: Section) -> None:
    """A mesh section's (data, fsdp, tensor): each -1 or > 0, at most one -1."""
    for name in ("data", "fsdp", "tensor"):
        section._require(name, getattr(section, name) == -1 or getattr(section, name) > 0,
                         "must be -1 or > 0")
    fill = [f"config.{section._key(n)}=-1" for n in ("data", "fsdp", "tensor")
            if getattr(section, n) == -1]
    if len(fill) > 1:
        raise ConfigError(f"{' and '.join(fill)}: only one mesh axis may be -1 (it takes "
                          "the devices the others leave); set the others to a size")
