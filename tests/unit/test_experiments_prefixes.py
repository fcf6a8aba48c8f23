"""Reference prefix set: held-out prompts, packing, prefix mask, storage, load-or-create."""

import numpy as np
import pytest

from dlc_jax.data.arithmetic import ArithmeticConfig, ArithmeticSource
from dlc_jax.experiments.prefixes import (
    PrefixConfig,
    PrefixSet,
    assemble,
    create_prefixes,
    heldout_prompts,
    load_or_create,
)


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_dir):
    return make_tiny_dir()


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from dlc_jax.data.tokenize import load_tokenizer

    return load_tokenizer(str(tiny_dir))


def seeded_generate(calls):
    """A packing-test generator: responses are a pure function of (seed, prompt ids); records
    calls."""

    def generate(prompt_ids, *, max_tokens, temperature, seed):
        calls.append((len(prompt_ids), max_tokens, temperature, seed))
        out = []
        for p in prompt_ids:
            rng = np.random.default_rng([seed, *map(int, p)])
            n = int(rng.integers(1, max_tokens + 1))
            out.append(rng.integers(3, 50, size=n).astype(np.int32))
        return out

    return generate


def test_prefix_mask_marks_the_positions_that_generated_response_tokens():
    ps = assemble(
        [np.array([5, 6, 7]), np.array([8])], [np.array([1, 2]), np.array([3, 4, 9])], pad_id=0
    )
    np.testing.assert_array_equal(ps.tokens, [[5, 6, 7, 1, 2], [8, 3, 4, 9, 0]])
    # row 0: prompt len 3, response 2 -> positions 2, 3 predict tokens 1, 2
    np.testing.assert_array_equal(ps.prefix_mask, [[0, 0, 1, 1, 0], [1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(ps.attention_mask, [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert ps.num_prefixes == 5 == int(ps.prefix_mask.sum())
    # the target of every prefix position is exactly a response token
    tgt = ps.tokens[:, 1:][ps.prefix_mask[:, :-1] > 0]
    np.testing.assert_array_equal(tgt, [1, 2, 3, 4, 9])


def test_heldout_prompts_use_a_split_distinct_from_training(tokenizer):
    cfg = PrefixConfig(num_prompts=20, arithmetic=ArithmeticConfig(digits=2))
    recs, ids = heldout_prompts(cfg, tokenizer)
    train = [ArithmeticSource(cfg.arithmetic, seed=0)[i]["prompt"] for i in range(20)]
    assert [r["prompt"] for r in recs] != train
    assert all(tokenizer.decode(list(i)) == r["prompt"] for i, r in zip(ids, recs))


def test_creation_is_deterministic_and_round_trips(tokenizer, tmp_path):
    cfg = PrefixConfig(num_prompts=6, max_tokens=5, temperature=0.9, sample_seed=7)
    calls = []
    a = create_prefixes(cfg, tokenizer, seeded_generate(calls), pad_id=1)
    b = create_prefixes(cfg, tokenizer, seeded_generate(calls), pad_id=1)
    assert calls[0] == (6, 5, 0.9, 7)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    a.save(tmp_path)
    c = PrefixSet.load(tmp_path)
    np.testing.assert_array_equal(c.tokens, a.tokens)
    np.testing.assert_array_equal(c.prompt_lens, a.prompt_lens)
    np.testing.assert_array_equal(c.response_lens, a.response_lens)
    assert (
        c.pad_id == 1
        and c.meta["prompts"] == a.meta["prompts"]
        and c.meta["config"]["sample_seed"] == 7
    )
    other = create_prefixes(
        PrefixConfig(num_prompts=6, max_tokens=5, temperature=0.9, sample_seed=8),
        tokenizer,
        seeded_generate([]),
    )
    assert not np.array_equal(other.tokens, a.tokens) or not np.array_equal(
        other.response_lens, a.response_lens
    )


def test_load_or_create_creates_once(tokenizer, tmp_path):
    cfg = PrefixConfig(num_prompts=4, max_tokens=3)
    calls = []
    first = load_or_create(tmp_path, cfg, tokenizer, seeded_generate(calls))
    second = load_or_create(tmp_path, cfg, tokenizer, seeded_generate(calls))
    assert len(calls) == 1
    np.testing.assert_array_equal(first.tokens, second.tokens)


def test_bad_responses_are_rejected(tokenizer):
    cfg = PrefixConfig(num_prompts=3, max_tokens=3)
    with pytest.raises(ValueError, match="empty response for held-out prompt 1"):
        create_prefixes(
            cfg, tokenizer, lambda p, **k: [np.array([4]), np.array([], np.int32), np.array([5])]
        )
    with pytest.raises(ValueError, match="2 responses for 3 prompts"):
        create_prefixes(cfg, tokenizer, lambda p, **k: [np.array([4]), np.array([5])])
    with pytest.raises(ValueError, match="max_tokens"):
        create_prefixes(cfg, tokenizer, lambda p, **k: [np.arange(3, 8)] * 3)
    with pytest.raises(ValueError, match="num_prompts"):
        PrefixConfig(num_prompts=0)


def test_load_refuses_missing_or_incomplete(tmp_path):
    with pytest.raises(FileNotFoundError, match="prefixes.npz"):
        PrefixSet.load(tmp_path)
    np.savez(tmp_path / "prefixes.npz", tokens=np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="missing arrays"):
        PrefixSet.load(tmp_path)


def test_real_jax_sampler_is_deterministic_per_seed(tokenizer, tiny_dir):
    """Prefixes sampled through a real `Sampler` (the JAX backend, in process; the same requests
    over gRPC are the sampler service's tests): same seed, same ids."""
    from dlc_jax.experiments.prefixes import client_generate
    from dlc_jax.sampler.backends import BackendConfig
    from dlc_jax.sampler.client.inprocess import InProcessSampler

    c = InProcessSampler(BackendConfig(model_dir=str(tiny_dir), max_model_len=64))
    try:
        cfg = PrefixConfig(num_prompts=6, max_tokens=4)
        a = create_prefixes(cfg, tokenizer, client_generate(c))
        b = create_prefixes(cfg, tokenizer, client_generate(c))
        other = create_prefixes(
            PrefixConfig(num_prompts=6, max_tokens=4, sample_seed=3),
            tokenizer,
            client_generate(c),
        )
    finally:
        c.close()
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, other.tokens)
    np.testing.assert_array_equal(a.prompt_lens, other.prompt_lens)  # same held-out prompts
    assert a.num_prefixes >= 6 and np.all(a.response_lens <= 4)
