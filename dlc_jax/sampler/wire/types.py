"""Sampler data types and their proto conversions (P prompt, T response length, K head size)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from . import sampler_pb2 as pb


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """What to sample: temperature 0 = greedy, else logprobs of the top-k/top-p-masked
    logits / T; top_k <= 0 off; head_k top logprobs per position; seed None: the engine's."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    head_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    return_routed_experts: bool = False  # mixture-of-experts: Rollout.routed_experts

    def to_proto(self) -> pb.SamplingParams:
        return pb.SamplingParams(
            n=int(self.n),
            max_tokens=int(self.max_tokens),
            temperature=float(self.temperature),
            top_p=float(self.top_p),
            top_k=int(self.top_k),
            head_k=int(self.head_k),
            stop_token_ids=[int(t) for t in self.stop_token_ids],
            has_seed=self.seed is not None,
            seed=int(self.seed or 0),
            return_routed_experts=bool(self.return_routed_experts),
        )

    @classmethod
    def from_proto(cls, m: pb.SamplingParams) -> SamplingParams:
        return cls(
            n=int(m.n),
            max_tokens=int(m.max_tokens),
            temperature=float(m.temperature),
            top_p=float(m.top_p) if m.top_p != 0 else 1.0,  # proto3's 0: unset (no nucleus)
            top_k=int(m.top_k),
            head_k=int(m.head_k),
            stop_token_ids=tuple(int(t) for t in m.stop_token_ids),
            seed=int(m.seed) if m.has_seed else None,
            return_routed_experts=bool(m.return_routed_experts),
        )


def routed_to_wire(routed: np.ndarray | None) -> dict:
    """Rollout proto fields for routed experts [R, L, K]: ids as 1-byte (fewer than 256 experts
    seen) or 2-byte little-endian integers."""
    if routed is None:
        return {}
    a = np.asarray(routed)
    if a.ndim != 3:
        raise ValueError(f"routed_experts must be [positions, layers, top_k], got {a.shape}")
    width = 1 if a.size == 0 or int(a.max()) < 256 else 2
    data = a.astype("<u1" if width == 1 else "<u2").tobytes()
    return dict(
        routed_layers=a.shape[1], routed_top_k=a.shape[2], routed_bytes=width, routed_experts=data
    )


def routed_from_wire(m, rows: int) -> np.ndarray | None:
    """Routed experts [rows, L, K] (uint8/uint16) from a Rollout proto, or None when absent."""
    if not m.routed_layers:
        return None
    width = int(m.routed_bytes)
    if width not in (1, 2):
        raise ValueError(f"rollout {m.request_id}: routed_bytes must be 1 or 2, got {width}")
    shape = (max(rows, 0), int(m.routed_layers), int(m.routed_top_k))
    n = int(np.prod(shape))
    if len(m.routed_experts) != n * width:
        raise ValueError(
            f"rollout {m.request_id}: {len(m.routed_experts)} bytes of routed expert ids, expected "
            f"{shape} (P + T - 1 positions x layers x top_k) x {width}"
        )
    a = np.frombuffer(m.routed_experts, "<u1" if width == 1 else "<u2")
    return a.reshape(shape).astype(np.uint8 if width == 1 else np.uint16)


