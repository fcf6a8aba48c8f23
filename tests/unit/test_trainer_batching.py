"""Slot-based batch assembly: order independence, staleness bound, duplicates; packing alignment;
token-budget packing layouts (their loss and gradients: integration tier)."""

import random

import numpy as np
import pytest
from step_helpers import fixed_rollout

from dlc_jax.sampler.wire.types import Rollout
from dlc_jax.trainer.batching import (
    BatchAssembler,
    pack_by_tokens,
    pack_rollouts,
    step_arrays,
    token_advantages,
)


def _ro(slot, g, version=0, t=None, k=2):
    t = t if t is not None else 1 + (slot * 7 + g) % 4  # varying lengths
    rng = np.random.default_rng(slot * 100 + g)
    return Rollout(
        prompt_ids=np.array([1, 2, 3][: 1 + slot % 3], np.int32),
        response_ids=rng.integers(5, 50, t).astype(np.int32),
        logprobs=-rng.random(t).astype(np.float32),
        head_ids=rng.integers(5, 50, (t, k)).astype(np.int32),
        head_logprobs=-rng.random((t, k)).astype(np.float32),
        finish_reason="length",
        version_spans=[(version, 0, t)],
        slot_id=slot,
        sample_index=g,
    )


def test_release_order_independent_of_completion_order():
    slots, G = [10, 3, 7], 4
    rollouts = [_ro(s, g) for s in slots for g in range(G)]
    released, arrays = [], []
    for seed in range(5):
        asm = BatchAssembler(G, max_staleness=2)
        asm.open(0, slots)
        order = rollouts[:]
        random.Random(seed).shuffle(order)
        for r in order:
            assert asm.release(0, 0) is None  # never released before every cell is filled
            assert asm.add(r, current_version=0) == "accepted"
        out = asm.release(0, 0)
        released.append([(r.slot_id, r.sample_index) for r in out])
        arrays.append(pack_rollouts(out, 16, 2).arrays())
        for k, v in arrays[-1].items():
            np.testing.assert_array_equal(v, arrays[0][k], err_msg=k)
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
    # the trainer moves on: the version-2 rollout becomes too old before release -> evicted, cell
    # reopened
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
    r = Rollout(
        prompt_ids=np.array([7, 8], np.int32),
        response_ids=np.array([20, 21, 22], np.int32),
        logprobs=np.array([-0.1, -0.2, -0.3], np.float32),
        head_ids=np.array([[20, 1], [21, 2], [3, 22]], np.int32),
        head_logprobs=np.array([[-0.1, -2], [-0.2, -3], [-1, -0.3]], np.float32),
        finish_reason="stop",
        version_spans=[(4, 0, 1), (5, 1, 3)],
        slot_id=9,
        sample_index=1,
    )
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
    # resync to version 3 with stale_rollouts=drop: cells sampled before 3 are reopened, late ones
    # refused
    assert asm.drop_versions_below(0, 3) == [(0, 0)]
    asm.min_version = 3
    assert asm.add(_ro(0, 0, version=2), current_version=3) == "old" and asm.dropped_old == 1
    assert asm.add(_ro(0, 0, version=3), current_version=3) == "accepted"
    assert [r.sample_index for r in asm.release(0, 3)] == [0, 1]


def test_pack_by_tokens_layout_hand_checked():
    """Lengths 5, 5, 5, 4 in rows of 10: first fit puts rollouts 0+1 in row 0 and 2+3 in row 1;
    each is its own segment with positions from 0, and no target crosses a segment boundary."""
    rs = [
        fixed_rollout([1, 2], [10, 11, 12], 0),
        fixed_rollout([3, 4, 5], [13, 14], 1),
        fixed_rollout([6], [15, 16, 17, 18], 2),
        fixed_rollout([7, 8], [19, 20], 3),
    ]
    p = pack_by_tokens(rs, row_len=10, head_k=2, pad_id=0)
    np.testing.assert_array_equal(
        p.input_ids, [[1, 2, 10, 11, 12, 3, 4, 5, 13, 14], [6, 15, 16, 17, 18, 7, 8, 19, 20, 0]]
    )
    np.testing.assert_array_equal(p.segment_ids, [[1] * 5 + [2] * 5, [1] * 5 + [2] * 4 + [0]])
    np.testing.assert_array_equal(
        p.positions, [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 1, 2, 3, 0]]
    )
    np.testing.assert_array_equal(
        p.targets, [[2, 10, 11, 12, 0, 4, 5, 13, 14, 0], [15, 16, 17, 18, 0, 8, 19, 20, 0, 0]]
    )
    np.testing.assert_array_equal(
        p.mask, [[0, 1, 1, 1, 0, 0, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0, 1, 1, 0, 0]]
    )
    np.testing.assert_allclose(p.lp_q[0], [0, -0.1, -0.2, -0.3, 0, 0, 0, -0.1, -0.2, 0], rtol=1e-6)
    np.testing.assert_array_equal(p.seq_index, [[0] * 5 + [1] * 5, [2] * 5 + [3] * 4 + [-1]])
    np.testing.assert_array_equal(p.version[1], [3, 3, 3, 3, -1, -1, 3, 3, -1, -1])
    np.testing.assert_array_equal(p.slot, [0, 1, 2, 3])
    np.testing.assert_allclose(
        token_advantages(np.array([1.0, -1.0, 2.0, 0.5]), p.seq_index)[1],
        [2, 2, 2, 2, 2, 0.5, 0.5, 0.5, 0.5, 0],
    )
    # the row count rounds up to a multiple (micro-batches x devices), or is fixed by the caller
    assert pack_by_tokens(rs, row_len=10, head_k=2, row_multiple=4).input_ids.shape == (4, 10)
    with pytest.raises(ValueError, match="need 2 rows"):
        pack_by_tokens(rs, row_len=10, head_k=2, rows=1)
    with pytest.raises(ValueError, match="seq_len 4"):
        pack_by_tokens(rs, row_len=4, head_k=2)
    # unpacked batches carry one segment per row and one advantage per row
    u = step_arrays(rs, np.arange(4.0), seq_len=6, head_k=2)
    assert u["adv"].shape == (4,) and u["segment_ids"].max() == 1
    np.testing.assert_array_equal(u["segment_ids"], u["attention_mask"])


@pytest.mark.parametrize(
    "n, mode, max_len, want",
    [
        (1, "pow2", 2048, 16),
        (17, "pow2", 2048, 32),
        (100, "pow2", 2048, 128),
        (129, "pow2", 2048, 256),
        (1500, "pow2", 2000, 2000),  # capped at max_model_len (a multiple of 16)
        (1500, "pow2", 1990, 2000),  # ... rounded up to 16
        (2100, "pow2", 2048, 2112),  # never below n
        (100, "pow2", 0, 128),  # no cap
        (100, "fine", 2048, 112),
        (100, "max", 2048, 2048),
        (3000, "max", 2048, 3008),
    ],
)
def test_length_buckets_hand_checked(n, mode, max_len, want):
    from dlc_jax.trainer.step_inputs import bucket

    assert bucket(n, mode, max_len) == want


def test_pow2_buckets_give_few_lengths():
    from dlc_jax.trainer.step_inputs import bucket

    assert len({bucket(n, "pow2", 2048) for n in range(1, 2049)}) == 8  # 16 .. 2048
    assert len({bucket(n, "fine", 2048) for n in range(1, 2049)}) == 128
    with pytest.raises(ValueError, match="pow2"):
        bucket(10, "pow3", 2048)
