"""The in-process sampler (``sampler.backend=inprocess``): a real `Sampler` running the JAX
backend's own sampling code without gRPC or a process. Same rollouts as the backend behind a server
(same seed), the server's request checks, atomic versioned pushes of an NNX model."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from dlc_jax.sampler.client.protocol import Sampler
from dlc_jax.sampler.service.request_checks import RequestError
from dlc_jax.sampler.wire.types import SamplingParams


@pytest.fixture(scope="module")
def sampler(tiny_dir):
    from dlc_jax.sampler.backends import BackendConfig
    from dlc_jax.sampler.client.inprocess import InProcessSampler

    s = InProcessSampler(BackendConfig(model_dir=str(tiny_dir), max_model_len=64, max_head_k=4))
    yield s
    s.close()


def _params(**kw):
    base = dict(n=2, max_tokens=5, temperature=1.0, head_k=3, seed=7)
    return SamplingParams(**(base | kw))


def test_is_a_sampler_and_matches_the_backend_behind_a_server(sampler, tiny_dir):
    from dlc_jax.sampler.backends import BackendConfig, make_backend

    assert isinstance(sampler, Sampler)
    prompts, params = [[5, 6, 7], [9, 10]], _params()
    got = list(sampler.generate(prompts, params, slot_ids=[3, 8]))
    assert [(r.slot_id, r.sample_index) for r in got] == [(3, 0), (3, 1), (8, 0), (8, 1)]
    for r in got:
        assert len(r.response_ids) == len(r.logprobs) == r.head_ids.shape[0] <= 5
        assert r.head_ids.shape[1] == 3 and r.version_spans == [(0, 0, len(r.response_ids))]
        assert np.all(r.logprobs <= 0)

    async def served():  # what `dlc-jax sampler serve --backend jax` runs for the same request
        b = make_backend("jax", BackendConfig(model_dir=str(tiny_dir), max_model_len=64))
        await b.start()
        out = [r async for r in b.generate("r", list(zip([3, 8], prompts)), params)]
        await b.close()
        return out

    ref = asyncio.run(served())
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a.response_ids, b.response_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)


def test_refuses_what_the_server_refuses(sampler):
    with pytest.raises(RequestError, match="params.head_k"):
        list(sampler.generate([[1, 2]], _params(head_k=9)))
    with pytest.raises(RequestError, match="max_model_len|tokens"):
        list(sampler.generate([list(range(1, 70))], _params()))


def test_push_model_serves_the_new_version(tiny_dir):
    import jax
    from flax import nnx

    from dlc_jax.model import load_hf
    from dlc_jax.sampler.backends import BackendConfig
    from dlc_jax.sampler.client.inprocess import InProcessSampler

    s = InProcessSampler(BackendConfig(model_dir=str(tiny_dir), max_model_len=64, max_head_k=4))
    model = load_hf(str(tiny_dir))
    greedy = _params(n=1, temperature=0.0, head_k=0)
    before = next(s.generate([[5, 6, 7]], greedy))
    # a different model: every parameter scaled, so the greedy continuation's log-probs move
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.tree.map(lambda x: x * 1.5, state))
    res = s.push_model(model, 3)
    assert res.ok and res.version == 3 and res.bytes > 0
    assert s.info()["version"] == 3 and s.info()["pushes"] == 1
    after = next(s.generate([[5, 6, 7]], greedy))
    assert after.version_spans == [(3, 0, len(after.response_ids))]
    assert not np.allclose(before.logprobs[:1], after.logprobs[:1])
    bad = s.push_weights([("model.embed_tokens.weight", np.zeros((2, 2), np.float32))], 4)
    assert not bad.ok and bad.code == "INVALID_ARGUMENT" and s.info()["version"] == 3
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.info()


def test_a_new_version_at_every_step_re_prefills_in_a_few_compiles_and_the_same_numbers(tiny_dir):
    """A re-prefill after a mid-generation weight swap runs on a bucketed length (left padding),
    so swaps at 39 different steps compile 3 prefill programs, not 39 (each seconds on CPU, more
    on TPU); with unchanged weights the tokens and log-probs equal a generation without swaps."""
    from dlc_jax.sampler.backends import BackendConfig, make_backend

    b = make_backend("jax", BackendConfig(model_dir=str(tiny_dir), max_model_len=64))
    asyncio.run(b.start())
    params = _params(n=2, max_tokens=40, head_k=2)
    plain = list(b.generate_sync("plain", [(0, [5, 6, 7]), (1, [9, 10])], params))
    prefill = b._fns[0]
    compiled = prefill._cache_size()
    served, version = b._snapshot, iter(range(1, 10**6))
    b._snapshot = lambda: (served()[0], next(version))  # same weights, a new version every step
    swapped = list(b.generate_sync("swapped", [(0, [5, 6, 7]), (1, [9, 10])], params))
    assert prefill._cache_size() - compiled == 2  # steps 1-32 share one length, 33-39 another
    for a, r in zip(plain, swapped):
        assert len(r.version_spans) == len(r.response_ids) == 40
        np.testing.assert_array_equal(a.response_ids, r.response_ids)
        np.testing.assert_allclose(a.logprobs, r.logprobs, atol=1e-5)
        np.testing.assert_allclose(a.head_logprobs, r.head_logprobs, atol=1e-5)
    asyncio.run(b.close())
