"""The JAX backend's in-memory load (`JaxWeightLoad`): tensors added one at a time give exactly the
params `load_hf` builds from the same weights on disk, for per-layer and scanned (stacked) models,
and a push missing a tensor builds nothing."""

from __future__ import annotations

import numpy as np
import pytest

from dlc_jax.sampler.backends.jax_weights import JaxWeightLoad
from dlc_jax.sampler.wire import safetensors_io as st


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from dlc_jax.model.tiny import make_tiny

    d = tmp_path_factory.mktemp("tiny")
    make_tiny(str(d))
    return d


def _flat(state):
    from flax import nnx

    return {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(state)}


@pytest.mark.parametrize("scan", [False, True])
def test_added_tensors_equal_load_hf_of_the_same_weights(tiny, tmp_path, scan):
    import shutil

    from flax import nnx

    from dlc_jax.model import load_hf

    rng = np.random.default_rng(0)
    new = {
        n: (a + rng.standard_normal(a.shape)).astype(np.float32) for n, a in st.iter_tensors(tiny)
    }
    d = tmp_path / "new"
    d.mkdir()
    shutil.copy(tiny / "config.json", d / "config.json")
    st.write_file(d / "model.safetensors", new)
    _, served = nnx.split(load_hf(tiny, scan_layers=scan))
    _, want = nnx.split(load_hf(d, scan_layers=scan))
    load = JaxWeightLoad(served, num_layers=2)  # make_tiny: 2 layers
    for n, a in new.items():
        view = a.view()
        view.flags.writeable = False
        load.add(n, view)
    got, exp = _flat(load.state()), _flat(want)
    assert got.keys() == exp.keys()
    for p in exp:
        np.testing.assert_array_equal(got[p], exp[p], err_msg=str(p))
    before = _flat(served)  # the served state is untouched
    old = _flat(nnx.split(load_hf(tiny, scan_layers=scan))[1])
    for p in old:
        np.testing.assert_array_equal(before[p], old[p])


def test_numerics_knobs_applied_per_tensor(tiny, tmp_path):
    """int8 + noise knobs: the same params as load_hf of the transformed weights on disk."""
    import shutil

    from flax import nnx

    from dlc_jax.model import load_hf
    from dlc_jax.sampler.backends.base import BackendConfig
    from dlc_jax.sampler.backends.jax_backend import transform_weights

    bcfg = BackendConfig(model_dir=str(tiny), quantization="int8", weight_noise=0.1)
    new = dict(st.iter_tensors(tiny))
    d = tmp_path / "knobs"
    d.mkdir()
    shutil.copy(tiny / "config.json", d / "config.json")
    st.write_file(
        d / "model.safetensors", {n: transform_weights(n, a, bcfg) for n, a in new.items()}
    )
    _, served = nnx.split(load_hf(tiny))
    load = JaxWeightLoad(served, 2, lambda n, w: transform_weights(n, w, bcfg))
    for n, a in new.items():
        load.add(n, a)
    got, exp = _flat(load.state()), _flat(nnx.split(load_hf(d))[1])
    for p in exp:
        np.testing.assert_array_equal(got[p], exp[p], err_msg=str(p))


def test_missing_tensor_builds_nothing(tiny):
    from flax import nnx

    from dlc_jax.model import load_hf

    _, served = nnx.split(load_hf(tiny))
    load = JaxWeightLoad(served, num_layers=2)
    items = list(st.iter_tensors(tiny))
    for n, a in items[:-1]:
        load.add(n, a)
    with pytest.raises(KeyError, match="was not loaded"):
        load.state()
    with pytest.raises(KeyError, match="not a parameter"):
        load.add("model.layers.99.mlp.up_proj.weight", items[0][1])


@pytest.mark.parametrize("scan", [False, True])
def test_moe_expert_tensors_assemble_into_stacked_params(tmp_path, scan):
    """A Qwen3-MoE push: HF's per-expert tensors land in the [E, ...] (or scanned [L, E, ...])
    params exactly as load_hf builds them from the same weights on disk."""
    from flax import nnx
    from moe_helpers import MOE_UNIFORM, make_random_moe_dir

    from dlc_jax.model import load_hf

    served_dir = make_random_moe_dir(tmp_path / "served", seed=0, **MOE_UNIFORM)
    new_dir = make_random_moe_dir(tmp_path / "new", seed=1, **MOE_UNIFORM)
    _, served = nnx.split(load_hf(served_dir, scan_layers=scan))
    _, want = nnx.split(load_hf(new_dir, scan_layers=scan))
    load = JaxWeightLoad(served, num_layers=MOE_UNIFORM["num_hidden_layers"])
    for n, a in st.iter_tensors(new_dir):
        load.add(n, a)
    got, exp = _flat(load.state()), _flat(want)
    assert got.keys() == exp.keys()
    for p in exp:
        np.testing.assert_array_equal(got[p], exp[p], err_msg=str(p))


@pytest.mark.parametrize("knobs", [False, True])
def test_loaded_params_do_not_alias_the_staging_buffer(tiny, knobs):
    """Tensors added from 64-byte-aligned views of one buffer (as a mapped staging file is read)
    and the buffer then overwritten (as the next push reuses it): the loaded params keep their
    values, with and without the numerics knobs' transform (which passes 1-D tensors through)."""
    from flax import nnx

    from dlc_jax.model import load_hf

    _, served = nnx.split(load_hf(tiny))
    tensors = dict(st.iter_tensors(tiny))
    sizes = {n: -(-a.nbytes // 64) * 64 for n, a in tensors.items()}
    buf = np.zeros(sum(sizes.values()) + 64, np.uint8)
    start = -buf.ctypes.data % 64  # the first 64-byte boundary inside buf
    load = JaxWeightLoad(served, num_layers=2, transform=(lambda n, a: a) if knobs else None)
    views = {}
    for n, a in tensors.items():
        v = buf[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
        v[...] = a
        views[n] = v
        start += sizes[n]
    for n, v in views.items():
        load.add(n, v)
    state = load.state()
    buf[...] = 0xFF  # NaN bytes in every tensor's slot
    got, want = _flat(state), _flat(nnx.split(load_hf(tiny))[1])
    for p in want:
        np.testing.assert_array_equal(got[p], want[p], err_msg=str(p))
