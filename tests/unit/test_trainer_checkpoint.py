"""Checkpoints: round trip of arrays + metadata, keep-last-N, periodic policy, corrupt refusal."""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlc_jax.trainer.checkpoint import Checkpointer, CheckpointError


def _state(seed):
    k = jax.random.key(seed)
    return {
        "params": {"w": jax.random.normal(k, (4, 3)), "b": jnp.arange(3.0)},
        "opt": {"mu": jnp.ones((4, 3)) * seed, "count": jnp.asarray(seed, jnp.int32)},
        "snapshots": {"3": {"w": jnp.full((4, 3), 0.5)}},
        "rng": jax.random.key_data(k),
    }


def test_round_trip_keep_and_period(tmp_path):
    ck = Checkpointer(tmp_path / "ck", keep=2, every=5)
    assert not ck.should_save(0) and not ck.should_save(4) and ck.should_save(5)
    assert ck.save(3, _state(3), {"x": 1}) is False  # not a period step
    for step in (5, 10, 15):
        assert ck.save(
            step, _state(step), {"weight_version": step // 5, "data": {"next_index": step}}
        )
    assert ck.save(17, _state(17), {"weight_version": 9}, force=True)
    assert ck.all_steps() == [15, 17]  # keep last 2
    ck.close()
    ck2 = Checkpointer(tmp_path / "ck", keep=2, every=5)
    assert ck2.latest_step() == 17
    meta = ck2.restore_meta(15)
    assert meta.pop("checksums") and meta.pop("checksum_format") == 1  # one pair of sums per array
    assert meta == {"weight_version": 3, "data": {"next_index": 15}, "step": 15}
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))
    got = ck2.restore_state(abstract, 15)
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, _state(15)
    )
    with pytest.raises(CheckpointError, match="step 5"):
        ck2.restore_meta(5)


def test_sharded_restore_on_fake_devices(tmp_path):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("fsdp", "tensor"))
    sh = NamedSharding(mesh, P("fsdp", "tensor"))
    x = jax.device_put(jnp.arange(32.0).reshape(4, 8), sh)
    ck = Checkpointer(tmp_path / "ck", keep=1)
    ck.save(1, {"x": x}, {}, force=True)
    got = ck.restore_state({"x": jax.ShapeDtypeStruct((4, 8), jnp.float32, sharding=sh)})
    assert got["x"].sharding == sh
    np.testing.assert_array_equal(np.asarray(got["x"]), np.asarray(x))


def test_corrupt_checkpoint_is_refused(tmp_path):
    ck = Checkpointer(tmp_path / "ck", keep=3)
    ck.save(1, _state(1), {"v": 1}, force=True)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))
    ck.restore_state(abstract, 1)  # sane before corruption
    state_dir = Path(ck.directory) / "1" / "state"
    files = [
        p
        for p in state_dir.rglob("*")
        if p.is_file() and p.stat().st_size > 0 and "d" in p.parent.name
    ]
    assert files, list(state_dir.rglob("*"))
    for p in files:  # overwrite the array data files with garbage
        p.write_bytes(os.urandom(p.stat().st_size))
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.restore_state(abstract, 1)
    # metadata corruption
    meta_files = [p for p in (Path(ck.directory) / "1" / "meta").rglob("*") if p.is_file()]
    for p in meta_files:
        p.write_text("{not json")
    with pytest.raises(CheckpointError, match="metadata"):
        ck.restore_meta(1)