@dataclasses.dataclass
class Rollout:
    """One sampled response: prompt_ids int32 [P]; response_ids int32 [T]; logprobs float32
    [T] (processed); head_ids int32 / head_logprobs float32 [T, K] (top-K, rank order; K = 0: no
    head); version_spans (version, start, end): tokens [start, end) sampled with that version.

    Multi-turn episodes (`dlc_jax.env`, trainer-side only): ``loss_mask`` float32 [T] (1 on
    generated tokens; None: all), ``reward`` from the environment, ``episode`` counters,
    ``segment_starts`` (response offsets where a new sequence starts: positions restart).
    """

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    logprobs: np.ndarray
    head_ids: np.ndarray
    head_logprobs: np.ndarray
    finish_reason: str
    version_spans: list[tuple[int, int, int]]
    slot_id: int = 0
    sample_index: int = 0
    request_id: str = ""
    # [P + T - 1, L, K] uint8/uint16: experts routed at each position run (None: not asked / dense)
    routed_experts: np.ndarray | None = None
    loss_mask: np.ndarray | None = None
    reward: float | None = None
    episode: dict | None = None
    segment_starts: tuple[int, ...] = ()

    @property
    def versions(self) -> list[int]:
        return [v for v, _, _ in self.version_spans]

    def generated_mask(self) -> np.ndarray:
        """float32 [T]: 1 on tokens the sampler generated (trained on), 0 on environment tokens."""
        if self.loss_mask is None:
            return np.ones(len(self.response_ids), np.float32)
        return np.asarray(self.loss_mask, np.float32)

    def token_versions(self) -> np.ndarray:
        """int32 [T]: the weight version that generated each token, -1 on environment tokens."""
        out = np.full(len(self.response_ids), -1, np.int32)
        for v, s, e in self.version_spans:
            out[s:e] = v
        return out

    def to_proto(self) -> pb.Rollout:
        if self.loss_mask is not None or self.reward is not None or self.segment_starts:
            raise ValueError(
                "an environment episode (loss_mask / reward set) is trainer-side only and is "
                "never sent over the wire"
            )
        k = int(self.head_ids.shape[1]) if self.head_ids.ndim == 2 else 0
        return pb.Rollout(
            request_id=self.request_id,
            slot_id=int(self.slot_id),
            sample_index=int(self.sample_index),
            prompt_ids=np.asarray(self.prompt_ids, np.int32).tolist(),
            response_ids=np.asarray(self.response_ids, np.int32).tolist(),
            logprobs=np.asarray(self.logprobs, np.float32).tolist(),
            head_k=k,
            head_ids=np.asarray(self.head_ids, np.int32).reshape(-1).tolist(),
            head_logprobs=np.asarray(self.head_logprobs, np.float32).reshape(-1).tolist(),
            finish_reason=self.finish_reason,
            version_spans=[
                pb.VersionSpan(version=int(v), start=int(s), end=int(e))
                for v, s, e in self.version_spans
            ],
            **routed_to_wire(self.routed_experts),
        )

    @classmethod
    def from_proto(cls, m: pb.Rollout) -> Rollout:
        t = len(m.response_ids)
        k = int(m.head_k)
        head_ids = np.asarray(m.head_ids, np.int32)
        head_lp = np.asarray(m.head_logprobs, np.float32)
        if head_ids.size != t * k or head_lp.size != t * k:
            raise ValueError(
                f"rollout {m.request_id}/{m.slot_id}/{m.sample_index}: head has {head_ids.size} "
                f"ids and {head_lp.size} logprobs, expected T*K = {t}*{k}"
            )
        if len(m.logprobs) != t:
            raise ValueError(
                f"rollout {m.request_id}: {len(m.logprobs)} logprobs for {t} response tokens"
            )
        return cls(
            prompt_ids=np.asarray(m.prompt_ids, np.int32),
            response_ids=np.asarray(m.response_ids, np.int32),
            logprobs=np.asarray(m.logprobs, np.float32),
            head_ids=head_ids.reshape(t, k),
            head_logprobs=head_lp.reshape(t, k),
            finish_reason=m.finish_reason,
            version_spans=[(int(s.version), int(s.start), int(s.end)) for s in m.version_spans],
            slot_id=int(m.slot_id),
            sample_index=int(m.sample_index),
            request_id=m.request_id,
            routed_experts=routed_from_wire(m, len(m.prompt_ids) + t - 1),
        )


@dataclasses.dataclass(frozen=True)
class PushResult:
    """Outcome of a weight push (or load) to one sampler or a pool (ok: at least one sampler took
    `version`; `code`: gRPC status name). transport: "grpc" | "socket" | "relay" (a pool: all used,
    comma-separated; a load: "")."""

    ok: bool
    version: int
    message: str
    bytes: int = 0
    seconds: float = 0.0
    code: str = "OK"
    per_sampler: dict[str, PushResult] = dataclasses.field(default_factory=dict)
    removed: tuple[str, ...] = ()
    readmitted: tuple[str, ...] = ()
    transport: str = ""
    # relayed push: address -> outcome at each sampler this one's push was forwarded to
    relayed: dict[str, PushResult] = dataclasses.field(default_factory=dict)
    # tensor bytes this process itself sent (a pool: summed over its direct pushes; relays excluded)
    egress_bytes: int = 0

    @classmethod
    def from_proto(cls, m: pb.PushResult) -> PushResult:
        relayed = {
            r.address: cls(r.ok, int(r.version), r.message, int(r.bytes), code=r.code or "OK")
            for r in m.relayed
        }
        return cls(
            bool(m.ok), int(m.version), m.message, int(m.bytes), float(m.seconds), relayed=relayed
        )


def mix_seed(seed: int, *parts: int) -> int:
    """A request seed in [0, 2**31 - 1) from a run seed and integers (slot, batch, ...), so a
    request's samples do not depend on who sends it."""
    h = int(seed)
    for p in parts:
        h = h * 1_000_003 + int(p) * 7919 + 12345
    return h % (2**31 - 1)


def spans_from_versions(versions: Sequence[int]) -> list[tuple[int, int, int]]:
    """Per-token versions [T] -> contiguous (version, start, end) spans."""
    spans: list[tuple[int, int, int]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1][0] == v:
            spans[-1] = (v, spans[-1][1], i + 1)
        else:
            spans.append((int(v), i, i + 1))
    return spans
