"""Routed experts from the sampler: the compact wire format and the JAX backend's own routing."""

from __future__ import annotations

import asyncio

import jax.numpy as jnp
import numpy as np
import pytest
from moe_helpers import MOE_UNIFORM, make_random_moe_dir

from dlc_jax.sampler.wire.types import Rollout, SamplingParams


def _rollout(p: int, t: int, routed):
    return Rollout(
        prompt_ids=np.arange(p, dtype=np.int32),
        response_ids=np.arange(t, dtype=np.int32),
        logprobs=np.zeros(t, np.float32),
        head_ids=np.zeros((t, 0), np.int32),
        head_logprobs=np.zeros((t, 0), np.float32),
        finish_reason="length",
        version_spans=[(0, 0, t)],
        routed_experts=routed,
    )


@pytest.mark.parametrize("n_experts", [128, 300])
def test_routed_experts_wire_round_trip(n_experts):
    rng = np.random.default_rng(0)
    routed = rng.integers(0, n_experts, (3 + 5 - 1, 4, 8))
    m = _rollout(3, 5, routed).to_proto()
    assert m.routed_bytes == (1 if n_experts <= 256 else 2)
    assert len(m.routed_experts) == routed.size * m.routed_bytes  # compact: no varints
    back = Rollout.from_proto(m)
    assert back.routed_experts is not None and np.array_equal(back.routed_experts, routed)
    assert Rollout.from_proto(_rollout(3, 5, None).to_proto()).routed_experts is None
    m.routed_experts = m.routed_experts[:-1]
    with pytest.raises(ValueError, match="routed expert ids"):
        Rollout.from_proto(m)
    p = SamplingParams(return_routed_experts=True)
    assert SamplingParams.from_proto(p.to_proto()) == p


def test_jax_backend_returns_its_routing(tmp_path):
    """The JAX backend's routed experts are the model's own top-k at every position it ran (prompt
    and response but the last token), as a full forward over the sequence computes them."""
    from dlc_jax.model import load_hf
    from dlc_jax.sampler.backends import BackendConfig, make_backend

    d = make_random_moe_dir(tmp_path / "moe", **MOE_UNIFORM)
    b = make_backend("jax", BackendConfig(model_dir=str(d), max_model_len=64))
    prompts = [(0, [3, 4, 5]), (1, [9, 8, 7, 6, 5])]

    async def go(flag):
        await b.start()
        p = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=1, return_routed_experts=flag)
        return [r async for r in b.generate("k", prompts, p)]

    rs = asyncio.run(go(True))
    model = load_hf(d)
    for r in rs:
        seq = np.concatenate([r.prompt_ids, r.response_ids])[None]
        _, routing = model(jnp.asarray(seq), return_routing=True)
        own = np.asarray(routing.experts[0, :-1])
        assert r.routed_experts is not None and r.routed_experts.dtype == np.uint8
        assert r.routed_experts.shape == (len(seq[0]) - 1, 2, 2)
        assert np.array_equal(np.sort(r.routed_experts, -1), np.sort(own, -1))
    assert all(r.routed_experts is None for r in asyncio.run(go(False)))
