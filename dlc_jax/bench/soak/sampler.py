"""Soak the sampler service as a hostile client would, on loopback only: bad inputs, push attacks,
concurrent streams with a push in the middle, distinct sampling values, idle data connections, a
SIGKILL after a push. Counted: crashes, bad weights served, files left behind, attacks accepted,
errors that are not one line.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from pathlib import Path

import grpc
import numpy as np

from .. import common
from .bad_inputs import bad_inputs
from .concurrency import distinct_params, idle_connections, streams_with_push
from .harness import SoakConfig, Tally, make_model, perturbed, start_sampler
from .push_attacks import push_attacks

log = logging.getLogger(__name__)


def _staging_dirs(staging: Path) -> list[str]:
    return [p.name for p in staging.iterdir()] if staging.exists() else []


def _soak_backend(
    backend: str, cfg: SoakConfig, work: Path, t: Tally, metrics: dict, pids: list
) -> None:
    from dlc_jax.sampler.wire import safetensors_io as st
    from dlc_jax.sampler.wire.types import SamplingParams

    model = work / "tiny"
    staging, load_root = work / f"staging_{backend}", work / f"load_{backend}"
    load_root.mkdir(exist_ok=True)
    weights = dict(st.iter_tensors(model))
    proc = start_sampler(backend, model, staging, load_root, cfg, work / f"sampler_{backend}.log")
    pids.append(proc.proc.pid)
    m = metrics.setdefault(backend, {"crashes": 0, "bad_weights_served": 0})
    try:
        client = proc.client(timeout=300, max_retries=0)
        info = client.info()
        vocab, v = info["vocab_size"], info["version"]
        probe_p = SamplingParams(max_tokens=6, temperature=1.0, seed=5, head_k=3)
        baseline = list(client.generate([[5, 6, 7, 8]], probe_p))[0]

        def probe(where: str) -> None:
            if proc.proc.poll() is not None:
                m["crashes"] += 1
                raise RuntimeError(f"{backend} sampler died {where}; log {proc.log_file}")
            try:
                (r,) = list(client.generate([[5, 6, 7, 8]], probe_p))
            except grpc.RpcError as e:
                m["crashes"] += 1
                t.examples.append(f"{backend}: probe failed {where}: {e.code().name} {e.details()}")
                return
            if (
                client.info()["version"] != v
                or not np.isfinite(r.logprobs).all()
                or not np.allclose(r.logprobs, baseline.logprobs, atol=1e-4)
            ):
                m["bad_weights_served"] += 1
                t.examples.append(f"{backend}: served weights changed {where}")

        host = proc.address.rsplit(":", 1)[0]
        bad_inputs(t, client, proc.address, info["data_port"], vocab, cfg)
        probe("after the bad inputs")
        push_attacks(t, client, weights, load_root, probe, v)
        m.update(idle_connections(proc.proc.pid, host, info["data_port"], cfg.idle_connections))
        probe("after the idle connections")
        s = streams_with_push(client, weights, v, cfg.streams, vocab)
        m.update(s)
        m["bad_weights_served"] += s["bad_rollouts"]
        m.update(distinct_params(client, proc.proc.pid, cfg.distinct_params))
        m["bad_weights_served"] += m.pop("nonfinite")
        m["server_alive_at_end"] = proc.proc.poll() is None
        if not m["server_alive_at_end"]:
            m["crashes"] += 1
        client.close()
    finally:
        proc.stop()
    m["staging_left_after_stop"] = len(_staging_dirs(staging))
    if backend != "jax":
        return
    # SIGKILL after a push (no cleanup possible), then a restart on the same staging root
    proc = start_sampler(backend, model, staging, load_root, cfg, work / f"sampler_{backend}_2.log")
    pids.append(proc.proc.pid)
    try:
        with proc.client(timeout=60) as c:
            c.push_weights(perturbed(weights, 3), 1)
    except BaseException:
        proc.stop()
        raise
    os.kill(proc.proc.pid, signal.SIGKILL)  # not proc.kill(): that would clean up for it
    proc.proc.wait()
    m["staging_left_by_sigkill"] = len(_staging_dirs(staging))
    proc = start_sampler(backend, model, staging, load_root, cfg, work / f"sampler_{backend}_3.log")
    pids.append(proc.proc.pid)
    m["staging_after_restart"] = len(_staging_dirs(staging))
    proc.stop()
    m["staging_left_at_end"] = len(_staging_dirs(staging))


def run(out_dir, cfg: SoakConfig | None = None) -> dict:
    """Run the soak; write `<out_dir>/sampler_soak.{json,md}`; return the result."""
    cfg = cfg or SoakConfig()
    title = "Sampler service soak (hostile clients, loopback)"
    cols = ["category", "cases", "refused", "accepted", "wrong_code", "multi_line_errors"]
    res = common.new_result("sampler_soak", title, cols, cfg)
    t = Tally()
    metrics: dict = {}
    pids: list[int] = []
    with tempfile.TemporaryDirectory(prefix="dlc_soak_") as tmp:
        work = Path(tmp)
        make_model(work)
        for backend in cfg.backends:
            _soak_backend(backend, cfg, work, t, metrics, pids)
        shm_left = [
            p.name
            for pid in pids
            for root in (Path("/dev/shm"), Path(tempfile.gettempdir()))
            for p in root.glob(f"dlc_push_p{pid}_*")
        ]
    res["rows"] = list(t.rows.values())
    bad_inputs = sum(r["cases"] for k, r in t.rows.items() if not k.startswith("push attack"))
    attacks = sum(r["cases"] for k, r in t.rows.items() if k.startswith("push attack"))
    files_left = len(shm_left) + sum(
        m.get("staging_left_at_end", m["staging_left_after_stop"]) for m in metrics.values()
    )
    tot = common.totals(t.rows.values(), "accepted", "multi_line_errors", "wrong_code")
    res["summary"] = {
        "bad_inputs": bad_inputs,
        "push_attacks": attacks,
        **common.totals(metrics.values(), "crashes", "bad_weights_served"),
        "files_left_behind": files_left,
        "attacks_accepted": tot["accepted"],
        "multi_line_errors": tot["multi_line_errors"],
        "wrong_codes": tot["wrong_code"],
    }
    res["metrics"] = metrics
    keys = ("crashes", "bad_weights_served", "files_left_behind", "attacks_accepted")
    zero = {k.replace("_", " "): k for k in keys} | {"multi-line errors": "multi_line_errors"}
    res["targets"] = [
        common.target("bad inputs (count)", bad_inputs, 90, ">="),
        common.target("push attacks (count)", attacks, 20, ">="),
        *common.zero_targets(res["summary"], zero),
    ]
    for b, m in metrics.items():
        values = (f"{k}={round(v, 2) if isinstance(v, float) else v}" for k, v in m.items())
        res["notes"].append(f"{b}: " + ", ".join(values))
    return common.finish_soak(res, out_dir, t.examples[:20])


if __name__ == "__main__":  # python -m dlc_jax.bench.soak.sampler OUT_DIR [jax,vllm]
    import json
    import sys

    logging.basicConfig(level=logging.WARNING)
    out = sys.argv[1] if len(sys.argv) > 1 else "soak_out"
    backends = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("jax",)
    r = run(out, SoakConfig(backends=backends))
    print(json.dumps({"summary": r["summary"], "metrics": r["metrics"]}, indent=2, default=str))
