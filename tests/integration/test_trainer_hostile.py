"""The trainer as a hostile disk and a careless user would treat it.

Checkpoints: bit flips / truncations of the newest step are reported in one line and the run falls
back to the newest good step; a save that does not verify never rotates out the last good one;
non-finite arrays are neither saved nor restored. Runs: a resume with another training config and
``resume=false`` on a used run directory are refused in one line (``overwrite=true`` clears the
old run); a non-finite loss/gradient is not applied nor pushed and repeated ones stop the run;
Ctrl-C saves, says where and exits 130; an unreachable ``sampler.address`` fails within
``sampler.connect_timeout_s``; every ``dlc-jax`` user error is one line (``--debug``: traceback).

Real parts only: orbax checkpoints on disk damaged byte-wise, tiny models, the JAX sampler backend
spawned on loopback, the ``dlc-jax`` entry point (in process, or as a subprocess for signals).
"""

import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dlc_jax.bench.soak_trainer_harness import flip_bytes, truncate
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
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


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


# ---- real runs (tiny model, JAX sampler spawned on loopback) ----------------------------------
def _args(tiny_dir, d, *extra):
    return [
        "train",
        f"model.path={tiny_dir}",
        "sft.enabled=false",
        "sampler.backend=jax",
        "sampler.n=2",
        "sampler.max_tokens=4",
        "sampler.head_k=2",
        "train.batch_prompts=2",
        "async.prefetch=0",
        "resync.policy=every_k",
        "resync.k=1",
        "optim.lr=3e-3",
        "log.progress=false",
        "log.tensorboard=false",
        f"log.dir={d}/logs",
        f"checkpoint.dir={d}/ckpt",
        "checkpoint.every=1",
        "checkpoint.keep=2",
        *extra,
    ]


def _metric_steps(d) -> list[int]:
    p = Path(d) / "logs" / "metrics.jsonl"
    return [json.loads(ln)["step"] for ln in p.read_text().splitlines()] if p.exists() else []


@pytest.mark.slow
def test_resume_guards_end_to_end(tiny_dir, tmp_path, capsys):
    """Damaged newest checkpoint -> one-line report, resume from the newest good one; another
    loss -> refused naming the key; resume=false on the used dir -> refused; overwrite=true -> the
    old run's checkpoints and metrics are gone."""
    d = tmp_path / "run"
    rc, out, err = _main(capsys, *_args(tiny_dir, d, "train.steps=2"))
    assert rc == 0 and Checkpointer(d / "ckpt").all_steps() == [1, 2], err[-2000:]
    flip_bytes(d / "ckpt" / "2", 300, seed=5)
    rc, out, err = _main(capsys, *_args(tiny_dir, d, "train.steps=3"))
    assert rc == 0, err[-2000:]
    bad = [ln for ln in out.splitlines() if "ckpt/2" in ln and "corrupt" in ln]
    assert len(bad) == 1, out[-3000:]
    assert "at step 1 " in out and "Traceback" not in out + err
    assert Checkpointer(d / "ckpt").all_steps() == [2, 3] and _metric_steps(d) == [1, 2, 3]

    before = sorted(os.listdir(d / "ckpt"))
    rc, out, err = _main(capsys, *_args(tiny_dir, d, "train.steps=5", "loss.name=ppo_clip"))
    line = _one_error_line(err)
    assert rc == 2 and "loss.name: 'dlc' -> 'ppo_clip'" in line and "allow_config_change" in line
    assert sorted(os.listdir(d / "ckpt")) == before and "resumed" not in out

    rc, out, err = _main(capsys, *_args(tiny_dir, d, "train.steps=1", "checkpoint.resume=false"))
    assert rc == 2 and "overwrite=true" in _one_error_line(err)
    rc, out, err = _main(
        capsys,
        *_args(
            tiny_dir, d, "train.steps=0", "checkpoint.resume=false", "checkpoint.overwrite=true"
        ),
    )
    assert rc == 0, err[-2000:]
    assert Checkpointer(d / "ckpt").all_steps() == [0] and _metric_steps(d) == []


@pytest.mark.slow
def test_nonfinite_steps_are_skipped_then_stop_the_run(tiny_dir, tmp_path):
    """lr=1e15: step 1 moves every weight by ~1e15 (finite), after which the forward pass
    overflows and every loss is non-finite: those updates are not applied or pushed, and the
    third in a row stops the run."""
    from dlc_jax.trainer.build import build_trainer
    from dlc_jax.trainer.config import default_config_path, load_config
    from dlc_jax.trainer.loop import NonFiniteTrainingError

    d = tmp_path / "nan"
    # a format reward (response contains an "e") gives the untrained model's groups variance
    cfg = load_config(
        default_config_path(),
        _args(
            tiny_dir,
            d,
            "train.steps=8",
            "optim.lr=1e15",
            "resync.policy=never",
            "sampler.n=4",
            "reward.correct=0",
            "reward.format_bonus=1",
            "reward.strict_format=(?s).*e.*",
            "train.max_nonfinite_steps=3",
        )[1:],
    )
    t = build_trainer(cfg)
    with pytest.raises(NonFiniteTrainingError, match="3 steps in a row") as e:
        t.run()
    assert "\n" not in str(e.value)
    assert t.state.step == 1 and t.counters["nonfinite_skipped"] == 3
    assert _metric_steps(d) == [1]  # skipped steps log no row
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(t.state.params))
    assert Checkpointer(d / "ckpt").all_steps() == [1]  # the exit save: step 1, finite


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_unreachable_sampler_address_fails_fast_in_one_line(tiny_dir, tmp_path, capsys):
    port = _free_port()  # nothing listens there
    t0 = time.time()
    rc, out, err = _main(
        capsys,
        *_args(
            tiny_dir,
            tmp_path,
            "train.steps=2",
            f"sampler.address=127.0.0.1:{port}",
            "sampler.connect_timeout_s=2",
        ),
    )
    line = _one_error_line(err)
    assert rc == 2 and f"127.0.0.1:{port}" in line and "connect_timeout_s" in line
    assert time.time() - t0 < 120  # model load + 2 s, not the 600 s reconnect deadline


