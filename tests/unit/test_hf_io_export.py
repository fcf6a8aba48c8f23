"""HF export (`iter_hf_tensors`): the host-side transpose (the default on CPU devices) gives the
same bytes as the on-device transpose and as an independent numpy reference."""

import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from dlc_jax.model import Qwen3Config, Qwen3ForCausalLM, hf_param_shapes, iter_hf_tensors
from dlc_jax.model.hf_io import _host_transpose

DIMS = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=136,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=8,
)


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (64, 7), (65, 130), (200, 64)])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int8])
def test_host_transpose_is_transpose(shape, dtype):
    a = (np.arange(np.prod(shape)) % 251 - 120).reshape(shape).astype(dtype)
    out = _host_transpose(a, block_rows=64)
    assert out.dtype == a.dtype and out.flags.c_contiguous and out.shape == shape[::-1]
    assert out.tobytes() == np.ascontiguousarray(a.T).tobytes()


def _reference(flat, config, name: str, dtype) -> np.ndarray:
    """The HF tensor from a scanned model's params by hand: layer slice, [in, out] -> [out, in]
    (numpy), numpy cast."""
    parts = tuple(name.split(".")[:-1])
    layer = None
    if parts[1] == "layers":
        layer, parts = int(parts[2]), ("model", "layers", *parts[3:])
    kernel = (*parts, "kernel") in flat
    x = np.asarray(flat[(*parts, "kernel" if kernel else "weight")].get_value())
    if layer is not None:
        x = x[layer]
    if kernel:
        x = x.reshape(hf_param_shapes(config)[name][::-1]).T
    return np.ascontiguousarray(x.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_host_and_device_transpose_bit_identical(dtype):
    model = Qwen3ForCausalLM(Qwen3Config(**DIMS, scan_layers=True), rngs=nnx.Rngs(1))
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    host = list(iter_hf_tensors(model, dtype=dtype))  # CPU devices: host transpose by default
    dev = dict(iter_hf_tensors(model, dtype=dtype, host_transpose=False))
    assert [n for n, _ in host] == list(hf_param_shapes(model.config)) == list(dev)
    for name, a in host:
        want = _reference(flat, model.config, name, dtype)
        assert a.flags.c_contiguous and a.shape == want.shape and a.dtype == want.dtype, name
        assert a.tobytes() == want.tobytes() == dev[name].tobytes(), name
