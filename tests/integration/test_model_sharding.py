"""8 fake CPU devices: FSDP x TP forward equals the single-device forward; params really sharded
(unscanned per-layer params and scanned [L, ...] stacked params)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from model_helpers import CONFIG_TIED, CONFIG_UNTIED, make_random_hf_dir, padded_batch

from dlc_jax.model import MeshConfig, load_hf, make_mesh, shard_model
from dlc_jax.model.sharding import logical_to_spec

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")


@pytest.fixture(scope="module", params=["untied", "tied"])
def hf_dir(request, tmp_path_factory):
    cfg = CONFIG_UNTIED if request.param == "untied" else CONFIG_TIED
    return make_random_hf_dir(tmp_path_factory.mktemp(request.param), seed=5, **cfg)


def _layer(model, i, scanned=None):
    """(module/state holding layer i's params, index into its arrays: None unscanned, i stacked)."""
    if model.scanned if scanned is None else scanned:
        return model.model.layers, i
    return model.model.layers[i], None


def _spec(arr, stacked_index):
    """Spec of a parameter without the stacked 'layers' axis (which is never sharded)."""
    spec = tuple(arr.sharding.spec)
    if stacked_index is None:
        return P(*spec)
    assert not spec or spec[0] is None
    return P(*spec[1:])


def _forward(model, ids, mask):
    return np.asarray(nnx.jit(lambda m, i, a: m(i, a))(model, ids, mask))


def test_mesh_config():
    assert MeshConfig().shape(8) == (1, 8, 1)
    assert MeshConfig(data=2, tensor=2).shape(8) == (2, 2, 2)
    mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    with pytest.raises(ValueError, match="needs 12 devices"):
        MeshConfig(data=3, fsdp=2, tensor=2).shape(8)
    with pytest.raises(ValueError, match="at most one"):
        MeshConfig(data=-1, fsdp=-1).shape(8)
    # indivisible dims replicate instead of failing
    assert logical_to_spec(("vocab", "embed"), (301, 96), mesh) == P(None, "fsdp")
    assert logical_to_spec(("batch", "length"), (8, 3), mesh) == P("fsdp", None)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
@pytest.mark.parametrize(
    "mesh_cfg",
    [MeshConfig(fsdp=4, tensor=2), MeshConfig(data=2, fsdp=2, tensor=2)],
    ids=["fsdp4_tp2", "dp2_fsdp2_tp2"],
)
def test_sharded_forward_equals_single_device(hf_dir, mesh_cfg, scan):
    ids, mask = padded_batch(301, seed=13)
    ids = np.concatenate([ids, ids[::-1]], 0) % 257  # batch 8, divisible by data*fsdp
    mask = np.concatenate([mask, mask[::-1]], 0)
    ref = _forward(load_hf(hf_dir), ids, mask)
    mesh = make_mesh(mesh_cfg)
    model = load_hf(hf_dir, mesh=mesh, scan_layers=scan)
    cfg = model.config
    layer0, i0 = _layer(model, 0)
    q = layer0.self_attn.q_proj.kernel.get_value()
    assert _spec(q, i0) == P("fsdp", "tensor", None), q.sharding.spec
    shard = q.addressable_shards[0].data.shape
    assert shard[-3:] == (
        cfg.hidden_size // 2 if mesh_cfg.data == 2 else cfg.hidden_size // 4,
        cfg.num_attention_heads // 2,
        cfg.head_dim,
    )
    if scan:
        assert q.shape[0] == shard[0] == cfg.num_hidden_layers
    layer1, i1 = _layer(model, 1)
    up = layer1.mlp.up_proj.kernel.get_value()
    assert _spec(up, i1) == P("fsdp", "tensor")
    assert len({s.device for s in up.addressable_shards}) == 8
    emb = model.model.embed_tokens.weight.get_value()
    assert emb.sharding.spec[1] == "fsdp"
    out = _forward(model, ids, mask)
    valid = mask.astype(bool)
    err = np.abs(out - ref)[valid].max()
    assert err <= 1e-5, err


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_shard_model_in_place_and_grads_sharded(hf_dir, scan):
    model = load_hf(hf_dir, scan_layers=scan)
    ids, mask = padded_batch(257, seed=14)
    ref = _forward(model, ids, mask)
    mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
    shard_model(model, mesh)
    layer0, i0 = _layer(model, 0)
    assert _spec(layer0.mlp.down_proj.kernel.get_value(), i0) == P("tensor", "fsdp")
    np.testing.assert_allclose(_forward(model, ids, mask), ref, atol=1e-5)

    @nnx.jit
    def grads(m):
        return nnx.grad(lambda m: jnp.mean(m(ids, mask) ** 2))(m)

    g = grads(model)
    gl, gi = _layer(g, 0, scan)
    gk = gl.mlp.gate_proj.kernel.get_value()
    assert not gk.sharding.is_fully_replicated
    g_ref = grads(load_hf(hf_dir)).model.layers[0].mlp.gate_proj.kernel.get_value()
    np.testing.assert_allclose(
        np.asarray(gk if gi is None else gk[gi]), np.asarray(g_ref), rtol=1e-4, atol=1e-6
    )
