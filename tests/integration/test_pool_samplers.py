"""SamplerPool against real gRPC JAX-backend samplers on loopback: round-robin routing by slot with
split-independent seeds, concurrent pushes reported per sampler, a rejected push leaving that
sampler
on its old weights (atomic per sampler) and out of rotation, readmission after a full push, one
tensor
read once for all samplers, and a killed sampler not stopping generation or pushes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from xla_env import xla_flags

from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.client.pool import (
    NoActiveSamplerError,
    SamplerPool,
    connect_samplers,
    slot_seed,
)
from dlc_jax.sampler.client.protocol import Sampler
from dlc_jax.sampler.client.retry import RetryPolicy
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire.types import SamplingParams

PARAMS = SamplingParams(n=2, max_tokens=4, temperature=1.0, head_k=2, seed=7)
PROMPTS = {s: [3 + s, 17, 40 + 2 * s] for s in range(6)}


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_dir):
    return str(make_tiny_dir(hidden_size=32, intermediate_size=64, head_dim=8, num_hidden_layers=1))


@pytest.fixture(scope="module")
def servers(tiny_dir):
    from dlc_jax.sampler.backends import BackendConfig, make_backend
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread

    srvs = [
        ServerThread(
            make_backend(
                "jax", BackendConfig(model_dir=tiny_dir, max_model_len=64, max_head_k=4, max_n=4)
            ),
            ServerConfig(),
        ).start()
        for _ in range(2)
    ]
    yield srvs
    for s in srvs:
        s.stop()


@pytest.fixture(scope="module")
def base_weights(tiny_dir):
    return dict(st.iter_tensors(tiny_dir))


def _perturbed(weights, seed, scale=0.3):
    rng = np.random.default_rng(seed)
    return {
        k: (v + scale * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
        for k, v in weights.items()
    }


def _pool(addrs, **kw):
    return SamplerPool(addrs, timeout=120, max_retries=1, backoff=0.05, probe_timeout=2.0, **kw)


def _collect(it):
    out = {}
    for r in it:
        key = (r.slot_id, r.sample_index)
        assert key not in out, f"duplicate rollout {key}"
        out[key] = r
    return out


def _generate(sampler, slots=tuple(PROMPTS), params=PARAMS):
    return _collect(sampler.generate([PROMPTS[s] for s in slots], params, slot_ids=list(slots)))


def test_round_robin_by_slot_and_split_independent(servers):
    a0, a1 = servers[0].address, servers[1].address
    with SamplerClient(a0) as c0, SamplerClient(a1) as c1, _pool([a0, a1]) as pool:
        req0, req1 = c0.info()["requests"], c1.info()["requests"]
        assert pool.route([0, 1, 2, 3, 4, 5]) == {0: [0, 2, 4], 1: [1, 3, 5]}
        got = _generate(pool)
        assert sorted(got) == [(s, g) for s in range(6) for g in range(2)]
        # one Generate per slot: slots 0,2,4 -> sampler 0; 1,3,5 -> sampler 1
        assert c0.info()["requests"] - req0 == 3 and c1.info()["requests"] - req1 == 3
        # The same slot asked alone from the other sampler with its slot seed gives the same
        # samples.
        for s in (0, 3):
            p = dataclasses.replace(PARAMS, seed=slot_seed(PARAMS.seed, s))
            other = c1 if s % 2 == 0 else c0
            for r in other.generate([PROMPTS[s]], p, [s]):
                ref = got[(s, r.sample_index)]
                np.testing.assert_array_equal(r.response_ids, ref.response_ids)
                np.testing.assert_allclose(r.logprobs, ref.logprobs, atol=1e-5)
        # the samples of a slot differ across slots (seeds really are per slot)
        assert not np.array_equal(got[(0, 0)].logprobs, got[(2, 0)].logprobs)
        m = pool.metrics()
        assert m["pool/active"] == 2.0 and m["pool/out_of_rotation"] == 0.0


def test_push_reported_per_sampler_rejection_atomic_and_readmission(servers, base_weights):
    a0, a1 = servers[0].address, servers[1].address
    w_a, w_b, w_c = (_perturbed(base_weights, s) for s in (1, 2, 3))
    with SamplerClient(a0) as c0, SamplerClient(a1) as c1, _pool([a0, a1]) as pool:
        v0 = max(c0.info()["version"], c1.info()["version"])
        # sampler 1 gets ahead (version v0+5, weights A); the pool then pushes B as v0+3: stale on 1
        assert c1.push_weights(w_a, v0 + 5).ok
        only_1 = _generate(c1, slots=(1,))
        res = pool.push_weights(w_b, v0 + 3)
        assert res.ok and res.version == v0 + 3
        assert res.per_sampler[a0].ok and res.per_sampler[a0].version == v0 + 3
        assert not res.per_sampler[a1].ok and "stale" in res.per_sampler[a1].message
        assert res.removed == (a1,)
        assert (
            c0.info()["version"] == v0 + 3 and c1.info()["version"] == v0 + 5
        )  # 1 kept its old weights
        again = _generate(c1, slots=(1,))
        for k in only_1:
            np.testing.assert_array_equal(again[k].response_ids, only_1[k].response_ids)
        m = pool.metrics()
        assert (
            m["pool/active"] == 1
            and m["pool/removed_total"] == 1
            and m["pool/sampler1/active"] == 0
        )
        # generation goes to sampler 0 only, all at v0+3
        got = _generate(pool)
        assert sorted(got) == [(s, g) for s in range(6) for g in range(2)]
        assert {v for r in got.values() for v in r.versions} == {v0 + 3}
        # a full push of a newer version readmits sampler 1 (it is reachable)
        res = pool.push_weights(w_c, v0 + 6)
        assert res.ok and res.readmitted == (a1,) and all(r.ok for r in res.per_sampler.values())
        assert pool.rotation() == [True, True] and pool.metrics()["pool/readmitted_total"] == 1
        got = _generate(pool)
        assert {v for r in got.values() for v in r.versions} == {v0 + 6}


def test_streamed_push_reads_each_tensor_once(servers, base_weights, tiny_dir):
    from dlc_jax.model import hf_param_shapes
    from dlc_jax.model.config import Qwen3Config

    a0, a1 = servers[0].address, servers[1].address
    w = _perturbed(base_weights, 11)
    reads = []

    def source():
        for name in hf_param_shapes(Qwen3Config.from_pretrained(tiny_dir)):
            reads.append(name)
            yield name, w[name]

    with SamplerClient(a0) as c0, SamplerClient(a1) as c1, _pool([a0, a1], queue_depth=1) as pool:
        v = max(c0.info()["version"], c1.info()["version"]) + 1
        res = pool.push_weights(
            source, v, specs=hf_param_shapes(Qwen3Config.from_pretrained(tiny_dir))
        )
        assert res.ok and [r.ok for r in res.per_sampler.values()] == [True, True], res.message
        assert len(reads) == len(set(reads)) == len(w)
        # both samplers now serve identical weights: same slot, same seed -> same samples
        p = dataclasses.replace(PARAMS, seed=99)
        r0, r1 = _generate(c0, (0,), p), _generate(c1, (0,), p)
        for k in r0:
            np.testing.assert_allclose(r0[k].logprobs, r1[k].logprobs, atol=1e-5)
        with pytest.raises(TypeError, match="specs"):
            pool.push_weights(source, v + 1)


def test_killed_sampler_leaves_rotation_and_training_continues(
    servers, base_weights, tiny_dir, tmp_path
):
    from dlc_jax.sampler.service.process import SamplerProcess

    a0 = servers[0].address
    proc = SamplerProcess(
        "jax",
        tiny_dir,
        extra_args=["--max-model-len", "64", "--max-head-k", "4", "--max-n", "4"],
        log_file=str(tmp_path / "killed.log"),
        env={"XLA_FLAGS": xla_flags(), "JAX_PLATFORMS": "cpu"},
        startup_timeout=300,
    ).start()
    try:
        with SamplerClient(a0) as c0, _pool([a0, proc.address]) as pool:
            v = c0.info()["version"] + 1
            res = pool.push_weights(_perturbed(base_weights, 21), v)
            assert res.ok and all(r.ok for r in res.per_sampler.values()), res.message
            _generate(pool)  # warm both
            proc.kill()
            # generation: the slots routed to the dead sampler are re-requested from sampler 0
            got = _generate(pool)
            assert sorted(got) == [(s, g) for s in range(6) for g in range(2)]
            m = pool.metrics()
            assert (
                m["pool/active"] == 1
                and m["pool/sampler1/active"] == 0
                and m["pool/resubmitted_slots"] >= 1
            )
            assert "generate failed" in pool.report()[1]["last_error"]
            # "training" continues: pushes go to the live sampler, the dead one is not readmitted
            for k in range(2):
                res = pool.push_weights(_perturbed(base_weights, 30 + k), v + 1 + k)
                assert res.ok and list(res.per_sampler) == [a0]
                # the readmission probe of the dead sampler used its own timeout / retry policy: the
                # shared client's settings are untouched
                dead = pool.clients[1]
                assert dead.timeout == 120 and dead.retry == RetryPolicy(
                    max_retries=1, backoff=0.05
                )
                got = _generate(pool, slots=(0, 1))
                assert {x for r in got.values() for x in r.versions} == {v + 1 + k}
        # a sampler down while still in rotation: its push fails and is reported, the rest go on
        with _pool([a0, proc.address]) as pool:
            res = pool.push_weights(_perturbed(base_weights, 40), v + 10)
            assert res.ok and res.per_sampler[a0].ok
            assert (
                not res.per_sampler[proc.address].ok
                and res.per_sampler[proc.address].code == "UNAVAILABLE"
            )
            assert res.removed == (proc.address,) and pool.rotation() == [True, False]
            pool.set_rotation([False, False])
            with pytest.raises(NoActiveSamplerError, match="no sampler in rotation"):
                _generate(pool)
    finally:
        proc.kill()


def test_connect_samplers_one_or_many(servers, tmp_path):
    a0, a1 = servers[0].address, servers[1].address
    c = connect_samplers(a0)
    assert isinstance(c, SamplerClient) and isinstance(c, Sampler)
    assert c.metrics() == {} and c.rotation() == [] and c.report()[0]["active"]
    c.close()
    tok = tmp_path / "tok"
    tok.write_text("secret\n")
    p = connect_samplers(f"{a0}, {a1}", token_file=str(tok), timeout=5)
    assert isinstance(p, SamplerPool) and p.addresses == [a0, a1] and p.clients[0].token == "secret"
    assert isinstance(p, Sampler) and p.rotation() == [True, True]
    p.close()
    tok.write_text("")
    with pytest.raises(ValueError, match="token_file"):
        connect_samplers(a0, token_file=str(tok))
    with pytest.raises(ValueError, match="duplicate"):
        SamplerPool([a0, a0])
