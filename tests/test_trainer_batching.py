"""Slot-based batch assembly: order independence, staleness bound, duplicates; packing alignment."""

import random

import numpy as np
import pytest

from dlc_jax.sampler.types import Rollout
from dlc_jax.trainer.batching import BatchAssembler, pack_rollouts


def _ro(slot, g, version=0, t=None, k=2):
    t = t if t is not None else 1 + (slot * 7 + g) % 4  # varying lengths
    rng = np.random.default_rng(slot * 100 + g)
    return Rollout(prompt_ids=np.array([1, 2, 3][: 1 + slot % 3], np.int32),
                   response_ids=rng.integers(5, 50, t).astype(np.int32),
                   logprobs=-rng.random(t).astype(np.float32),
                   head_ids=rng.integers(5, 50, (t, k)).astype(np.int32),
                   head_logprobs=-rng.random((t, k)).astype(np.float32),
                   finish_reason="length", version_spans=[(version, 0, t)], slot_id=slot, sample_index=g)


def test_release_order_independent_of_completion_order():
    slots, G = [10, 3, 7], 4
    rollouts = [_ro(s, g) for s in slots for g in range(G)]
    released = []
    for seed in range(5):
        asm = BatchAssembler(G, max_staleness=2)
        asm.open(0, slots)
        order = rollouts[:]
        random.Random(seed).shuffle(order)
        for i, r in enumerate(order):
            assert asm.release(0, 0) is None  # never released before every cell is filled
            assert asm.add(r, current_version=0) == "accepted"
        out = asm.release(0, 0)
        released.append([(r.slot_id, r.sample_index) for r in out])
        packed = pack_rollouts(out, 16, 2)
        if seed:
            for k, v in packed.arrays().items():
                np.testing.assert_array_equal(v, first[k], err_msg=k)
        else:
            first = packed.arrays()
    assert all(x == [(s, g) for s in slots for g in range(G)] for x in released)


def test_routing_to_batches_duplicates_and_unknown():
    asm = BatchAssembler(2, max_staleness=1)
    asm.open(0, [0, 1])
    asm.open(1, [2, 3])
    with pytest.raises(ValueError, match="already"):
        asm.open(2, [3, 4])
    assert asm.add(_ro(2, 0), 0) == "accepted"
    assert asm.add(_ro(2, 0), 0) == "duplicate"
    assert asm.add(_ro(9, 0), 0) == "unknown"
    assert asm.add(_ro(2, 5), 0) == "unknown"
    for s in (2, 3):
        for g in range(2):
            asm.add(_ro(s, g), 0)
    assert asm.release(0, 0) is None  # batch 0 still empty; batch 1 complete
    assert [r.slot_id for r in asm.release(1, 0)] == [2, 2, 3, 3]
    assert asm.rejected == 4  # duplicate, 2 unknown, and the loop re-adding (2, 0)


def test_staleness_bound_drops_and_reopens():
    asm = BatchAssembler(2, max_staleness=2)
    asm.open(0, [0])
    assert asm.add(_ro(0, 0, version=1), current_version=4) == "stale"  # 1 < 4 - 2
    assert asm.add(_ro(0, 0, version=2), current_version=4) == "accepted"  # exactly at the bound
    assert asm.add(_ro(0, 1, version=3), current_version=4) == "accepted"
    assert asm.dropped_stale == 1
    # the trainer moves on: version-2 rollout becomes too old before release -> evicted, cell reopened
    assert asm.release(0, current_version=5) is None
    assert asm.batches[0].missing() == [(0, 0)] and asm.dropped_stale == 2
    # a mixed-version rollout counts by its oldest token
    r = _ro(0, 0, t=4)
    r.version_spans = [(2, 0, 2), (5, 2, 4)]
    assert asm.add(r, current_version=5) == "stale"
    r.version_spans = [(3, 0, 2), (5, 2, 4)]
    assert asm.add(r, current_version=5) == "accepted"
    out = asm.release(0, 5)
    assert [x.sample_index for x in out] == [0, 1]


def test_pack_alignment_hand_checked():
    r = Rollout(prompt_ids=np.array([7, 8], np.int32), response_ids=np.array([20, 21, 22], np.int32),
                logprobs=np.array([-0.1, -0.2, -0.3], np.float32),
                head_ids=np.array([[20, 1], [21, 2], [3, 22]], np.int32),
                head_logprobs=np.array([[-0.1, -2], [-0.2, -3], [-1, -0.3]], np.float32),
                finish_reason="stop", version_spans=[(4, 0, 1), (5, 1, 3)], slot_id=9, sample_index=1)
    p = pack_rollouts([r], seq_len=8, head_k=2, pad_id=0)
    np.testing.assert_array_equal(p.input_ids[0], [7, 8, 20, 21, 22, 0, 0, 0])
    np.testing.assert_array_equal(p.targets[0], [8, 20, 21, 22, 0, 0, 0, 0])
    np.testing.assert_array_equal(p.mask[0], [0, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(p.lp_q[0], [0, -0.1, -0.2, -0.3, 0, 0, 0, 0])
    np.testing.assert_array_equal(p.version[0], [-1, 4, 5, 5, -1, -1, -1, -1])
    np.testing.assert_array_equal(p.attention_mask[0], [1, 1, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(p.head_ids[0, 3], [3, 22])
    assert p.slot[0] == 9 and p.sample_index[0] == 1
    with pytest.raises(ValueError, match="seq_len"):
        pack_rollouts([r], seq_len=4, head_k=2)
    with pytest.raises(ValueError, match="head_k"):
        pack_rollouts([r], seq_len=8, head_k=3)


def test_drop_mode_after_resync_reopens_and_refuses_old_versions():
    asm = BatchAssembler(2, max_staleness=10)
    asm.open(0, [0])
    assert asm.add(_ro(0, 0, version=1), current_version=3) == "accepted"
    assert asm.add(_ro(0, 1, version=3), current_version=3) == "accepted"
    # resync to version 3 with stale_rollouts=drop: cells sampled before 3 are reopened, late ones refused
    assert asm.drop_versions_below(0, 3) == [(0, 0)]
    asm.min_version = 3
    assert asm.add(_ro(0, 0, version=2), current_version=3) == "old" and asm.dropped_old == 1
    assert asm.add(_ro(0, 0, version=3), current_version=3) == "accepted"
    assert [r.sample_index for r in asm.release(0, 3)] == [0, 1]
