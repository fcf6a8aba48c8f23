"""The trainer's checkpoints as a hostile disk would treat them, and the ``dlc-jax`` entry point
as a careless user would (the runs themselves: tests/integration/test_trainer_hostile.py).

Checkpoints: bit flips / truncations of the newest step are reported in one line and the run falls
back to the newest good step; a save that does not verify never rotates out the last good one;
non-finite arrays are neither saved nor restored; a resume with another training config and
``resume=false`` on a used run directory are refused in one line (``overwrite=true`` clears the
old run); every ``dlc-jax`` user error is one line (``--debug``: traceback).

Real parts only: orbax checkpoints on disk damaged byte-wise, the ``dlc-jax`` entry point in
process.
"""

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dlc_jax.bench.soak.trainer_harness import flip_bytes, truncate
from dlc_jax.trainer.checkpoint import (
    Checkpointer,
    CheckpointError,
    restore_train_state,
    save_train_state,
)
from dlc_jax.trainer.state import TrainState, apply_updates


# ---- checkpoints (no model: a small TrainState of plain arrays) -------------------------------
def _state(step: int, scale: float = 1.0) -> TrainState:
    k = jax.random.key(step)
    params = {"w": jax.random.normal(k, (64, 256)) * scale, "b": jnp.arange(8.0) + step}
    opt = {"mu": jnp.full((64, 256), 0.1 * step), "count": jnp.asarray(step, jnp.int32)}
    st = TrainState(graphdef=None, params=params, opt_state=opt, step=step)
    st.snapshots = {step: params}
    st.synced_version = step
    return st


def _blank() -> TrainState:
    return _state(0, scale=0.0)


def _save_steps(ck: Checkpointer, steps) -> None:
    for s in steps:
        assert save_train_state(ck, _state(s), {"data_state": {"i": s}}, force=True)


