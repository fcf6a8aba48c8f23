"""The trainer's runs as a careless user would treat them: a damaged checkpoint, another config or
``resume=false`` on a used run directory, in real runs; a non-finite loss/gradient is not applied
nor pushed and repeated ones stop the run; Ctrl-C saves, says where and exits 130; an unreachable
``sampler.address`` fails within ``sampler.connect_timeout_s``; a sampler's limits and refusals.

Real parts only: tiny models, the in-process JAX sampler (the JAX backend spawned on loopback where
the sampler's process is what a test is about), the ``dlc-jax`` entry point (in process, or as a
subprocess for signals). The checkpoint and entry-point checks without a run are in
tests/unit/test_trainer_hostile_checkpoints.py.
"""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from xla_env import xla_flags

from dlc_jax.bench.soak.trainer_harness import flip_bytes
from dlc_jax.trainer.checkpoint import Checkpointer


def _main(capsys, *argv):
    from dlc_jax.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- real runs (tiny model, the in-process JAX sampler) ----------------------------------
def _args(tiny_dir, d, *extra):
    return [
        "train",
        f"model.path={tiny_dir}",
        "sft.enabled=false",
        "sampler.backend=inprocess",
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
            "sampler.backend=jax",
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
    env = dict(os.environ, XLA_FLAGS=xla_flags())
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
    from dlc_jax.sampler.service.process import SamplerProcess

    port = _free_port()
    args = ["--max-model-len", "32", "--max-head-k", "1"]
    proc = SamplerProcess("jax", str(tiny_dir), port=port, extra_args=args).start()
    try:
        addr = f"sampler.address=127.0.0.1:{port}"
        jax_backend = "sampler.backend=jax"  # a sampler process: its limits are the subject
        rc, out, err = _main(
            capsys,
            *_args(
                tiny_dir,
                tmp_path / "a",
                "train.steps=2",
                jax_backend,
                addr,
                "sampler.max_model_len=64",
            ),
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
                jax_backend,
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
