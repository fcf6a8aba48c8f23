"""MetricsLogger: metrics.jsonl rows, grouped TensorBoard tags read back from the event file, resume
(rows past the checkpoint dropped, a half-written line skipped, summary over the whole run), window
means, the plain progress line, sample completions, an offline wandb run."""

import json
import struct

import jax.numpy as jnp
import numpy as np
import pytest

from dlc_jax.trainer.metrics_log import MetricsLogger
from dlc_jax.trainer.writers import tb_tag


def _tb_events(tb_dir):
    """(scalar tags, text tags) of every event file under ``tb_dir``, parsed independently."""
    from tensorboardX.proto import event_pb2

    scalars, texts = set(), {}
    for f in tb_dir.glob("events.out.tfevents.*"):
        data, off = f.read_bytes(), 0
        while off < len(data):
            (n,) = struct.unpack("<Q", data[off : off + 8])
            ev = event_pb2.Event.FromString(data[off + 12 : off + 12 + n])
            for v in ev.summary.value:
                if v.HasField("tensor") and v.tensor.string_val:
                    texts[v.tag.split("/")[0]] = v.tensor.string_val[0].decode()
                else:
                    scalars.add(v.tag)
            off += 12 + n + 4
    return scalars, texts


def test_jsonl_grouped_tensorboard_and_summary(tmp_path, capsys):
    m = MetricsLogger(tmp_path, progress=True, total_steps=3, config={"optim": {"lr": 0.5}})
    for s in range(1, 4):
        m.log(
            s,
            {
                "reward_mean": jnp.float32(0.1 * (s - 1)),
                "ess_lag": np.float64(1.0 - 0.2 * (s - 1)),
                "resync_count": s - 1,
                "vec": np.ones(3),
                "nan": float("nan"),
                "head_mass_p": 0.9,
                "loss/head_mass_p": 0.9,
                "delta_mean": 0.01,
                "grad_norm": 1.5,
                "eval/accuracy": 0.25,
                "pool/removed": 0,
            },
        )
    path = m.write_summary({"checkpoint": "x"})
    m.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert abs(rows[2]["reward_mean"] - 0.2) < 1e-6 and rows[1]["resync_count"] == 1
    assert "vec" not in rows[0] and rows[0]["nan"] is None
    s = json.loads(path.read_text())
    assert s["ess_lag"]["first"] == 1.0 and abs(s["ess_lag"]["min"] - 0.6) < 1e-12
    assert s["checkpoint"] == "x"
    tags, texts = _tb_events(tmp_path / "tb")
    assert {
        "reward/mean",
        "ess/lag",
        "system/resync_count",
        "loss/head_mass_p",
        "mismatch/delta_mean",
        "loss/grad_norm",
        "eval/accuracy",
        "pool/removed",
    } <= tags
    assert "_hparams_/experiment" in tags and "_hparams_/session_start_info" in tags  # the config
    tags = {t for t in tags if not t.startswith("_hparams_/")}
    assert "head_mass_p" not in tags and not any("/" not in t for t in tags)
    prefixes = ("reward/", "mismatch/", "ess/", "loss/", "system/", "eval/", "pool/")
    assert all(t.startswith(prefixes) for t in tags)
    assert "lr: 0.5" in texts["config"]
    # not a terminal under pytest: the plain line, only at the last step (every 10 by default)
    out = capsys.readouterr().out
    assert out == "step 3/3 | reward 0.200 | ess 0.600 | resyncs 2 | eval/accuracy 0.250\n"


def test_tb_tag_groups_every_main_job_key():
    row = dict.fromkeys(
        ["delta_q05", "ell_std", "total_mean", "kl_k3", "entropy_mean", "ess_total_gaussian",
         "lr_scale", "reward/acc", "reward_std", "response_len", "step_s", "weight_version",
         "num_tokens", "loss/num_tokens"], 1.0)  # fmt: skip
    tags = {k: tb_tag(k, row) for k in row}
    assert tags["delta_q05"] == "mismatch/delta_q05" and tags["kl_k3"] == "mismatch/kl_k3"
    assert (
        tags["ess_total_gaussian"] == "ess/total_gaussian" and tags["lr_scale"] == "loss/lr_scale"
    )
    assert tags["reward_std"] == "reward/std" and tags["step_s"] == "system/step_s"
    assert tags["num_tokens"] is None and tags["loss/num_tokens"] == "loss/num_tokens"


def test_resume_append_drops_rows_past_checkpoint_and_summarizes_whole_run(tmp_path):
    m = MetricsLogger(tmp_path, tensorboard=False, progress=False)
    for s in range(1, 6):
        m.log(s, {"x": s})
    m.close()
    m = MetricsLogger(tmp_path, tensorboard=False, progress=False, append=True, initial_step=3)
    m.log(4, {"x": 40})
    s = m.summary()
    m.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1), (2, 2), (3, 3), (4, 40)]
    assert s["steps"] == 4 and s["first_step"] == 1 and s["x"]["first"] == 1
    assert s["x"]["mean"] == pytest.approx((1 + 2 + 3 + 40) / 4)


def test_half_written_last_line_skipped_on_resume(tmp_path, caplog):
    m = MetricsLogger(tmp_path, tensorboard=False, progress=False)
    for s in range(1, 4):
        m.log(s, {"x": s})
    m.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "x"')  # killed mid-write
    m = MetricsLogger(tmp_path, tensorboard=False, progress=False, append=True, initial_step=4)
    m.log(4, {"x": 4})
    m.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert "half-written last line" in caplog.text


def test_window_means_and_progress_false_still_prints(tmp_path, capsys):
    m = MetricsLogger(tmp_path, tensorboard=False, progress=False, progress_every=5, total_steps=20)
    for s in range(1, 21):
        m.log(s, {"reward_mean": float(s)})
    s = m.summary()["reward_mean"]
    m.close()
    assert s["first_10pct"] == 1.5 and s["last_10pct"] == 19.5  # 2 of 20 steps each
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert [ln.split(" |")[0] for ln in lines] == ["step 5/20", "step 10/20", "step 15/20",
                                                   "step 20/20"]  # fmt: skip


def test_samples_jsonl_and_tensorboard_text(tmp_path):
    m = MetricsLogger(tmp_path, progress=False)
    rec = {"prompt": "1+1=", "response": "2", "reward": 1.0, "delta_mean": 0.01, "tokens": 1}
    m.log(2, {"reward_mean": 1.0})
    m.log_samples(2, [rec, dict(rec, response="3", reward=0.0)])
    m.close()
    got = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(g["step"], g["response"], g["reward"]) for g in got] == [(2, "2", 1.0), (2, "3", 0.0)]
    _, texts = _tb_events(tmp_path / "tb")
    assert "**response** 3" in texts["samples"]
