"""Slot-based batch assembly and packing of rollouts into fixed [B, L] arrays.

A batch is a fixed set of prompt slots with G cells each; rollouts fill their (slot, sample_index)
cell in any order and a complete batch is released ordered by (slot, sample), never by arrival.
"""

from __future__ import annotations

import dataclasses

import numpy as np

NO_TOKENS_VERSION = 2**62  # rollout_min_version of a rollout without response tokens


def rollout_min_version(r) -> int:
    """Oldest weight version that produced a token of ``r`` (no tokens: never stale)."""
    if not r.version_spans and len(r.response_ids) == 0:
        return NO_TOKENS_VERSION
    if not r.version_spans:
        raise ValueError(f"rollout slot={r.slot_id} sample={r.sample_index}: no version spans")
    return min(v for v, _, _ in r.version_spans)


@dataclasses.dataclass
class SlotBatch:
    """One training batch: ``slots`` in order, each with ``group_size`` cells."""

    index: int
    slots: list[int]
    group_size: int
    prompts: dict = dataclasses.field(default_factory=dict)  # slot -> PromptRecord
    cells: dict = dataclasses.field(default_factory=dict)  # (slot, sample_index) -> Rollout

    def missing(self) -> list[tuple[int, int]]:
        return [
            (s, g) for s in self.slots for g in range(self.group_size) if (s, g) not in self.cells
        ]

    def complete(self) -> bool:
        return len(self.cells) == len(self.slots) * self.group_size


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
        b = self.batches[index] = SlotBatch(
            index, list(slots), self.group_size, dict(prompts or {})
        )
        self._slot_to_batch.update(dict.fromkeys(slots, index))
        return b

    def is_stale(self, rollout, current_version: int) -> bool:
        return rollout_min_version(rollout) < current_version - self.max_staleness

    def add(self, rollout, current_version: int) -> str:
        """File ``rollout`` into its cell: 'accepted', 'stale' or 'old' (before ``min_version``;
        dropped, cell stays open), 'duplicate' or 'unknown' (no open batch has that cell)."""
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

    def _drop_cells(self, index: int, drop) -> list[tuple[int, int]]:
        b = self.batches[index]
        out = [k for k, r in b.cells.items() if drop(r)]
        for k in out:
            del b.cells[k]
        return out

    def drop_versions_below(self, index: int, version: int) -> list[tuple[int, int]]:
        """Drop filled cells of batch ``index`` with any token older than ``version``."""
        return self._drop_cells(index, lambda r: rollout_min_version(r) < version)

    def drop_slot(self, index: int, slot: int) -> None:
        """Take ``slot`` and its cells out of open batch ``index``."""
        b = self.batches[index]
        b.slots.remove(slot)
        for g in range(b.group_size):
            b.cells.pop((slot, g), None)
        self._slot_to_batch.pop(slot, None)

    def release(self, index: int, current_version: int) -> list | None:
        """The ordered rollouts of batch ``index`` (then closed) if complete, else None."""
        stale = self._drop_cells(index, lambda r: self.is_stale(r, current_version))  # reopened
        self.dropped_stale += len(stale)
        b = self.batches[index]
        if not b.complete():
            return None
        del self.batches[index]
        for s in b.slots:
            self._slot_to_batch.pop(s, None)
        return [b.cells[(s, g)] for s in b.slots for g in range(b.group_size)]


@dataclasses.dataclass
class PackedBatch:
    """Arrays for the jitted step; position t predicts ``targets[:, t]``. Row i is rollout i, or
    (packed) rollouts back to back, each its own segment with positions from 0.

    [B, L]: input_ids, targets, positions, attention_mask, segment_ids (0 on padding), mask (1 on
    generated targets), lp_q, version (-1 off-mask), seq_index (rollout index, -1 on padding);
    [B, L, K]: head_ids, lq_head; [N]: slot, sample_index.
    """

    input_ids: np.ndarray
    targets: np.ndarray
    positions: np.ndarray
    attention_mask: np.ndarray
    segment_ids: np.ndarray
    mask: np.ndarray
    lp_q: np.ndarray
    head_ids: np.ndarray
    lq_head: np.ndarray
    version: np.ndarray
    seq_index: np.ndarray
    slot: np.ndarray
    sample_index: np.ndarray

    def arrays(self) -> dict:
        return dataclasses.asdict(self)