def _warnings(caplog) -> list[str]:
    """Our own warnings (orbax may also log an asyncio "exception was never retrieved" error with
    a traceback when a read fails, depending on which bytes were damaged: not ours to word)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("dlc_jax")
    ]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_newest_checkpoint_falls_back_to_newest_good(tmp_path, caplog, damage):
    ck = Checkpointer(tmp_path / "ck", keep=3)
    _save_steps(ck, [1, 2, 3])
    if damage == "flip":
        flip_bytes(Path(ck.directory) / "3", 300, seed=1)
    else:
        truncate(Path(ck.directory) / "3")
    st = _blank()
    caplog.set_level(logging.WARNING, logger="dlc_jax")
    meta = restore_train_state(ck, st)
    assert meta["step"] == 2 and st.step == 2 and st.synced_version == 2
    np.testing.assert_array_equal(np.asarray(st.params["w"]), np.asarray(_state(2).params["w"]))
    msgs = _warnings(caplog)
    assert any("ck/3" in m and "corrupt" in m for m in msgs), msgs
    assert all("\n" not in m for m in msgs)
    # the bad step is out of the way: the resumed run can save step 3 again, the old one is kept
    assert ck.all_steps() == [1, 2]
    assert [p.name.split("-")[0] for p in (Path(ck.directory) / "corrupt").iterdir()] == ["3"]
    assert save_train_state(ck, _state(3), {"data_state": {}}, force=True)
    assert ck.all_steps() == [1, 2, 3]


def test_every_checkpoint_corrupt_refuses_in_one_line(tmp_path):
    ck = Checkpointer(tmp_path / "ck", keep=2)
    _save_steps(ck, [1, 2])
    flip_bytes(Path(ck.directory) / "2", 300, seed=2)
    truncate(Path(ck.directory) / "1")
    with pytest.raises(CheckpointError) as e:
        restore_train_state(ck, _blank())
    msg = str(e.value)
    assert "\n" not in msg and "step 2" in msg and "step 1" in msg and "overwrite=true" in msg
    assert ck.all_steps() == [1, 2]  # nothing moved when there is nothing to fall back to


def test_nonfinite_state_is_neither_saved_nor_restored(tmp_path):
    import orbax.checkpoint as ocp

    ck = Checkpointer(tmp_path / "ck", keep=2)
    bad = _state(1)
    bad.params = dict(bad.params, b=bad.params["b"].at[3].set(jnp.nan))
    with pytest.raises(CheckpointError, match="non-finite"):
        save_train_state(ck, bad, {}, force=True)
    assert ck.all_steps() == []
    # a NaN checkpoint written by something else (no checksums): refused on restore
    from dlc_jax.trainer.checkpoint import state_tree

    mgr = ocp.CheckpointManager(
        Path(ck.directory),
        options=ocp.CheckpointManagerOptions(create=True),
        item_names=("state", "meta"),
    )
    meta = {"step": 1, "synced_version": 1, "snapshot_versions": [1]}
    mgr.save(
        1,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state_tree(bad)), meta=ocp.args.JsonSave(meta)
        ),
    )
    mgr.wait_until_finished()
    mgr.close()
    ck2 = Checkpointer(tmp_path / "ck")
    with pytest.raises(CheckpointError, match=r"non-finite values in \['params'\]\['b'\]"):
        restore_train_state(ck2, _blank())


class _BadDisk(Checkpointer):
    """A checkpointer whose disk corrupts the newest save right after orbax wrote it (the real
    files are damaged; the verification that reads them back is the real one)."""

    def restore_state(self, abstract_state, step=None, *, meta=None):
        if step == self.damage_step:
            flip_bytes(Path(self.directory) / str(step), 300, seed=3)
        return super().restore_state(abstract_state, step, meta=meta)


def test_save_that_does_not_verify_never_rotates_out_the_last_good(tmp_path):
    ck = _BadDisk(tmp_path / "ck", keep=1)
    ck.damage_step = 2
    _save_steps(ck, [1])
    with pytest.raises(CheckpointError, match="did not verify"):
        save_train_state(ck, _state(2), {}, force=True)
    assert ck.all_steps() == [1]  # keep=1, and the good step 1 is still there
    st = _blank()
    assert restore_train_state(Checkpointer(tmp_path / "ck"), st)["step"] == 1
    ck.damage_step = None
    _save_steps(ck, [3])
    assert ck.all_steps() == [3]  # a verified save rotates as usual


def test_apply_updates_skips_nonfinite_gradients():
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
    params = {"w": jnp.ones(4), "b": jnp.zeros(2)}
    opt = tx.init(params)
    step = jax.jit(lambda p, o, g: apply_updates(tx, p, o, g))
    for poison in (jnp.nan, jnp.inf):
        grads = {"w": jnp.array([1.0, poison, 0.0, 2.0]), "b": jnp.ones(2)}
        p2, o2 = step(params, opt, grads)
        jax.tree.map(
            lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
            (p2, o2),
            (params, opt),
        )
    p3, o3 = step(params, opt, {"w": jnp.ones(4), "b": jnp.ones(2)})
    assert not np.allclose(np.asarray(p3["w"]), 1.0) and int(o3[1][0].count) == 1


# ---- the run directory: config fingerprint, resume=false ---------------------------------------
def test_config_diff_names_training_keys_only():
    from dlc_jax.trainer.config import default_config_path, load_config, to_dict
    from dlc_jax.trainer.run_dir import ConfigMismatchError, check_resume_config

    base = to_dict(load_config(default_config_path()))
    meta = {"step": 4, "config": base}
    moved = to_dict(
        load_config(
            default_config_path(),
            [
                "log.dir=/elsewhere",
                "checkpoint.dir=/x",
                "train.steps=999",
                "sampler.address=h:1",
                "train.micro_batches=2",
            ],
        )
    )
    check_resume_config(meta, moved, allow_change=False, where="ck")  # not training-relevant
    other = to_dict(
        load_config(default_config_path(), ["loss.name=ppo_clip", "resync.policy=never"])
    )
    with pytest.raises(ConfigMismatchError) as e:
        check_resume_config(meta, other, allow_change=False, where="ck")
    msg = str(e.value)
    assert "\n" not in msg and "loss.name: 'dlc' -> 'ppo_clip'" in msg and "resync.policy" in msg
    check_resume_config(meta, other, allow_change=True, where="ck")  # told to: a warning only


def test_resume_false_on_used_dir_refuses_and_overwrite_clears(tmp_path):
    from dlc_jax.trainer.run_dir import RunDirInUseError, prepare_fresh_start

    ck = Checkpointer(tmp_path / "ck", keep=2)
    _save_steps(ck, [1, 2])
    logs = tmp_path / "logs"
    (logs / "tb").mkdir(parents=True)
    (logs / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirInUseError, match="overwrite=true"):
        prepare_fresh_start(ck, logs, overwrite=False)
    assert ck.all_steps() == [1, 2] and (logs / "metrics.jsonl").exists()
    prepare_fresh_start(ck, logs, overwrite=True)
    assert ck.all_steps() == [] and not (logs / "metrics.jsonl").exists()
    assert not (logs / "tb").exists()
    prepare_fresh_start(ck, logs, overwrite=False)  # empty: nothing to refuse


# ---- the dlc-jax entry point: one line per user error -----------------------------------------
def _main(capsys, *argv):
    from dlc_jax.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_user_errors_are_one_line(tmp_path, capsys):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("train: {steps: 3\nloss: [\n")
    cases = {
        ("train", f"model.path={tmp_path}/no_model", "sft.enabled=false"): "does not exist",
        ("train", "--config", str(bad_yaml)): "YAML",
        ("train", "--config", str(tmp_path / "nope.yaml")): "no such file",
        ("train", "optim.lrr=1"): "unknown config key",
        (
            "export",
            "--checkpoint",
            str(tmp_path / "no_ckpt"),
            "--out",
            str(tmp_path / "o"),
        ): "no checkpoint",
        ("make-tiny", str(bad_yaml)): "exists",
    }
    for argv, needle in cases.items():
        rc, _, err = _main(capsys, *argv)
        line = _one_error_line(err)
        assert rc != 0 and line.startswith(f"dlc-jax {argv[0]}") and needle in line, (argv, err)
    assert not (tmp_path / "no_ckpt").exists()  # reading a missing checkpoint dir creates nothing
    with pytest.raises(FileExistsError):  # --debug: the traceback
        _main(capsys, "--debug", "make-tiny", str(bad_yaml))
