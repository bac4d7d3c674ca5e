"""Separate rollout and training meshes (`config.mesh.rollout`, trainer/offpolicy.py): where
the devices go, and `smoke` trained on 4 fake CPU devices while the other 4 sample (the
parameters resharded once per step, timed) with the metrics of one device, as is a rollout
mesh over all 8 in another split than the (2, 2, 2) training mesh."""

import jax
import pytest

from ibpo_jax import config, sharding
from ibpo_jax.trainer import loop, offpolicy
from tests.methods.test_methods import _assert_close, one_device  # noqa: F401
from tests.trainer.test_offpolicy import EXACT


@pytest.fixture(scope="module")
def data_dir(smoke_data_dir):
    return smoke_data_dir


def _cfg(data_dir, **extra):
    items = {"task.data_dir": data_dir, "train.steps": 4, **extra}
    return config.load("configs/ibpo_gspo.py:smoke", [(k, str(v)) for k, v in items.items()])


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
def test_split_meshes_sample_apart_with_the_metrics_of_one_device(data_dir, tmp_path):
    one = loop.run(_cfg(data_dir, **{"mesh.data": 1}), workdir=tmp_path / "one")
    assert "time_reshard_s" not in one[1]  # one mesh: no resharding, today's rows
    split = loop.run(_cfg(data_dir, **{"mesh.data": -1, "mesh.rollout.devices": 4,
                                       "mesh.rollout.dedicated": True}),
                     workdir=tmp_path / "split")
    _assert_close(split, one, EXACT[:-1])
    assert all(r["time_reshard_s"] > 0 for r in split[1:])
    shared = loop.run(_cfg(data_dir, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2,
                                        "mesh.rollout.devices": 8, "mesh.rollout.tensor": 2}),
                      workdir=tmp_path / "shared")
    _assert_close(shared, one, EXACT[:-1])
