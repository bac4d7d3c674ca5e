"""The minimal safetensors reader/writer against the `safetensors` library."""

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ibpo_jax.models import safetensors_io as st


def test_reads_files_written_by_safetensors(tmp_path):
    x = (np.arange(12, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(3, 4)
    file = str(tmp_path / "f.safetensors")
    save_file({"a": x, "b": np.arange(5, dtype=np.int32), "c": np.array(2.5, np.float32)},
              file)
    infos = st.read_header(file)
    assert infos["a"].dtype == ml_dtypes.bfloat16 and infos["a"].shape == (3, 4)
    np.testing.assert_array_equal(st.open_tensor(infos["a"]), x)
    np.testing.assert_array_equal(st.open_tensor(infos["a"])[1:, 2:], x[1:, 2:])  # a slice
    np.testing.assert_array_equal(st.open_tensor(infos["b"]), np.arange(5))
    assert st.open_tensor(infos["c"]).shape == () and float(st.open_tensor(infos["c"])) == 2.5


def test_written_files_read_back_with_safetensors(tmp_path):
    tensors = {"w": np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32),
               "h": np.ones((5,), ml_dtypes.bfloat16), "s": np.array(7.0, np.float32)}
    plan = [st.PlannedTensor(k, v.shape, v.dtype, lambda v=v: v) for k, v in tensors.items()]
    file = str(tmp_path / "out.safetensors")
    nbytes = st.write_file(file, plan)
    assert nbytes == sum(v.nbytes for v in tensors.values())
    back = load_file(file)
    for k, v in tensors.items():
        np.testing.assert_array_equal(back[k], v)
        assert back[k].dtype == v.dtype and back[k].shape == v.shape


def test_write_false_produces_but_writes_nothing(tmp_path):
    calls = []
    plan = [st.PlannedTensor("a", (2,), np.dtype(np.float32),
                             lambda: calls.append(1) or np.zeros(2, np.float32))]
    st.write_file(str(tmp_path / "x.safetensors"), plan, write=False)
    assert calls == [1] and not (tmp_path / "x.safetensors").exists()


def test_corrupt_files_raise_checkpoint_errors(tmp_path):
    file = tmp_path / "f.safetensors"
    save_file({"a": np.zeros((8, 8), np.float32)}, str(file))
    data = file.read_bytes()
    file.write_bytes(data[:-4])
    with pytest.raises(st.HFCheckpointError, match="tensor a .*past the end"):
        st.read_header(str(file))
    file.write_bytes(data[:8] + b"{not json" + data[17:])
    with pytest.raises(st.HFCheckpointError, match="corrupt safetensors header"):
        st.read_header(str(file))
    with pytest.raises(st.HFCheckpointError, match="missing"):
        st.read_header(str(tmp_path / "nope.safetensors"))
