"""docs/BYO.md, literally: its three files are written from the doc's code blocks and its commands
run in a fresh folder (the TensorBoard command is replaced by reading the event files back). Own
model via model.path + base: tiny_cpu, a 20-row GSM8K-style dataset saved with ``datasets``, a
plug-in reward next to math_verify, eval accuracy, sample completions, grouped TensorBoard tags and
an offline wandb run; the output has no fork warning and no wandb banner."""

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("datasets")
pytest.importorskip("wandb")

DOC = Path(__file__).resolve().parents[2] / "docs" / "BYO.md"


def _doc_parts():
    text = DOC.read_text()
    files = dict(re.findall(r"\*\*`([\w.]+)`\*\*.*?```\w+\n(.*?)```", text, re.S))
    commands = re.search(r"\*\*The three commands\*\*.*?```bash\n(.*?)```", text, re.S)
    assert commands, "docs/BYO.md: no three-commands block"
    return files, [c for c in commands.group(1).splitlines() if c.strip()]


def _tb_tags(tb_dir: Path) -> set[str]:
    from tensorboardX.proto import event_pb2

    tags = set()
    for f in tb_dir.glob("events.out.tfevents.*"):
        data, off = f.read_bytes(), 0
        while off < len(data):
            (n,) = struct.unpack("<Q", data[off : off + 8])
            ev = event_pb2.Event.FromString(data[off + 12 : off + 12 + n])
            tags |= {v.tag for v in ev.summary.value}
            off += 12 + n + 4
    return tags


def test_byo_doc_end_to_end(tmp_path):
    files, commands = _doc_parts()
    assert set(files) == {"prepare.py", "my_rewards.py", "byo.yaml"}
    assert len(commands) == 3 and commands[2].startswith("tensorboard --logdir ")
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("WANDB_MODE", None)
    outs = []
    for cmd in commands[:2]:
        p = subprocess.run(
            ["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
        )
        assert p.returncode == 0, f"{cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        outs.append(p)
    train = outs[1]
    logs = tmp_path / "runs" / "byo" / "logs"
    # the summary names the model the user gave; no SFT warm-up ran on it
    last = json.loads([ln for ln in train.stdout.splitlines() if ln.startswith("{")][-1])
    assert last["model"] == "my_model" and "sft:" not in train.stdout
    assert {"reward_first_10pct", "reward_last_10pct", "eval_accuracy_last"} <= set(last)
    # plain progress line (stdout is a pipe), no fork warning, no wandb banner
    assert "step 6/6 | reward" in train.stdout
    assert "os.fork()" not in train.stderr and "wandb: Run history" not in train.stderr
    assert not [ln for ln in train.stderr.splitlines() if ln.startswith("wandb:")]
    rows = [json.loads(x) for x in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:  # the weighted plug-in + math_verify reward, each logged
        assert r["reward_mean"] == pytest.approx(0.5 * r["reward/fmt"] + r["reward/acc"], abs=1e-6)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals:
        assert 0.0 <= r["eval/accuracy"] <= 1.0 and r["eval/accuracy"] * 4 == int(
            r["eval/accuracy"] * 4
        )
        assert 0.0 <= r["eval/reward_mean"] <= 1.5
    samples = [json.loads(x) for x in (logs / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 2, 4, 4, 6, 6]
    for s in samples:
        assert s["prompt"].startswith("Tom has") and s["answer"].isdigit()
        assert {"response", "reward", "delta_mean", "ell_mean", "tokens"} <= set(s)
        assert s["reward"] in (0.0, 0.5, 1.0, 1.5)
    tags = _tb_tags(logs / "tb")
    groups = {t.split("/")[0] for t in tags}
    assert {"reward", "mismatch", "ess", "loss", "system", "eval"} <= groups
    assert {"eval/accuracy", "reward/fmt", "reward/acc", "ess/lag"} <= tags
    assert {"config/text_summary", "samples/text_summary"} <= tags  # TensorBoard text
    assert not [t for t in tags if "/" not in t]
    runs = list((logs / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    deadline, record = time.time() + 60, b""  # written by wandb's service process
    while time.time() < deadline and b"eval/accuracy" not in record:
        time.sleep(0.5)
        record = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"eval/accuracy" in record
