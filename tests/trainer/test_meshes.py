"""Separate rollout and training meshes (`config.mesh.rollout`, trainer/offpolicy.py): where
the devices go, and `smoke` trained on 4 fake CPU devices while the other 4 sample (the
parameters resharded once per step, timed) with the metrics of one device, as is a rollout
mesh over all 8 in another split than the (2, 2, 2) training mesh."""

import jax
import pytest

from ibpo_jax import config
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import loop, offpolicy
from tests.trainer.knob_harness import MESH, SMOKE_EXACT, assert_close, smoke_cfg


def _mesh(**items):
    return config.load("configs/ibpo_gspo.py:smoke",
                       [(f"mesh.{k}", str(v)) for k, v in items.items()]).mesh


def test_rollout_devices_split_or_share_the_machine():
    devices = jax.devices()
    train, rollout = offpolicy.meshes(_mesh())
    assert train is rollout and train.devices.size == 8  # the default: one mesh
    train, rollout = offpolicy.meshes(_mesh(**{"rollout.devices": 3, "rollout.dedicated": True,
                                               "data": -1}))
    assert list(train.devices.flat) == devices[:5] and list(rollout.devices.flat) == devices[5:]
    assert dict(rollout.shape) == {"data": 3, "fsdp": 1, "tensor": 1}
    train, rollout = offpolicy.meshes(_mesh(**{"data": 2, "fsdp": 2, "tensor": 2,
                                               "rollout.devices": 4, "rollout.tensor": 2}))
    assert train.devices.size == 8 and list(rollout.devices.flat) == devices[:4]
    assert dict(rollout.shape) == {"data": 2, "fsdp": 1, "tensor": 2}
    with pytest.raises(sharding.MeshError, match="config.mesh.rollout.devices=8"):
        offpolicy.meshes(_mesh(**{"rollout.devices": 8, "rollout.dedicated": True}))
    with pytest.raises(sharding.MeshError, match="config.mesh.rollout"):
        offpolicy.meshes(_mesh(**{"rollout.devices": 4, "rollout.data": 3}))


@pytest.mark.usefixtures("one_device")
def test_split_meshes_sample_apart_with_the_metrics_of_one_device(smoke_data_dir, tmp_path,
                                                                  plain_smoke_rows):
    one = plain_smoke_rows
    assert "time_reshard_s" not in one[1]  # one mesh: no resharding, today's rows
    split = loop.run(smoke_cfg(smoke_data_dir, {"mesh.data": -1, "mesh.rollout.devices": 4,
                                                "mesh.rollout.dedicated": True}),
                     workdir=tmp_path / "split")
    assert_close(split, one, SMOKE_EXACT)
    assert all(r["time_reshard_s"] > 0 for r in split[1:])
    shared = loop.run(smoke_cfg(smoke_data_dir, {**MESH, "mesh.rollout.devices": 8,
                                                 "mesh.rollout.tensor": 2}),
                      workdir=tmp_path / "shared")
    assert_close(shared, one, SMOKE_EXACT)
