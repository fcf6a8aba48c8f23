"""The hostile-input soak's cases by class, each recording its outcomes in a `Tally`: reward
plug-ins returning huge values or wrong types, or spawning children; exports of corrupt
checkpoints; data edges (bad UTF-8, empty or unreachable data sets); config and plan out of range.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import textwrap
import time
from pathlib import Path

from .trainer import _train_args
from .trainer_harness import Tally, flip_bytes, kill_all, metric_rows, run_dlc, truncate

REWARDS = textwrap.dedent("""
    import subprocess, sys

    def _half(ids, bad, good=1.0):
        return [bad if i.endswith("/0") else good for i in ids]

    def huge32(prompts, completions, answers, *, ids, **kw):
        return _half(ids, 1e39)

    def huge20(prompts, completions, answers, *, ids, **kw):
        return _half(ids, 1e20)

    def as_str(prompts, completions, answers, **kw):
        return "1" * len(completions)

    def as_dict(prompts, completions, answers, **kw):
        return {i: 1.0 for i in range(len(completions))}

    def no_kwargs(prompts, completions, answers):
        return [1.0] * len(completions)

    def spawns(prompts, completions, answers, *, pidfile, **kw):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(pidfile, "a") as f:
            f.write(f"{p.pid}\\n")
        return [1.0] * len(completions)
""")

# metrics that must be finite numbers in every row of a run that finished
FINITE_KEYS = ("reward_mean", "reward_std", "grad_norm", "loss/loss")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _nonfinite_rows(rows: list[dict]) -> int:
    """How many ``rows`` have a `FINITE_KEYS` value that is not a finite number."""
    finite = lambda v: isinstance(v, (int, float)) and math.isfinite(v)
    return sum(not all(finite(r[k]) for k in FINITE_KEYS if k in r) for r in rows)


def reward_cases(model: Path, work: Path, t: Tally, counts: dict, timeout: float) -> None:
    plug = work / "plug"
    plug.mkdir(exist_ok=True)
    (plug / "soak_rewards.py").write_text(REWARDS)
    env = {"PYTHONPATH": os.pathsep.join([str(plug), os.environ.get("PYTHONPATH", "")])}
    budget = ("reward.workers=1", "reward.window=2", "reward.max_failed_fraction=0.9")
    finishing = {"huge32": "1e39 (inf in float32)", "huge20": "1e20 (variance overflows)"}

    def train(name: str, steps: int, key: str):
        run = work / f"rw_{name}"
        return run, run_dlc(_train_args(model, run, steps, key, *budget), timeout, env=env)

    for fn, what in finishing.items():
        run, o = train(fn, 3, f"reward.fn=soak_rewards:{fn}")
        rows = metric_rows(run / "logs")
        bad = _nonfinite_rows(rows)
        counts["nan_metric_rows"] += bad
        ok = o.rc == 0 and len(rows) == 3 and bad == 0 and not o.traceback
        t.record(f"reward: returns {what} on half the samples", o, ok, crash=o.rc != 0)
    stopping = {"as_str": "a str", "as_dict": "an int-keyed dict", "no_kwargs": "no **kw"}
    for fn, what in stopping.items():
        run, o = train(fn, 6, f"reward.fn=soak_rewards:{fn}")
        named = any(f"soak_rewards:{fn}" in ln for ln in o.error_lines)
        counts["nan_metric_rows"] += _nonfinite_rows(metric_rows(run / "logs"))
        ok = o.one_line_error() and named
        t.refusal(f"reward: {what}, every call (budget stop)", o, ok)
    pidfile = work / "spawned.pids"
    spec = {"fn": "soak_rewards:spawns", "kwargs": {"pidfile": str(pidfile)}}
    _, o = train("spawns", 2, f"reward.fns.s={json.dumps(spec)}")
    time.sleep(1.0)
    pids = [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []
    left = [p for p in pids if _alive(p)]
    kill_all(left)
    counts["orphans"] += len(left)
    ok = o.rc == 0 and bool(pids) and not left
    t.record("reward: spawns a child per call", o, ok, crash=o.rc != 0)


def _make_checkpoint(model: Path, d: Path, *, nan: bool = False) -> Path:
    """A checkpoint of ``model`` in the trainer's layout (step 4); ``nan``: one NaN weight, written
    past the save-time checks as a corrupted run would leave it."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from flax import nnx

    from dlc_jax.model import load_hf
    from dlc_jax.trainer.checkpoint import Checkpointer, array_checksums
    from dlc_jax.trainer.config import OptimSection, load_config, to_dict
    from dlc_jax.trainer.state import TrainState, make_optimizer

    cfg = load_config(None, [f"model.path={model}", "sft.enabled=false", "sampler.backend=jax"])
    m = load_hf(str(model))
    if nan:
        _, params = nnx.split(m, nnx.Param)
        leaves, treedef = jax.tree.flatten(params)
        leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.nan)
        nnx.update(m, jax.tree.unflatten(treedef, leaves))
    st = TrainState.create(m, make_optimizer(OptimSection(), 10))
    tree = {"params": st.params, "opt_state": st.opt_state, "snapshots": {}}
    meta = {"step": 4, "synced_version": 4, "snapshot_versions": [], "config": to_dict(cfg)}
    ck = Checkpointer(d)
    if nan:
        d.mkdir(parents=True, exist_ok=True)
        meta = dict(meta, checksums=array_checksums(tree)[0])
        args = ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta))
        ck._mgr.save(4, args=args, force=True)
        ck._mgr.wait_until_finished()
    else:
        ck.save(4, tree, meta, force=True)
    ck.close()
    return d


