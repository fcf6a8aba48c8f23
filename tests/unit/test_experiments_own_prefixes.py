"""Own-prefix sampling from a real tiny Qwen3 vs an independent greedy decode; prefix-set
packing."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlc_jax.experiments.own_prefixes import own_prefix_set, sample_responses


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from model_helpers import make_random_hf_dir

    from dlc_jax.model import load_hf

    d = make_random_hf_dir(
        tmp_path_factory.mktemp("m"),
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        noise=0.5,
    )
    return load_hf(str(d))


_WIDTH = 16  # every reference forward has this one shape: one compile for the whole file


@nnx.jit
def _logits(model, ids):
    return model(ids)


def _greedy(model, prompt, n, eos):
    """Greedy decode by full forwards (no cache, no mask): the sequence so far, right-padded to
    _WIDTH; a causal model's logits at the last real position do not see the padding."""
    assert len(prompt) + n <= _WIDTH
    ids = np.zeros((1, _WIDTH), np.int32)
    ids[0, : len(prompt)] = prompt
    cur = len(prompt)
    out = []
    for _ in range(n):
        logits = np.asarray(_logits(model, jnp.asarray(ids)))[0, cur - 1]
        t = int(np.argmax(logits))
        out.append(t)
        if t == eos:
            break
        ids[0, cur] = t
        cur += 1
    return out


def test_near_greedy_sampling_matches_a_direct_greedy_decode(model):
    prompts = [np.array([5, 9, 14], np.int32), np.array([7, 3, 11, 20, 4], np.int32)]
    v = int(np.asarray(model.unembedding()).shape[0])
    # an eos id that the greedy path hits in row 0 only (its 3rd token), to check per-row stopping
    ref0 = _greedy(model, prompts[0], 6, eos=-1)
    eos = ref0[2]
    got = sample_responses(model, prompts, max_tokens=6, temperature=1e-5, seed=0, eos_id=eos)
    assert got[0].tolist() == _greedy(model, prompts[0], 6, eos)
    assert got[1].tolist() == _greedy(model, prompts[1], 6, eos)
    assert got[0].tolist()[-1] == eos and len(got[0]) <= 3
    assert all(0 <= t < v for r in got for t in r.tolist())


def test_sampling_is_seeded_and_packs_into_a_prefix_set(model):
    prompts = [np.array([5, 9, 14], np.int32), np.array([7, 3], np.int32)]
    a = sample_responses(model, prompts, max_tokens=5, temperature=1.0, seed=3, eos_id=-1)
    b = sample_responses(model, prompts, max_tokens=5, temperature=1.0, seed=3, eos_id=-1)
    c = sample_responses(model, prompts, max_tokens=5, temperature=1.0, seed=4, eos_id=-1)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert [x.tolist() for x in a] != [x.tolist() for x in c]
    ps = own_prefix_set(model, prompts, max_tokens=5, temperature=1.0, seed=3, eos_id=-1)
    assert ps.num_prefixes == 10 and ps.prompt_lens.tolist() == [3, 2]
    assert ps.tokens[0, 3:8].tolist() == a[0].tolist()
    with pytest.raises(ValueError, match="temperature"):
        sample_responses(model, prompts, max_tokens=2, temperature=0.0, seed=0, eos_id=-1)