def _empty(rows: int, seq_len: int, k: int, n: int, pad_id: int) -> PackedBatch:
    bl = (rows, seq_len)
    return PackedBatch(
        input_ids=np.full(bl, pad_id, np.int32),
        targets=np.full(bl, pad_id, np.int32),
        positions=np.zeros(bl, np.int32),
        attention_mask=np.zeros(bl, np.int32),
        segment_ids=np.zeros(bl, np.int32),
        mask=np.zeros(bl, np.float32),
        lp_q=np.zeros(bl, np.float32),
        head_ids=np.zeros((*bl, k), np.int32),
        lq_head=np.zeros((*bl, k), np.float32),
        version=np.full(bl, -1, np.int32),
        seq_index=np.full(bl, -1, np.int32),
        slot=np.zeros((n,), np.int32),
        sample_index=np.zeros((n,), np.int32),
    )


def _check(r, seq_len: int, k: int) -> int:
    """Length (prompt + response) of rollout ``r``, after checking it against the batch layout."""
    p, t = len(r.prompt_ids), len(r.response_ids)
    if p < 1:
        raise ValueError(f"rollout slot={r.slot_id}: empty prompt")
    if p + t > seq_len:
        raise ValueError(
            f"rollout slot={r.slot_id} sample={r.sample_index}: prompt {p} + response "
            f"{t} tokens exceed seq_len {seq_len} (raise sampler.max_model_len)"
        )
    if len(r.logprobs) != t:
        raise ValueError(f"rollout slot={r.slot_id}: {len(r.logprobs)} logprobs for {t} tokens")
    hk = r.head_ids.shape[1] if k and r.head_ids.ndim == 2 else 0
    if k and hk < k:
        raise ValueError(
            f"rollout slot={r.slot_id}: head has {hk} entries, expected sampler.head_k={k}"
        )
    if r.loss_mask is not None and (
        len(r.loss_mask) != t or np.any((r.generated_mask() > 0) & (r.token_versions() < 0))
    ):
        raise ValueError(
            f"rollout slot={r.slot_id} sample={r.sample_index}: loss_mask must have {t} entries "
            "and every generated (mask 1) token a weight version"
        )
    starts = [int(j) for j in r.segment_starts]
    if starts and (
        starts != sorted(set(starts))
        or not 0 < starts[0] <= starts[-1] < t
        or np.any(r.generated_mask()[starts] > 0)
    ):
        raise ValueError(
            f"rollout slot={r.slot_id} sample={r.sample_index}: segment_starts {starts} must "
            f"increase inside (0, {t}) and start on loss-mask-0 tokens"
        )
    return p + t


def _write(out: PackedBatch, i: int, row: int, off: int, segment: int, r, k: int) -> int:
    """Rollout ``r`` (index ``i``) into ``row`` at ``off`` from segment ``segment`` (one more per
    ``r.segment_starts`` entry); returns the segments used. ``targets[P+j-1] = response[j]``."""
    p, t = len(r.prompt_ids), len(r.response_ids)
    seq = np.concatenate([np.asarray(r.prompt_ids, np.int32), np.asarray(r.response_ids, np.int32)])
    n = p + t
    span = slice(off, off + n)
    cuts = [0] + [p + int(j) for j in r.segment_starts] + [n]
    seg = np.zeros(n, np.int32)
    pos = np.zeros(n, np.int32)
    for m, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        seg[a:b] = segment + m
        pos[a:b] = np.arange(b - a, dtype=np.int32)
    out.input_ids[row, span] = seq
    out.attention_mask[row, span] = 1
    out.segment_ids[row, span] = seg
    out.positions[row, span] = pos
    out.seq_index[row, span] = i
    out.targets[row, off : off + n - 1] = seq[1:]
    sl = slice(off + p - 1, off + p - 1 + t)
    # environment tokens (loss_mask 0) are context only: mask 0, version -1
    gen = r.generated_mask() > 0
    out.mask[row, sl] = gen
    out.lp_q[row, sl] = np.where(gen, r.logprobs, 0.0)
    if k:
        out.head_ids[row, sl] = np.where(gen[:, None], r.head_ids[:, :k], 0)
        out.lq_head[row, sl] = np.where(gen[:, None], r.head_logprobs[:, :k], 0.0)
    out.version[row, sl] = np.where(gen, r.token_versions(), -1)
    out.slot[i] = r.slot_id
    out.sample_index[i] = r.sample_index
    return len(cuts) - 1