@pytest.mark.slow
def test_ctrl_c_saves_says_where_and_exits_130(tiny_dir, tmp_path):
    d = tmp_path / "int"
    env = dict(os.environ, XLA_FLAGS="")
    args = _args(tiny_dir, d, "train.steps=200", "checkpoint.every=0")
    p = subprocess.Popen(
        [sys.executable, "-m", "dlc_jax.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 600
    while time.time() < deadline and p.poll() is None and len(_metric_steps(d)) < 1:
        time.sleep(0.1)
    assert p.poll() is None
    os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130, err[-3000:]
    assert (
        "Traceback" not in out + err
        and err.strip().splitlines()[-1] == "dlc-jax train: interrupted"
    )
    steps = Checkpointer(d / "ckpt").all_steps()
    assert len(steps) == 1 and steps[0] >= 1  # checkpoint.every=0: the save on Ctrl-C
    assert f"interrupted at step {steps[0]}: checkpoint {d / 'ckpt'} (step {steps[0]})" in out
    assert "running the same command again" in out


@pytest.mark.slow
def test_sampler_limits_and_invalid_requests_are_not_respawned(tiny_dir, tmp_path, capsys):
    """A sampler with a shorter max_model_len is refused at connect (one line); a request it
    answers INVALID_ARGUMENT (head_k above its --max-head-k) stops the run in one line at once,
    without the reconnect/respawn cycle (a new sampler would refuse it too)."""
    from dlc_jax.sampler.process import SamplerProcess

    port = _free_port()
    args = ["--max-model-len", "32", "--max-head-k", "1"]
    proc = SamplerProcess("jax", str(tiny_dir), port=port, extra_args=args).start()
    try:
        addr = f"sampler.address=127.0.0.1:{port}"
        rc, out, err = _main(
            capsys,
            *_args(tiny_dir, tmp_path / "a", "train.steps=2", addr, "sampler.max_model_len=64"),
        )
        line = _one_error_line(err)
        assert rc == 2 and "max_model_len 32 < sampler.max_model_len 64" in line
        t0 = time.time()
        rc, out, err = _main(
            capsys,
            *_args(
                tiny_dir,
                tmp_path / "b",
                "train.steps=2",
                addr,
                "sampler.max_model_len=32",
                "sampler.head_k=2",
            ),
        )
        line = _one_error_line(err)
        assert rc == 2 and "refused a request as invalid" in line and "head_k" in line, line
        assert "reconnecting" not in out and time.time() - t0 < 300
        assert proc.client().info()["version"] == 0  # nothing was pushed
    finally:
        proc.stop()


@pytest.mark.slow
def test_prompt_the_sampler_refuses_is_dropped_counted_and_named(tiny_dir, tmp_path, capsys):
    """A prompt with a token id outside the sampler's vocabulary (the tokenizer knows one token
    more than the model: it passes the trainer's load checks) is refused as INVALID_ARGUMENT: its
    batch is asked for again one slot per request, that prompt alone is dropped (one warning
    naming its data row, ``dropped_invalid`` counted), and every step still trains -- no
    reconnect, no respawn."""
    import shutil

    from tokenizers import Tokenizer

    m = tmp_path / "model"
    shutil.copytree(tiny_dir, m)
    vocab = json.loads((m / "config.json").read_text())["vocab_size"]
    tok = Tokenizer.from_file(str(m / "tokenizer.json"))
    tok.add_tokens(["<|beyond|>"])
    assert tok.token_to_id("<|beyond|>") == vocab  # one past the model's embeddings
    tok.save(str(m / "tokenizer.json"))
    data = tmp_path / "data.jsonl"
    rows = [f"What is {i} + 1?" for i in range(4)]
    rows[1] = "What is <|beyond|> + 1?"
    data.write_text(
        "".join(json.dumps({"prompt": p, "answer": str(i + 1)}) + "\n" for i, p in enumerate(rows))
    )
    d = tmp_path / "run"
    rc, out, err = _main(
        capsys,
        *_args(m, d, "train.steps=2", f"data.source={data}", "data.shuffle=false"),
    )
    assert rc == 0, err[-3000:]
    named = [ln for ln in out.splitlines() if "refused prompt slot" in ln]
    assert len(named) == 1 and "data row 1" in named[0] and "vocabulary" in named[0], out[-3000:]
    assert "reconnecting" not in out and "respawn" not in out.lower()
    metrics = [json.loads(ln) for ln in (d / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == [1, 2]
    assert [r["dropped_invalid"] for r in metrics] == [1, 1]  # cumulative
    assert [r["reconnects"] for r in metrics] == [0, 0]
    assert all(math.isfinite(r["loss/loss"]) for r in metrics)
