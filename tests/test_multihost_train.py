"""Multi-host training on CPU: 2 JAX processes x 4 fake devices joined by `jax.distributed` (coordinator on
loopback) against 2 real JAX-backend sampler servers, vs one process with 8 devices against the same
samplers. Each process requests only its own slots through a SamplerPool, packs its rows and builds the
global batch with make_array_from_process_local_data; only process 0 pushes the gathered weights after
every step, so the next step's rollouts come from the pushed weights. Losses must agree to float
tolerance. Also: init_kwargs from config/environment and the per-process row/slot layout.

This file doubles as the worker script: `python tests/test_multihost_train.py worker ...`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

G = 2            # samples per prompt
PROMPTS = 4      # prompts per step -> B = 8 rows
STEPS = 3
SEQ_LEN = 16
HEAD_K = 2


# ------------------------------------------------------------------------------------------------
# worker (runs in a subprocess: single process x 8 devices, or one of 2 processes x 4 devices)
# ------------------------------------------------------------------------------------------------
def _prompt(slot: int) -> list[int]:
    return [5 + (slot * 7) % 50, 9, 30 + slot % 11]


def worker(model_dir: str, addresses: str, out: str, coordinator: str, num_processes: int, process_id: int) -> None:
    from dlc_jax.trainer.config import DistributedSection, MeshSection
    from dlc_jax.trainer import distributed as dist

    sec = (DistributedSection(mode="never") if num_processes == 1 else
           DistributedSection(mode="always", coordinator_address=coordinator, num_processes=num_processes,
                              process_id=process_id, initialization_timeout_s=120))
    t_start = time.time()
    info = dist.initialize(sec)
    import jax

    from dlc_jax.model.hf_io import load_hf
    from dlc_jax.rl import LossConfig, group_advantages
    from dlc_jax.sampler.pool import SamplerPool
    from dlc_jax.sampler.types import SamplingParams
    from dlc_jax.trainer.batching import pack_rollouts
    from dlc_jax.trainer.config import OptimSection
    from dlc_jax.trainer.state import TrainState, make_optimizer
    from dlc_jax.trainer.step import STEP_KEYS, StepConfig, make_train_step

    assert info.process_count == num_processes and info.global_devices == 8, info
    mesh = dist.make_global_mesh(MeshSection(data=1, fsdp=-1, tensor=2))
    model = load_hf(model_dir, mesh=mesh)
    tx = make_optimizer(OptimSection(lr=3e-2, decay="constant", grad_clip=1.0), STEPS)
    st = TrainState.create(model, tx, mesh=mesh)
    cfg = StepConfig(loss=LossConfig(name="dlc"), head_k=HEAD_K)
    step = make_train_step(st.graphdef, tx, cfg, mesh=mesh, param_shardings=jax.tree.map(lambda x: x.sharding, st.params),
                           opt_shardings=jax.tree.map(lambda x: x.sharding, st.opt_state))
    rows = dist.rows_sharding(mesh)
    pool = SamplerPool(addresses, timeout=120, max_retries=2, backoff=0.1)
    base = max(c.info()["version"] for c in pool.clients)
    from jax.experimental import multihost_utils

    base = int(np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(base))) if num_processes > 1 else base)
    log = {"process": info.process_index, "losses": [], "grad_norm": [], "ess": [], "slots": [], "push": [],
           "versions": [], "param_sq": [], "tokens": [], "lpq": []}
    sq_norm = jax.jit(lambda p: sum(jax.numpy.sum(jax.numpy.square(x)) for x in jax.tree.leaves(p)))
    version = base + 1
    res = dist.push_weights(pool, st.model(), version)  # the samplers start from our initial weights
    assert res.ok, res.message
    log["push"].append([res.ok, res.version])
    for t in range(STEPS):
        slots = list(range(t * PROMPTS, (t + 1) * PROMPTS))
        mine = dist.local_slots(slots, G, rows)
        params = SamplingParams(n=G, max_tokens=5, temperature=1.0, head_k=HEAD_K, seed=1000 + t)
        got = {(r.slot_id, r.sample_index): r for r in pool.generate([_prompt(s) for s in mine], params, mine)}
        ordered = [got[(s, g)] for s in mine for g in range(G)]
        log["versions"].append(sorted({v for r in ordered for v in r.versions}))
        rewards = np.asarray([[float(np.mean(got[(s, g)].response_ids % 2 == 0)) for g in range(G)] for s in mine],
                             np.float32)
        arr = pack_rollouts(ordered, seq_len=SEQ_LEN, head_k=HEAD_K).arrays()
        # fixed-baseline advantages (group-normalized ones sum to zero per group, which with equal
        # response lengths makes the on-policy loss value exactly 0 and useless for comparison)
        assert np.allclose(np.asarray(group_advantages(rewards, mode="grpo")).sum(axis=1), 0, atol=1e-5)
        arr.update(adv=(rewards - 0.3).astype(np.float32).reshape(-1),
                   lp_s=np.zeros_like(arr["lp_q"]), lps_head=np.zeros_like(arr["lq_head"]),
                   self_mask=np.ones(arr["mask"].shape, bool))
        batch = dist.global_batch({k: arr[k] for k in STEP_KEYS}, rows, PROMPTS * G)
        st.params, st.opt_state, m = step(st.params, st.opt_state, batch)
        st.step += 1
        log["losses"].append(float(m["loss/loss"]))
        log["grad_norm"].append(float(m["grad_norm"]))
        log["ess"].append(float(m["ess_lag"]))
        log["param_sq"].append(float(sq_norm(st.params)))
        log["tokens"].append({f"{r.slot_id}/{r.sample_index}": r.response_ids.tolist() for r in ordered})
        log["lpq"].append({f"{r.slot_id}/{r.sample_index}": r.logprobs.tolist() for r in ordered})
        log["slots"].append(mine)
        version += 1
        res = dist.push_weights(pool, st.model(), version)  # collective; process 0 streams
        log["push"].append([bool(res.ok), int(res.version)])
    log["rotation"] = pool.rotation()
    log["seconds"] = time.time() - t_start
    Path(out).write_text(json.dumps(log))
    pool.close()


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(model_dir, addresses, out, coordinator, n, pid, devices, log):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, __file__, "worker", model_dir, addresses, str(out), coordinator, str(n), str(pid)]
    return subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def _wait(procs, logs, timeout=420):
    t0 = time.monotonic()
    deadline = t0 + timeout
    for p, log in zip(procs, logs):
        try:
            p.wait(max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"worker timed out; log:\n{Path(log).read_text()[-3000:]}")
        assert p.returncode == 0, f"worker failed ({p.returncode}):\n{Path(log).read_text()[-4000:]}"
    print(f"workers done in {time.monotonic() - t0:.1f}s")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from dlc_jax.model.tiny import make_tiny

    return str(make_tiny(tmp_path_factory.mktemp("mh_tiny") / "m", hidden_size=32, intermediate_size=64, head_dim=8,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512))


@pytest.fixture(scope="module")
def samplers(tiny_dir, tmp_path_factory):
    from dlc_jax.sampler.process import SamplerProcess

    d = tmp_path_factory.mktemp("mh_samplers")
    procs = []
    try:
        for i in range(2):
            procs.append(SamplerProcess("jax", tiny_dir, extra_args=["--max-model-len", "64", "--max-head-k", "4"],
                                        env={"XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}, log_file=str(d / f"s{i}.log"),
                                        startup_timeout=300).start())
        yield procs
    finally:
        for p in procs:
            p.stop()


def test_two_processes_match_one_process(tiny_dir, samplers, tmp_path):
    addrs = ",".join(p.address for p in samplers)
    one = tmp_path / "single.json"
    p = _launch(tiny_dir, addrs, one, "", 1, 0, 8, tmp_path / "single.log")
    _wait([p], [tmp_path / "single.log"])
    coord = f"127.0.0.1:{_free_port()}"
    outs = [tmp_path / f"mh{i}.json" for i in range(2)]
    logs = [tmp_path / f"mh{i}.log" for i in range(2)]
    procs = [_launch(tiny_dir, addrs, outs[i], coord, 2, i, 4, logs[i]) for i in range(2)]
    _wait(procs, logs)
    ref = json.loads(one.read_text())
    mh = [json.loads(o.read_text()) for o in outs]
    # each process requested only its own half of the slots
    for t in range(STEPS):
        assert mh[0]["slots"][t] == list(range(t * PROMPTS, t * PROMPTS + PROMPTS // 2))
        assert mh[1]["slots"][t] == list(range(t * PROMPTS + PROMPTS // 2, (t + 1) * PROMPTS))
        assert ref["slots"][t] == list(range(t * PROMPTS, (t + 1) * PROMPTS))
    # every step's rollouts were sampled with the weights pushed after the previous step
    for log in (ref, *mh):
        assert [len(v) for v in log["versions"]] == [1] * STEPS
        assert all(ok for ok, _ in log["push"]) and log["rotation"] == [True, True]
    assert [v[0] for v in mh[0]["versions"]] == [v[0] for v in mh[1]["versions"]]
    assert mh[0]["push"] == mh[1]["push"]
    # identical across the two processes (replicated metrics), equal to the single process run
    np.testing.assert_array_equal(mh[0]["losses"], mh[1]["losses"])
    print("max |loss diff|", np.max(np.abs(np.subtract(mh[0]["losses"], ref["losses"]))),
          "max rel grad_norm diff", np.max(np.abs(np.subtract(mh[0]["grad_norm"], ref["grad_norm"])) / np.abs(ref["grad_norm"])),
          "max rel param_sq diff", np.max(np.abs(np.subtract(mh[0]["param_sq"], ref["param_sq"])) / np.abs(ref["param_sq"])),
          "seconds single/multi", ref["seconds"], mh[0]["seconds"], "losses", ref["losses"])
    np.testing.assert_allclose(mh[0]["losses"], ref["losses"], rtol=1e-5, atol=1e-7)
    assert min(abs(x) for x in ref["losses"]) > 1e-3
    np.testing.assert_allclose(mh[0]["grad_norm"], ref["grad_norm"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(mh[0]["param_sq"], ref["param_sq"], rtol=1e-5)
    # the same samples (tokens, sampler logprobs) in both runs: the pushed weights agree
    for t in range(STEPS):
        joined = {**mh[0]["tokens"][t], **mh[1]["tokens"][t]}
        assert joined == ref["tokens"][t]
        for k, v in {**mh[0]["lpq"][t], **mh[1]["lpq"][t]}.items():
            np.testing.assert_allclose(v, ref["lpq"][t][k], atol=1e-4)
    # training really moves: gradients are non-trivial and the parameters change every step
    assert min(ref["grad_norm"]) > 1e-3
    assert len({round(x, 4) for x in ref["param_sq"]}) == STEPS
    assert len({json.dumps(t, sort_keys=True) for t in ref["tokens"]}) == STEPS


def test_init_kwargs_from_config_and_environment():
    from dlc_jax.trainer.config import DistributedSection
    from dlc_jax.trainer.distributed import DistributedError, init_kwargs

    assert init_kwargs(DistributedSection(mode="never"), {"JAX_NUM_PROCESSES": "4"}) is None
    assert init_kwargs(DistributedSection(), {}) is None  # auto, nothing set: single process
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert init_kwargs(DistributedSection(), env) == {"coordinator_address": "10.0.0.2:1234", "num_processes": 4,
                                                      "process_id": 3, "initialization_timeout": 300}
    kw = init_kwargs(DistributedSection(coordinator_address="h:1", process_id=1, initialization_timeout_s=9), env)
    assert kw == {"coordinator_address": "h:1", "num_processes": 4, "process_id": 1, "initialization_timeout": 9}
    assert init_kwargs(DistributedSection(mode="always"), {}) == {"initialization_timeout": 300}  # TPU auto-detect
    with pytest.raises(DistributedError, match="distributed.process_id"):
        init_kwargs(DistributedSection(), {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"})
    with pytest.raises(DistributedError, match="distributed.process_id: 5"):
        init_kwargs(DistributedSection(coordinator_address="h:1", num_processes=2, process_id=5), {})
    with pytest.raises(DistributedError, match="JAX_NUM_PROCESSES"):
        init_kwargs(DistributedSection(), {"JAX_NUM_PROCESSES": "two"})


def test_row_and_slot_layout_single_process():
    import jax

    from dlc_jax.model import MeshConfig, make_mesh
    from dlc_jax.trainer.distributed import DistributedError, global_batch, local_row_range, local_slots, rows_sharding

    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=2))
    sh = rows_sharding(mesh)
    assert local_row_range(sh, 8) == (0, 8)
    assert local_slots([10, 11, 12, 13], 2, sh) == [10, 11, 12, 13]
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    g = global_batch({"x": x}, sh, 8)["x"]
    assert g.shape == (8, 3) and len(g.sharding.device_set) == len(jax.devices())
    np.testing.assert_array_equal(np.asarray(g), x)
    with pytest.raises(DistributedError, match="'x': 6 local rows"):
        global_batch({"x": x[:6]}, sh, 8)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    worker(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7]))