def export_cases(model: Path, work: Path, t: Tally, counts: dict, timeout: float) -> None:
    good = _make_checkpoint(model, work / "exp_good")
    # bit flips: 3,000 bytes of the array data (params are a third of it)
    damages = {"bit flips": lambda d: flip_bytes(d, 3000, seed=1), "truncation": truncate}
    cases: dict[str, Path] = {}
    for what, damage in damages.items():
        d = work / f"exp_{what.replace(' ', '_')}"
        shutil.copytree(good, d)
        damage(d / "4")
        cases[what] = d
    cases["NaN params (checksums match)"] = _make_checkpoint(model, work / "exp_nan", nan=True)
    for what, d in cases.items():
        out = work / f"hf_{d.name}"
        o = run_dlc(["export", "--checkpoint", str(d), "--out", str(out)], timeout)
        written = out.exists() and any(out.iterdir())
        counts["corrupt_exported"] += int(o.rc == 0 or written)
        t.refusal(f"export: {what}", o, ok=o.one_line_error() and not written)
    out = work / "hf_nonempty"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    o = run_dlc(["export", "--checkpoint", str(good), "--out", str(out)], timeout)
    kept = (out / "mine.txt").exists()
    t.refusal("export: non-empty --out", o, ok=o.one_line_error() and kept)
    o = run_dlc(["export", "--checkpoint", str(good), "--out", str(out), "--overwrite"], timeout)
    t.record("export: --overwrite", o, ok=o.rc == 0 and (out / "config.json").exists())


def data_cases(model: Path, work: Path, t: Tally, timeout: float) -> None:
    import datasets

    d = work / "data"
    d.mkdir(exist_ok=True)
    row = json.dumps({"prompt": "1+1=", "answer": "2"})
    (d / "bad_utf8.jsonl").write_bytes(row.encode() + b'\n{"prompt": "x\xff", "answer": "1"}\n')
    (d / "surrogate.jsonl").write_text(row + '\n{"prompt": "a\\ud800", "answer": "1"}\n')
    (d / "six.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(6))
    )
    datasets.Dataset.from_dict({"prompt": [], "answer": []}).save_to_disk(str(d / "empty"))
    datasets.Dataset.from_dict({"prompt": ["1+1="], "answer": ["2"]}).save_to_disk(str(d / "one"))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)  # accepts, never answers
    hub = {
        "HF_ENDPOINT": f"http://127.0.0.1:{srv.getsockname()[1]}",
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "HF_HOME": str(work / "hf_home"),
    }
    cases = {
        "non-UTF-8 byte in JSONL": ([f"data.source={d}/bad_utf8.jsonl"], {}, "bad_utf8.jsonl:2"),
        "lone surrogate in JSONL": ([f"data.source={d}/surrogate.jsonl"], {}, "surrogate.jsonl:2"),
        "empty HF data set": ([f"data.source=hf:{d}/empty"], {}, "no rows"),
        "split of a single Dataset": (
            [f"data.source=hf:{d}/one", "data.split=test"],
            {},
            "data.split",
        ),
        "hub endpoint that never answers": (
            ["data.source=hf:someone/some_data", "data.timeout_s=5"],
            hub,
            "data.timeout_s",
        ),
        "rows run out with data.epochs=1": (
            [f"data.source={d}/six.jsonl", "data.epochs=1"],
            {},
            "data.epochs=1",
        ),
    }
    try:
        for what, (extra, env, needle) in cases.items():
            run = work / f"data_{len(t.rows)}"
            o = run_dlc(_train_args(model, run, 6, *extra), timeout, env=env)
            named = any(needle in ln for ln in o.error_lines)
            t.refusal(f"data: {what}", o, ok=o.one_line_error() and named)
    finally:
        srv.close()


def config_plan_cases(work: Path, t: Tally, timeout: float) -> None:
    deep = work / "deep.yaml"
    deep.write_text("train: " + "[" * 5000 + "]" * 5000 + "\n")
    latin = work / "latin.yaml"
    latin.write_bytes(b"log:\n  wandb_run_name: caf\xe9\n")
    plan = ["plan", "--config", "tiny_cpu"]
    cases = {
        "mesh.data=0": ["train", "mesh.data=0"],
        "optim.lr=inf": ["train", "optim.lr=inf"],
        "optim.weight_decay=nan": ["train", "optim.weight_decay=nan"],
        "sampler.max_model_len=0": ["train", "sampler.max_model_len=0"],
        "YAML nested 5,000 deep": ["train", "--config", str(deep)],
        "non-UTF-8 config file": ["train", "--config", str(latin)],
        "plan v5p:0x0x0": [*plan, "--topology", "v5p:0x0x0"],
        "plan v5e:0x4": [*plan, "--topology", "v5e:0x4"],
        "plan v5p:3x3x3": [*plan, "--topology", "v5p:3x3x3"],
        "plan sampler.max_model_len=0": [*plan, "--topology", "v5p-8", "sampler.max_model_len=0"],
        "train --bogus": ["train", "--bogus"],
        "export without --out": ["export", "--checkpoint", str(work)],
        "plan without --config": ["plan"],
        "sampler without a subcommand": ["sampler"],
        "bench nope": ["bench", "nope"],
        "experiment --preset nope": ["experiment", "--preset", "nope"],
        "make-tiny --bogus": ["make-tiny", "--bogus"],
    }
    for what, args in cases.items():
        o = run_dlc(args, timeout)
        prefix = all(ln.startswith(f"dlc-jax {args[0]}: error: ") for ln in o.error_lines)
        ok = o.one_line_error() and prefix
        t.record(f"config/plan: {what}", o, ok=ok, multi_line=o.rc not in (0, None) and not ok)