def pack_rollouts(rollouts: list, seq_len: int, head_k: int, pad_id: int = 0) -> PackedBatch:
    """One rollout per row, right-padded to ``seq_len`` (positions 0..seq_len-1, segment 1)."""
    k = int(head_k)
    out = _empty(len(rollouts), seq_len, k, len(rollouts), pad_id)
    out.positions[:] = np.arange(seq_len, dtype=np.int32)
    for i, r in enumerate(rollouts):
        _check(r, seq_len, k)
        _write(out, i, i, 0, 1, r, k)
    return out


def pack_by_tokens(
    rollouts: list,
    row_len: int,
    head_k: int,
    pad_id: int = 0,
    *,
    rows: int | None = None,
    row_multiple: int = 1,
) -> PackedBatch:
    """Pack rollouts back to back into rows of ``row_len`` tokens (first fit, input order): the
    fewest rows rounded up to a multiple of ``row_multiple``, or exactly ``rows``."""
    k = int(head_k)
    fill: list[int] = []
    place = []
    for r in rollouts:
        n = _check(r, row_len, k)
        row = next((j for j, f in enumerate(fill) if f + n <= row_len), len(fill))
        if row == len(fill):
            fill.append(0)
        place.append((row, fill[row]))
        fill[row] += n
    need = len(fill)
    if rows is None:
        rows = max(1, -(-need // row_multiple) * row_multiple)
    elif need > rows:
        raise ValueError(
            f"pack_by_tokens: {len(rollouts)} rollouts need {need} rows of {row_len} tokens, "
            f"only {rows} allowed"
        )
    out = _empty(rows, row_len, k, len(rollouts), pad_id)
    segment = [1] * rows
    for i, (r, (row, off)) in enumerate(zip(rollouts, place)):
        segment[row] += _write(out, i, row, off, segment[row], r, k)
    return out


def token_advantages(adv: np.ndarray, seq_index: np.ndarray) -> np.ndarray:
    """Per-rollout advantages [N] spread over the tokens of each rollout [B, L] (0 on padding)."""
    adv = np.asarray(adv, np.float32)
    return np.where(seq_index >= 0, adv[np.maximum(seq_index, 0)], 0.0).astype(np.float32)


def step_arrays(
    rollouts: list,
    adv: np.ndarray,
    *,
    seq_len: int,
    head_k: int,
    pad_id: int = 0,
    pack: bool = False,
    row_multiple: int = 1,
    rows: int | None = None,
) -> dict:
    """Host arrays of the train step (``STEP_KEYS`` less the theta_s ones): one rollout per row
    with ``adv`` [N], or (``pack``) packed rows with per-token advantages [B, L]."""
    adv = np.asarray(adv, np.float32).reshape(-1)
    if not pack:
        return dict(pack_rollouts(rollouts, seq_len, head_k, pad_id).arrays(), adv=adv)
    out = pack_by_tokens(rollouts, seq_len, head_k, pad_id, rows=rows, row_multiple=row_multiple)
    return dict(out.arrays(), adv=token_advantages(adv, out.seq_index))
