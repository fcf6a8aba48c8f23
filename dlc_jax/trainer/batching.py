"""Slot-based batch assembly and packing of rollouts into fixed [B, L] arrays.

A batch is a fixed set of prompt slots (pre-assigned by the data pipeline), each needing G samples
keyed by ``sample_index``. Rollouts arriving in any order fill their (slot, sample_index) cell; a batch
is released only when every cell is filled, and its rows are always ordered by (slot order, sample
index) — never by arrival order or outcome. Rollouts sampled with a weight version more than
``max_staleness`` versions behind the trainer are dropped (counted) and their cells reopened for
resampling.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def rollout_min_version(r) -> int:
    """Oldest weight version that produced any token of rollout ``r`` (its version spans)."""
    if not r.version_spans:
        raise ValueError(f"rollout slot={r.slot_id} sample={r.sample_index}: no version spans")
    return min(v for v, _, _ in r.version_spans)


@dataclasses.dataclass
class SlotBatch:
    """One training batch: ``slots`` in order, each with ``group_size`` cells."""

    index: int
    slots: list[int]
    group_size: int
    prompts: dict = dataclasses.field(default_factory=dict)  # slot -> PromptRecord (optional payload)
    cells: dict = dataclasses.field(default_factory=dict)  # (slot, sample_index) -> Rollout

    def missing(self) -> list[tuple[int, int]]:
        return [(s, g) for s in self.slots for g in range(self.group_size) if (s, g) not in self.cells]

    def complete(self) -> bool:
        return len(self.cells) == len(self.slots) * self.group_size

    def ordered(self) -> list:
        """Rollouts ordered by (slot order, sample index). Only valid when complete."""
        if not self.complete():
            raise RuntimeError(f"batch {self.index} is incomplete: missing {self.missing()[:8]}")
        return [self.cells[(s, g)] for s in self.slots for g in range(self.group_size)]


class BatchAssembler:
    """Routes rollouts to their batch by slot id; tracks staleness drops and duplicates."""

    def __init__(self, group_size: int, max_staleness: int):
        if group_size < 1:
            raise ValueError(f"sampler.n (group size) must be >= 1, got {group_size}")
        self.group_size = int(group_size)
        self.max_staleness = int(max_staleness)
        self.batches: dict[int, SlotBatch] = {}
        self._slot_to_batch: dict[int, int] = {}
        self.dropped_stale = 0
        self.rejected = 0
        #: rollouts with any token older than this are refused ('drop' handling after a resync)
        self.min_version = -(10**9)
        self.dropped_old = 0

    def open(self, index: int, slots: list[int], prompts: dict | None = None) -> SlotBatch:
        if index in self.batches:
            raise ValueError(f"batch {index} is already open")
        dup = [s for s in slots if s in self._slot_to_batch]
        if dup or len(set(slots)) != len(slots):
            raise ValueError(f"batch {index}: slots {dup or slots} are already assigned")
        b = SlotBatch(index=index, slots=list(slots), group_size=self.group_size, prompts=dict(prompts or {}))
        self.batches[index] = b
        for s in slots:
            self._slot_to_batch[s] = index
        return b

    def is_stale(self, rollout, current_version: int) -> bool:
        return rollout_min_version(rollout) < current_version - self.max_staleness

    def add(self, rollout, current_version: int) -> str:
        """File ``rollout`` into its cell. Returns 'accepted', 'stale' (dropped, cell stays open), 'old'
        (sampled before ``min_version``, dropped),
        'duplicate' (cell already filled) or 'unknown' (slot not in an open batch / bad sample index)."""
        bi = self._slot_to_batch.get(int(rollout.slot_id))
        if bi is None or not 0 <= int(rollout.sample_index) < self.group_size:
            self.rejected += 1
            return "unknown"
        if self.is_stale(rollout, current_version):
            self.dropped_stale += 1
            return "stale"
        if rollout_min_version(rollout) < self.min_version:
            self.dropped_old += 1
            return "old"
        key = (int(rollout.slot_id), int(rollout.sample_index))
        b = self.batches[bi]
        if key in b.cells:
            self.rejected += 1
            return "duplicate"
        b.cells[key] = rollout
        return "accepted"

    def evict_stale(self, index: int, current_version: int) -> list[tuple[int, int]]:
        """Drop filled cells of batch ``index`` that became stale; return the reopened cells."""
        b = self.batches[index]
        out = [k for k, r in b.cells.items() if self.is_stale(r, current_version)]
        for k in out:
            del b.cells[k]
        self.dropped_stale += len(out)
        return out

    def drop_versions_below(self, index: int, version: int) -> list[tuple[int, int]]:
        """Drop filled cells of batch ``index`` with any token older than ``version`` (resync 'drop' mode)."""
        b = self.batches[index]
        out = [k for k, r in b.cells.items() if rollout_min_version(r) < version]
        for k in out:
            del b.cells[k]
        return out

    def release(self, index: int, current_version: int) -> list | None:
        """The ordered rollouts of batch ``index`` if complete after evicting stale cells, else None.
        A released batch is closed and its slots freed."""
        self.evict_stale(index, current_version)
        b = self.batches[index]
        if not b.complete():
            return None
        out = b.ordered()
        del self.batches[index]
        for s in b.slots:
            self._slot_to_batch.pop(s, None)
        return out


@dataclasses.dataclass
class PackedBatch:
    """Arrays for the jitted step. Row i is rollout i; position t predicts ``targets[:, t]``.

    input_ids/targets/positions int32 [B, L]; attention_mask int32 [B, L] (1 on prompt+response);
    mask float32 [B, L] (1 where targets[:, t] is a response token); lp_q float32 [B, L];
    head_ids int32 [B, L, K]; lq_head float32 [B, L, K]; version int32 [B, L] (-1 off-mask);
    slot, sample_index int32 [B].
    """

    input_ids: np.ndarray
    targets: np.ndarray
    positions: np.ndarray
    attention_mask: np.ndarray
    mask: np.ndarray
    lp_q: np.ndarray
    head_ids: np.ndarray
    lq_head: np.ndarray
    version: np.ndarray
    slot: np.ndarray
    sample_index: np.ndarray

    def arrays(self) -> dict:
        return dataclasses.asdict(self)


def pack_rollouts(rollouts: list, seq_len: int, head_k: int, pad_id: int = 0) -> PackedBatch:
    """Right-pad prompt+response of each rollout to ``seq_len`` and align sampler data to targets.

    Response token j of a rollout with prompt length P sits at position P+j and is predicted at
    position P+j-1, so ``targets[P+j-1] = response[j]``, ``mask[P+j-1] = 1``, ``lp_q[P+j-1] = logprobs[j]``.
    """
    b = len(rollouts)
    k = int(head_k)
    out = PackedBatch(
        input_ids=np.full((b, seq_len), pad_id, np.int32),
        targets=np.full((b, seq_len), pad_id, np.int32),
        positions=np.tile(np.arange(seq_len, dtype=np.int32), (b, 1)),
        attention_mask=np.zeros((b, seq_len), np.int32),
        mask=np.zeros((b, seq_len), np.float32),
        lp_q=np.zeros((b, seq_len), np.float32),
        head_ids=np.zeros((b, seq_len, k), np.int32),
        lq_head=np.zeros((b, seq_len, k), np.float32),
        version=np.full((b, seq_len), -1, np.int32),
        slot=np.zeros((b,), np.int32),
        sample_index=np.zeros((b,), np.int32),
    )
    for i, r in enumerate(rollouts):
        p, t = len(r.prompt_ids), len(r.response_ids)
        if p < 1:
            raise ValueError(f"rollout slot={r.slot_id}: empty prompt")
        if p + t > seq_len:
            raise ValueError(f"rollout slot={r.slot_id} sample={r.sample_index}: prompt {p} + response {t} tokens "
                             f"exceed seq_len {seq_len} (raise sampler.max_model_len)")
        if len(r.logprobs) != t:
            raise ValueError(f"rollout slot={r.slot_id}: {len(r.logprobs)} logprobs for {t} tokens")
        seq = np.concatenate([np.asarray(r.prompt_ids, np.int32), np.asarray(r.response_ids, np.int32)])
        out.input_ids[i, : p + t] = seq
        out.attention_mask[i, : p + t] = 1
        out.targets[i, : p + t - 1] = seq[1:]
        sl = slice(p - 1, p - 1 + t)
        out.mask[i, sl] = 1.0
        out.lp_q[i, sl] = r.logprobs
        if k:
            hk = r.head_ids.shape[1] if r.head_ids.ndim == 2 else 0
            if hk < k:
                raise ValueError(f"rollout slot={r.slot_id}: head has {hk} entries, expected sampler.head_k={k}")
            out.head_ids[i, sl] = r.head_ids[:, :k]
            out.lq_head[i, sl] = r.head_logprobs[:, :k]
        vers = np.empty(t, np.int32)
        for v, s, e in r.version_spans:
            vers[s:e] = v
        out.version[i, sl] = vers
        out.slot[i] = r.slot_id
        out.sample_index[i] = r.sample_index
    return out
