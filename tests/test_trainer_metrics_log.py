import json

import jax.numpy as jnp
import numpy as np

from dlc_jax.trainer.metrics_log import MetricsLogger


def test_jsonl_tensorboard_and_summary(tmp_path):
    m = MetricsLogger(tmp_path, progress=True, total_steps=3)
    for s in range(3):
        m.log(s, {"reward_mean": jnp.float32(0.1 * s), "ess_lag": np.float64(1.0 - 0.2 * s), "resync_count": s,
                  "vec": np.ones(3), "nan": float("nan")})
    path = m.write_summary({"checkpoint": "x"})
    m.close()
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert abs(rows[2]["reward_mean"] - 0.2) < 1e-6 and rows[1]["resync_count"] == 1
    assert "vec" not in rows[0] and rows[0]["nan"] is None
    s = json.loads(path.read_text())
    assert s["ess_lag"]["first"] == 1.0 and abs(s["ess_lag"]["min"] - 0.6) < 1e-12 and s["checkpoint"] == "x"
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100
    from tensorboardX.proto import event_pb2  # read back the event file independently
    import struct

    data = events[0].read_bytes()
    tags, off = set(), 0
    while off < len(data):
        (n,) = struct.unpack("<Q", data[off:off + 8])
        ev = event_pb2.Event.FromString(data[off + 12: off + 12 + n])
        tags |= {v.tag for v in ev.summary.value}
        off += 12 + n + 4
    assert {"reward_mean", "ess_lag", "resync_count"} <= tags


def test_resume_append_drops_rows_past_checkpoint(tmp_path):
    m = MetricsLogger(tmp_path, tensorboard=False, progress=False)
    for s in range(1, 6):
        m.log(s, {"x": s})
    m.close()
    m = MetricsLogger(tmp_path, tensorboard=False, progress=False, append=True, initial_step=3)
    m.log(4, {"x": 40})
    m.close()
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1), (2, 2), (3, 3), (4, 40)]
