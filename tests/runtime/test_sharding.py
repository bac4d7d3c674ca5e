"""Meshes and layouts on 8 fake CPU devices: placements are what the spec declares, and sharded
logits / gradients equal single-device ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax import models
from ibpo_jax.runtime import sharding

CFG = models.Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, rope_theta=5000.0, initializer_range=0.2)
MESHES = [(8, 1, 1), (2, 2, 2), (1, 4, 2)]
# Float32 sums split across devices add in another order: agreement to 1e-5, not bitwise.
TOL = 1e-5


@pytest.fixture(scope="module")
def single():
    return models.init(CFG, jax.random.key(0))


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 128, (8, 7))
    mask = np.ones((8, 7), np.int32)
    mask[::3, :4] = 0  # left padding on some rows
    return tokens, mask


def _loss(m, params, tokens, mask):
    return -jnp.sum(models.token_logprobs(m.config, m.options, params, tokens, mask).logprobs)


def test_devices_are_faked():
    assert len(jax.devices()) == 8


@pytest.mark.parametrize("shape", MESHES, ids=str)
def test_sharded_logits_equal_single_device(single, batch, shape):
    mesh = sharding.make_mesh(data=shape[0], fsdp=shape[1], tensor=shape[2])
    m = models.Qwen3LM(CFG, single.options, models.place_params(single.params, mesh), mesh)
    want = np.asarray(single(*batch))
    got = m(*batch)
    assert got.sharding.mesh.shape == dict(zip(sharding.MESH_AXES, shape))
    np.testing.assert_allclose(np.asarray(got), want, atol=TOL)


@pytest.mark.parametrize("shape", MESHES, ids=str)
@pytest.mark.parametrize("layout", ["TRAINING", "SAMPLING"])
def test_parameters_are_laid_out_as_declared(single, shape, layout):
    mesh = sharding.make_mesh(data=shape[0], fsdp=shape[1], tensor=shape[2])
    spec = getattr(sharding, layout)
    placed = models.place_params(single.params, mesh, spec)
    _, fsdp, tensor = shape
    d = 64 // fsdp if layout == "TRAINING" else 64  # SAMPLING keeps weights whole over fsdp
    expected_shard = {  # per-device shard of each layer weight, worked out by hand
        "q_proj": (d, 4 // tensor, 16), "k_proj": (d, 2 // tensor, 16),
        "o_proj": (4 // tensor, 16, d), "gate_proj": (d, 96 // tensor),
        "down_proj": (96 // tensor, d), "input_norm": (64,),
    }
    layer = placed["layers_1"]
    for name, leaf in [*layer["attn"].items(), *layer["mlp"].items(),
                       ("input_norm", layer["input_norm"])]:
        if name in expected_shard:
            assert {s.data.shape for s in leaf.addressable_shards} == {expected_shard[name]}
        assert leaf.sharding.spec == sharding.param_spec((name,), leaf.ndim, spec)
    emb = placed["embedding"]
    assert emb.sharding == NamedSharding(mesh, spec.embed_vd)
    assert emb.addressable_shards[0].data.shape == (128 // tensor, d)


def test_sharded_training_gradients_equal_single_device(single, batch):
    tokens, mask = (jnp.asarray(a) for a in batch)
    want = jax.jit(jax.grad(lambda p: _loss(single, p, tokens, mask)))(single.params)
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    params = models.place_params(single.params, mesh)
    shardings = jax.tree.map(lambda a: a.sharding, params)
    batch_sharding = sharding.batch_sharding(mesh)
    step = jax.jit(jax.grad(lambda p, t, m: _loss(single, p, t, m)),
                   in_shardings=(shardings, batch_sharding, batch_sharding),
                   out_shardings=shardings)
    with jax.set_mesh(mesh):
        got = step(params, tokens, mask)
    assert got["layers_0"]["mlp"]["gate_proj"].sharding.spec == P("fsdp", "tensor")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), got, want)


def test_scanned_params_get_a_leading_unsharded_layer_axis():
    m = models.init(CFG, jax.random.key(1), scan_layers=True,
                    mesh=sharding.make_mesh(fsdp=4, tensor=2))
    q = m.params["layers"]["attn"]["q_proj"]
    assert q.sharding.spec == P(None, "fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (2, 16, 2, 16)


def test_make_mesh_sizes_and_errors():
    assert sharding.make_mesh(fsdp=-1, tensor=2).shape == {"data": 1, "fsdp": 4, "tensor": 2}
    assert sharding.make_mesh(data=-1).shape == {"data": 8, "fsdp": 1, "tensor": 1}
    with pytest.raises(sharding.MeshError, match="8 devices|there are 8"):
        sharding.make_mesh(data=3)
    with pytest.raises(ValueError, match="only one mesh axis may be -1"):
        sharding.make_mesh(data=-1, fsdp=-1)


@pytest.mark.parametrize("sizes, devices, message", [
    # The qwen3 presets' old mesh on one device: the keys, and the override that fixes it.
    (dict(data=-1, fsdp=8, tensor=1), 1, "config.mesh.fsdp=8 x config.mesh.tensor=1 does not "
     "divide 1 device(s); set config.mesh.fsdp=-1 and config.mesh.data=1"),
    (dict(data=1, fsdp=3, tensor=-1), 8, "config.mesh.data=1 x config.mesh.fsdp=3 does not "
     "divide 8 device(s); set config.mesh.fsdp=-1 and config.mesh.tensor=1"),
    (dict(data=2, fsdp=2, tensor=2), 4, "config.mesh.data=2 x config.mesh.fsdp=2 x "
     "config.mesh.tensor=2 = 8 device(s), but there are 4; set config.mesh.data=-1"),
    (dict(data=0, fsdp=1, tensor=1), 8, "config.mesh.data=0: mesh sizes must be -1 or > 0"),
])
def test_a_mesh_that_does_not_fit_is_one_line_in_config_keys(sizes, devices, message):
    with pytest.raises(sharding.MeshError) as e:
        sharding.make_mesh(**sizes, devices=jax.devices()[:devices])
    assert str(e.value) == message


def test_a_fixed_mesh_fills_any_device_count():
    """The fix the message proposes works for every device count (one -1 axis)."""
    for n in (1, 2, 4, 8):
        assert sharding.make_mesh(data=1, fsdp=-1, devices=jax.devices()[:n]).shape == {
            "data": 1, "fsdp": n, "tensor": 1}


_LAUNCH_VARS = ("JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID",
                "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
                "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE", "TPU_PROCESS_ADDRESSES",
                "TPU_WORKER_HOSTNAMES", "MEGASCALE_NUM_SLICES")
_SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_PROCID": "0",
          "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("env, found", [
    ({}, None),
    ({"JAX_NUM_PROCESSES": "1", "JAX_COORDINATOR_ADDRESS": "h:1"}, None),
    ({"JAX_NUM_PROCESSES": "4"}, "JAX_NUM_PROCESSES=4"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1234"}, "JAX_COORDINATOR_ADDRESS=h:1234"),
    ({**_SLURM, "SLURM_NTASKS": "1"}, None),
    ({**_SLURM, "SLURM_NTASKS": "8"}, "SLURM_NTASKS=8"),
    ({**_SLURM, "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "1"}, None),  # a 1-task srun
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "8"}, None),  # the batch script, not an srun step
    ({"OMPI_COMM_WORLD_SIZE": "1"}, None),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_SIZE=2"),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, None),
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1,w-2,w-3"}, "TPU_WORKER_HOSTNAMES (4 hosts)"),
    ({"TPU_PROCESS_ADDRESSES": "a:1", "TPU_WORKER_HOSTNAMES": "w-0,w-1"}, None),  # first wins
    ({"MEGASCALE_NUM_SLICES": "2"}, "MEGASCALE_NUM_SLICES=2"),
])
def test_multiprocess_launch_is_read_from_the_environment(env, found, monkeypatch):
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert sharding.multiprocess_launch() == found
    assert sharding.distributed_requested("auto") == (found is not None)
    assert sharding.distributed_requested("true") and sharding.distributed_requested(True)
    assert not sharding.distributed_requested("false")


def test_indivisible_dimension_names_the_parameter():
    cfg = models.Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96,
                             num_hidden_layers=1, num_attention_heads=3, num_key_value_heads=1,
                             head_dim=16)
    shapes = models.abstract_params(cfg, models.ModelOptions())
    with pytest.raises(ValueError, match="layers_0/attn/k_proj"):
        sharding.param_shardings(shapes, sharding.make_mesh(data=4, tensor=2))


def test_constrain_is_a_no_op_without_a_mesh():
    x = jnp.ones((4, 3))
    assert sharding.constrain(x, P(sharding.BATCH, None)) is x


def test_initialize_distributed_only_when_asked(monkeypatch):
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    assert not sharding.initialize_distributed(False)
    assert not sharding.initialize_distributed("auto")  # one process: nothing to join
    assert not jax.distributed.is_initialized()


def test_local_rows_and_rows_array_round_trip_on_a_row_split():
    """One process holds every row of a row-split array; rows_array rebuilds it from them (and
    refuses a device's rows it was not given). The two-process case: tests/trainer/test_loop."""
    mesh = sharding.make_mesh(data=4, tensor=2)
    x = sharding.global_array(np.arange(24).reshape(8, 3), sharding.batch_sharding(mesh, 2))
    rows, values = sharding.local_rows(x)
    np.testing.assert_array_equal(rows, np.arange(8))
    np.testing.assert_array_equal(values, np.arange(24).reshape(8, 3))
    y = sharding.rows_array(values[:, 1], rows, 8, sharding.batch_sharding(mesh, 1))
    np.testing.assert_array_equal(np.asarray(y), np.arange(8) * 3 + 1)
    assert y.sharding.spec == P(sharding.BATCH)
    with pytest.raises(ValueError, match="not given"):
        sharding.rows_array(values[:4, 1], rows[:4], 8, sharding.batch_sharding(mesh, 1))
    split = jax.device_put(np.zeros((8, 4)), jax.sharding.NamedSharding(mesh, P("data", "tensor")))
    with pytest.raises(ValueError, match="split beyond its rows"):
        sharding.local_rows(split)


_AUTO_SCRIPT = '''
import json
import jax
from ibpo_jax.runtime import sharding

started = sharding.initialize_distributed("auto")  # JAX_NUM_PROCESSES=2 etc. from the launch
print("RESULT " + json.dumps([started, jax.process_count(), sharding.multiprocess_launch()]))
'''


def test_auto_starts_jax_distributed_for_a_two_process_launch():
    from tests.trainer.multiprocess import script_in_two_processes

    assert script_in_two_processes(_AUTO_SCRIPT, timeout=180) == [
        [True, 2, "JAX_NUM_PROCESSES=2"]] * 2
