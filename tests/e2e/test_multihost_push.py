"""Multi-host weight push: 2 JAX processes x 4 fake CPU devices (jax.distributed on loopback) push
a model (the tiny model's weights x 1.25) to a JAX-backend sampler with
`distributed.push_weights`, three times in the same processes: version 1 as gRPC chunks, version 2
over the socket data plane, version 3 over the socket to a pool of that sampler and a second
(transport-only) one with relay "chain": the parts go to the first, which forwards the assembled
tensors to the second. Every process sends only its own deduplicated shards (each element once
over both processes, each process <= 0.6 of the model's bytes, for 2 samplers as for 1), process 0
commits, the relayed sampler holds exactly the pushed tensors, and the first sampler's log-probs
afterwards match an fp32 reference of the pushed weights."""

from __future__ import annotations

import numpy as np
import pytest
from model_helpers import MULTIHOST_DIMS

from dlc_jax.bench.sampler_bench import TransportOnlyBackend
from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire.types import SamplingParams


class RecordingBackend(TransportOnlyBackend):
    """A transport-only sampler that keeps what it was last given (the relay's second sampler)."""

    async def apply_weights(self, weights_dir, version):
        self.weights = dict(st.iter_tensors(weights_dir))
        self.version = int(version)


SCALE = 1.25
TOL = 1e-4
PROMPTS = [[11, 12, 13, 14], [200, 201, 202]]
PARAMS = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_dir):
    return str(make_tiny_dir(**MULTIHOST_DIMS))


def test_two_processes_push_their_own_shards(tiny_dir, tmp_path):
    from sampler_reference import load_hf_reference, processed_logprobs

    from dlc_jax.bench.weight_sync_multihost import launch
    from dlc_jax.sampler.backends import BackendConfig, make_backend
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread

    backend = make_backend("jax", BackendConfig(model_dir=tiny_dir, max_model_len=64))
    cfg = ServerConfig(staging_root=str(tmp_path / "stage"), data_port=0)
    srv = ServerThread(backend, cfg).start()
    shapes = {k: (v.shape, "float32") for k, v in st.iter_tensors(tiny_dir)}
    child_backend = RecordingBackend(shapes, 512)
    child_cfg = ServerConfig(staging_root=str(tmp_path / "stage_child"), data_port=0)
    child = ServerThread(child_backend, child_cfg).start()
    transports = ("grpc", "socket", "socket:relay")
    try:
        results = launch(
            srv.address,
            tmp_path / "mh",
            model_dir=tiny_dir,
            scale=SCALE,
            transports=transports,
            relay_to=(child.address,),
        )
        with SamplerClient(srv.address, timeout=120) as c:
            info = c.info()
            rollouts = list(c.generate(PROMPTS, PARAMS))
    finally:
        srv.stop()
        child.stop()
    assert info["version"] == 3 and info["pushes"] == 3 and info["rejected_pushes"] == 0
    total = results[0]["model_bytes"]
    for k, transport in enumerate(["grpc", "socket", "socket + relay"]):
        pushes = [r["pushes"][k] for r in results]
        sent = [p["egress_bytes"] for p in pushes]
        print(transport, "bytes per process", sent, "of", total, [f"{s / total:.3f}" for s in sent])
        assert [p["ok"] for p in pushes] == [True, True], [p["message"] for p in pushes]
        assert [p["version"] for p in pushes] == [k + 1, k + 1]
        assert [p["transport"] for p in pushes] == [transport, transport]
        assert sum(sent) == total  # every element sent exactly once over both processes
        assert max(sent) <= 0.6 * total
    pushed = {k: v * np.float32(SCALE) for k, v in st.iter_tensors(tiny_dir)}
    assert child_backend.version == 3  # the relayed copy: exactly the pushed tensors
    assert sorted(child_backend.weights) == sorted(pushed)
    for k, v in pushed.items():
        np.testing.assert_allclose(child_backend.weights[k], v, rtol=1e-6, atol=0)
    ref = load_hf_reference(tiny_dir, pushed)
    worst = 0.0
    for r in rollouts:
        assert r.version_spans == [(3, 0, len(r.response_ids))]
        lp, _ = processed_logprobs(ref, r.prompt_ids, r.response_ids, temperature=1.0)
        worst = max(worst, float(np.max(np.abs(lp - r.logprobs))))
    assert worst <= TOL, f"max |sampler - fp32 reference of the pushed weights| = {worst:.2e}"
    old = load_hf_reference(tiny_dir)  # not vacuous: the old weights give other log-probs
    r = rollouts[0]
    assert r.version_spans == [(3, 0, len(r.response_ids))]
    lp_old, _ = processed_logprobs(old, r.prompt_ids, r.response_ids, temperature=1.0)
    assert float(np.max(np.abs(lp_old - r.logprobs))) > 100 * TOL


def test_weight_sync_bench_multihost_rows(tmp_path):
    import dataclasses

    from dlc_jax.bench import weight_sync_bench as wsb
    from dlc_jax.bench.weight_sync_multihost import add_multihost_part, multihost_rows

    cfg = dataclasses.replace(
        wsb.SIZES["tiny"], push_dtype="bfloat16", multihost=True, relay_samplers=2
    )
    # pushes over gRPC, over the socket data plane, and over the socket relayed to a 2nd sampler
    mh = multihost_rows(cfg, tmp_path)
    assert [p["ok"] for r in mh["results"] for p in r["pushes"]] == [True] * 6
    for t in ("grpc", "socket", "socket + relay"):
        shares = [r["egress_vs_model"] for r in mh["rows"] if r["transport"] == t]
        assert len(shares) == 2 and abs(sum(shares) - 1.0) < 1e-9 and max(shares) <= 0.6, shares
    res = {"rows": [], "summary": {}, "targets": [], "notes": []}
    add_multihost_part(res, mh)
    assert [t["met"] for t in res["targets"]] == [True] * 4 and len(res["rows"]) == 6
    assert "2 samplers: trainer egress" in res["targets"][3]["name"]
