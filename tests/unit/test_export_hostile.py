"""`dlc-jax export` verifies what resume verifies: bit-rotted, non-finite or truncated params are
refused in one line and nothing is written; a non-empty --out needs --overwrite."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from dlc_jax.model.tiny import make_tiny

    d = tmp_path_factory.mktemp("exp_hostile") / "m"
    kw = dict(hidden_size=32, intermediate_size=64, head_dim=8, num_hidden_layers=2)
    return str(make_tiny(d, vocab_size=512, **kw))


def _tree_and_meta(tiny_dir, nan: bool = False):
    from flax import nnx

    from dlc_jax.model import load_hf
    from dlc_jax.trainer.config import OptimSection, load_config, to_dict
    from dlc_jax.trainer.state import TrainState, make_optimizer

    cfg = load_config(None, [f"model.path={tiny_dir}", "sft.enabled=false", "sampler.backend=jax"])
    model = load_hf(tiny_dir)
    if nan:  # one NaN in one weight: a diverged or bit-rotted theta_t
        _, params = nnx.split(model, nnx.Param)
        leaves, treedef = jax.tree.flatten(params)
        leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.nan)
        nnx.update(model, jax.tree.unflatten(treedef, leaves))
    st = TrainState.create(model, make_optimizer(OptimSection(), 10))
    tree = {"params": st.params, "opt_state": st.opt_state, "snapshots": {}}
    meta = {"step": 4, "synced_version": 4, "snapshot_versions": [], "config": to_dict(cfg)}
    return tree, meta


def _save(d, tree, meta, *, bypass_checks: bool = False):
    import orbax.checkpoint as ocp

    from dlc_jax.trainer.checkpoint import Checkpointer, array_checksums

    ck = Checkpointer(d)
    if bypass_checks:  # written as a corrupt run would have left it: the sums match the NaN
        d.mkdir(parents=True, exist_ok=True)
        meta = dict(meta, checksums=array_checksums(tree)[0])
        args = ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta))
        ck._mgr.save(meta["step"], args=args, force=True)
        ck._mgr.wait_until_finished()
    else:
        ck.save(meta["step"], tree, meta, force=True)
    ck.close()
    return d


@pytest.fixture(scope="module")
def good_ckpt(tiny_dir, tmp_path_factory):
    return _save(tmp_path_factory.mktemp("good") / "ckpt", *_tree_and_meta(tiny_dir))


def _export(capsys, *args):
    from dlc_jax.cli import run_command

    rc = run_command("export", list(args))
    err = capsys.readouterr().err
    return rc, err


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("dlc-jax export: error: "), err
    return lines[0]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_bit_rot_and_truncation_are_refused_in_one_line(good_ckpt, tmp_path, capsys, damage):
    from dlc_jax.bench.soak.trainer_harness import data_files, truncate

    ckpt = tmp_path / "ckpt"
    shutil.copytree(good_ckpt, ckpt)
    if damage == "flip":
        for p in data_files(ckpt / "4"):  # flip bytes across every data file: params are hit
            data = bytearray(p.read_bytes())
            for i in range(0, len(data), 97):
                data[i] ^= 0xFF
            p.write_bytes(bytes(data))
    else:
        truncate(ckpt / "4")
    out = tmp_path / "hf"
    rc, err = _export(capsys, "--checkpoint", str(ckpt), "--out", str(out))
    line = _one_line(err)
    assert rc == 2 and not out.exists() and "checkpoint" in line
    assert ("corrupt" in line) or ("unreadable" in line)
    assert not list(tmp_path.glob(".hf.export-*"))  # no half-written directory left


def test_non_finite_params_are_refused(tiny_dir, tmp_path, capsys):
    ckpt = _save(tmp_path / "ckpt", *_tree_and_meta(tiny_dir, nan=True), bypass_checks=True)
    rc, err = _export(capsys, "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf"))
    assert rc == 2 and "non-finite values" in _one_line(err) and not (tmp_path / "hf").exists()


def test_non_empty_out_needs_overwrite(good_ckpt, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc, err = _export(capsys, "--checkpoint", str(good_ckpt), "--out", str(out))
    assert rc == 2 and "--overwrite" in _one_line(err) and (out / "keep.txt").exists()
    rc, _ = _export(capsys, "--checkpoint", str(good_ckpt), "--out", str(out), "--overwrite")
    assert rc == 0 and not (out / "keep.txt").exists() and (out / "config.json").exists()
    from safetensors.numpy import load_file

    tensors = load_file(str(out / "model.safetensors"))
    assert all(np.isfinite(v).all() for v in tensors.values())


def test_bad_arguments_are_one_line(good_ckpt, tmp_path, capsys):
    rc, err = _export(capsys, "--checkpoint", str(good_ckpt))
    assert rc == 2 and "--out" in _one_line(err)
    rc, err = _export(capsys, "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert rc == 2 and "does not exist" in _one_line(err)
