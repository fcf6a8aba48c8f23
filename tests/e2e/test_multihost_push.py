"""Multi-host weight push: 2 JAX processes x 4 fake CPU devices (jax.distributed on loopback) push
a model (the tiny model's weights x 1.25) to a JAX-backend sampler with
`distributed.push_weights`, twice in the same processes: version 1 as gRPC chunks, version 2 over
the socket data plane. Every process sends only its own deduplicated shards (each element once
over both processes, each process <= 0.6 of the model's bytes), process 0 commits, and the
sampler's log-probs afterwards (version 2, from the socket push) match an fp32 reference of the
pushed weights."""

from __future__ import annotations

import numpy as np
import pytest

from dlc_jax.sampler import safetensors_io as st
from dlc_jax.sampler.client import SamplerClient
from dlc_jax.sampler.types import SamplingParams

SCALE = 1.25
TOL = 1e-4
PROMPTS = [[11, 12, 13, 14], [200, 201, 202]]
PARAMS = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_dir):
    return str(
        make_tiny_dir(
            hidden_size=32,
            intermediate_size=64,
            head_dim=8,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
        )
    )


def test_two_processes_push_their_own_shards(tiny_dir, tmp_path):
    from sampler_reference import load_hf_reference, processed_logprobs

    from dlc_jax.bench.weight_sync_multihost import launch
    from dlc_jax.sampler.backends import BackendConfig, make_backend
    from dlc_jax.sampler.server import ServerConfig, ServerThread

    backend = make_backend("jax", BackendConfig(model_dir=tiny_dir, max_model_len=64))
    cfg = ServerConfig(staging_root=str(tmp_path / "stage"), data_port=0)
    srv = ServerThread(backend, cfg).start()
    transports = ("grpc", "socket")
    try:
        results = launch(
            srv.address, tmp_path / "mh", model_dir=tiny_dir, scale=SCALE, transports=transports
        )
        with SamplerClient(srv.address, timeout=120) as c:
            info = c.info()
            rollouts = list(c.generate(PROMPTS, PARAMS))
    finally:
        srv.stop()
    assert info["version"] == 2 and info["pushes"] == 2 and info["rejected_pushes"] == 0
    total = results[0]["model_bytes"]
    for k, transport in enumerate(transports):
        pushes = [r["pushes"][k] for r in results]
        sent = [p["egress_bytes"] for p in pushes]
        print(transport, "bytes per process", sent, "of", total, [f"{s / total:.3f}" for s in sent])
        assert [p["ok"] for p in pushes] == [True, True], [p["message"] for p in pushes]
        assert [p["version"] for p in pushes] == [k + 1, k + 1]
        assert [p["transport"] for p in pushes] == [transport, transport]
        assert sum(sent) == total  # every element sent exactly once over both processes
        assert max(sent) <= 0.6 * total
    pushed = {k: v * np.float32(SCALE) for k, v in st.iter_tensors(tiny_dir)}
    ref = load_hf_reference(tiny_dir, pushed)
    worst = 0.0
    for r in rollouts:
        assert r.version_spans == [(2, 0, len(r.response_ids))]
        lp, _ = processed_logprobs(ref, r.prompt_ids, r.response_ids, temperature=1.0)
        worst = max(worst, float(np.max(np.abs(lp - r.logprobs))))
    assert worst <= TOL, f"max |sampler - fp32 reference of the pushed weights| = {worst:.2e}"
    old = load_hf_reference(tiny_dir)  # not vacuous: the old weights give other log-probs
    r = rollouts[0]
    assert r.version_spans == [(2, 0, len(r.response_ids))]
    lp_old, _ = processed_logprobs(old, r.prompt_ids, r.response_ids, temperature=1.0)
    assert float(np.max(np.abs(lp_old - r.logprobs))) > 100 * TOL


def test_weight_sync_bench_multihost_rows(tmp_path):
    import dataclasses

    from dlc_jax.bench import weight_sync_bench as wsb
    from dlc_jax.bench.weight_sync_multihost import add_multihost_part, multihost_rows

    cfg = dataclasses.replace(wsb.SIZES["tiny"], push_dtype="bfloat16", multihost=True)
    mh = multihost_rows(cfg, tmp_path)  # one push over gRPC, one over the socket data plane
    assert [p["ok"] for r in mh["results"] for p in r["pushes"]] == [True] * 4
    for t in ("grpc", "socket"):
        shares = [r["egress_vs_model"] for r in mh["rows"] if r["transport"] == t]
        assert len(shares) == 2 and abs(sum(shares) - 1.0) < 1e-9 and max(shares) <= 0.6, shares
    res = {"rows": [], "summary": {}, "targets": [], "notes": []}
    add_multihost_part(res, mh)
    assert [t["met"] for t in res["targets"]] == [True, True] and len(res["rows"]) == 4
    assert "socket" in res["targets"][1]["name"]
