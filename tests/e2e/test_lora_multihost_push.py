"""``lora.push: adapter`` in a multi-host run: 2 JAX processes x 4 fake CPU devices (jax.distributed
on loopback) hold rank-4 adapters sharded over the mesh like their kernels (tests/e2e/
lora_multihost_worker.py); every process gathers them, process 0 alone pushes them to a JAX-backend
sampler and broadcasts the outcome. Checked: both processes return the same result (version 1;
then the same refusal of an adapter claiming another base, which leaves version 1 serving), only
process 0 sends bytes, both gathered the same adapter, and the sampler's log-probs equal an fp32
reference of base + (alpha / r) B.A."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from model_helpers import MULTIHOST_DIMS
from xla_env import xla_flags

from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire.types import SamplingParams

TOL = 1e-4  # today's fp32 parity of a full push (tests/e2e/test_multihost_push.py)
PROMPTS = [[11, 12, 13, 14], [200, 201, 202]]
PARAMS = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=7)
WORKER = pathlib.Path(__file__).with_name("lora_multihost_worker.py")


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_dir):  # the multi-host shape (made once per session)
    return str(make_tiny_dir(**MULTIHOST_DIMS))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(address: str, model_dir: str, out: pathlib.Path, processes: int = 2) -> list[dict]:
    coord = f"127.0.0.1:{_free_port()}"
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for p in range(processes):
        env = {
            **os.environ,
            "XLA_FLAGS": xla_flags(4),
            "JAX_PLATFORMS": "cpu",
            "JAX_COORDINATOR_ADDRESS": coord,
            "JAX_NUM_PROCESSES": str(processes),
            "JAX_PROCESS_ID": str(p),
        }
        cmd = [sys.executable, str(WORKER), f"--address={address}", f"--model-dir={model_dir}"]
        log = open(out / f"p{p}.log", "wb")
        procs.append(
            subprocess.Popen([*cmd, f"--out={out}"], env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    deadline = time.monotonic() + 600
    try:
        for p, proc in enumerate(procs):
            if proc.wait(max(1.0, deadline - time.monotonic())) != 0:
                tail = (out / f"p{p}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"process {p} exited with {proc.returncode}:\n{tail}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [json.loads((out / f"p{p}.json").read_text()) for p in range(processes)]


def test_two_processes_push_one_adapter(tiny_dir, tmp_path):
    from sampler_reference import load_hf_reference, processed_logprobs

    from dlc_jax.sampler.backends import BackendConfig, make_backend
    from dlc_jax.sampler.push.adapter import merged_tensors
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread

    backend = make_backend("jax", BackendConfig(model_dir=tiny_dir, max_model_len=64))
    srv = ServerThread(backend, ServerConfig(staging_root=str(tmp_path / "stage"))).start()
    try:
        results = _launch(srv.address, tiny_dir, tmp_path / "mh")
        with SamplerClient(srv.address, timeout=120) as c:
            assert c.info()["version"] == 1  # the refused v2 changed nothing
            rollouts = list(c.generate(PROMPTS, PARAMS))
    finally:
        srv.stop()
    assert [r["pusher"] for r in results] == ["MultiHostAdapterPusher"] * 2
    assert min(r["factors_not_fully_addressable"] for r in results) > 0  # really sharded
    first, second = ([r["pushes"][k] for r in results] for k in (0, 1))
    assert [(p["ok"], p["version"]) for p in first] == [(True, 1), (True, 1)], first
    assert [p["ok"] for p in second] == [False, False]
    assert second[0]["message"] == second[1]["message"]  # process 1 sees process 0's refusal
    assert second[0]["code"] == second[1]["code"] == "FAILED_PRECONDITION"
    assert "base" in second[0]["message"], second[0]["message"]
    adapter = dict(st.iter_tensors(tmp_path / "mh" / "adapter_p0"))
    other = dict(st.iter_tensors(tmp_path / "mh" / "adapter_p1"))
    assert sorted(adapter) == sorted(other)
    assert all(np.array_equal(adapter[k], other[k]) for k in adapter)
    nbytes = sum(a.nbytes for a in adapter.values())
    assert [p["egress_bytes"] for p in first] == [nbytes, 0]  # process 0 alone sends, once

    pushed = dict(merged_tensors(st.iter_tensors(tiny_dir), adapter, 8.0 / 4))
    assert len(pushed) == 2 * 7  # every projection of both layers
    ref = load_hf_reference(tiny_dir, pushed)
    worst = 0.0
    for r in rollouts:
        assert r.version_spans == [(1, 0, len(r.response_ids))]
        lp, _ = processed_logprobs(ref, r.prompt_ids, r.response_ids, temperature=1.0)
        worst = max(worst, float(np.max(np.abs(lp - r.logprobs))))
    assert worst <= TOL, f"max |sampler - fp32 reference of base + delta| = {worst:.2e}"
    old = load_hf_reference(tiny_dir)  # not vacuous: the base alone gives other log-probs
    r = rollouts[0]
    lp_old, _ = processed_logprobs(old, r.prompt_ids, r.response_ids, temperature=1.0)
    assert float(np.max(np.abs(lp_old - r.logprobs))) > 100 * TOL
