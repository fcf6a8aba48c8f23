"""Generate request checks: a failure is a one-line `RequestError` naming the field."""

from __future__ import annotations

import math

from ..wire import sampler_pb2 as pb
from ..wire.types import SamplingParams


class RequestError(ValueError):
    pass


def validate_generate(
    req: pb.GenerateRequest,
    *,
    vocab_size: int,
    max_model_len: int,
    max_n: int,
    max_head_k: int,
    max_prompts: int,
    min_temperature: float = 0.01,
) -> tuple[list[tuple[int, list[int]]], SamplingParams]:
    """-> ([(slot_id, token_ids)], SamplingParams) or RequestError naming the bad field."""
    if not req.HasField("params"):
        raise RequestError("params: missing")
    p = SamplingParams.from_proto(req.params)
    if not 1 <= p.n <= max_n:
        raise RequestError(f"params.n = {p.n} outside [1, {max_n}]")
    if p.max_tokens < 1:
        raise RequestError(f"params.max_tokens = {p.max_tokens} must be >= 1")
    if not (math.isfinite(p.temperature) and p.temperature >= 0):
        raise RequestError(
            f"params.temperature = {p.temperature} must be finite and >= 0 (0 = greedy)"
        )
    if 0 < p.temperature < min_temperature:
        raise RequestError(
            f"params.temperature = {p.temperature:g} is below the floor {min_temperature:g}; "
            "use 0 for greedy decoding"
        )
    if not (0 < p.top_p <= 1):
        raise RequestError(f"params.top_p = {p.top_p} must be in (0, 1]")
    if p.top_k < -1:
        raise RequestError(f"params.top_k = {p.top_k} must be -1, 0 (off) or >= 1")
    if p.head_k > max_head_k:
        raise RequestError(f"params.head_k = {p.head_k} exceeds the server cap {max_head_k}")
    for t in p.stop_token_ids:
        if not 0 <= t < vocab_size:
            raise RequestError(
                f"params.stop_token_ids: {t} outside the vocabulary [0, {vocab_size})"
            )
    if not 1 <= len(req.prompts) <= max_prompts:
        raise RequestError(f"prompts: {len(req.prompts)} prompts, expected 1..{max_prompts}")
    out = []
    for i, pr in enumerate(req.prompts):
        ids = list(pr.token_ids)
        if not ids:
            raise RequestError(f"prompts[{i}] (slot {pr.slot_id}): empty token_ids")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(
                f"prompts[{i}] (slot {pr.slot_id}): token id {bad[0]} outside the vocabulary [0, "
                f"{vocab_size})"
            )
        if len(ids) + p.max_tokens > max_model_len:
            raise RequestError(
                f"prompts[{i}] (slot {pr.slot_id}): prompt length {len(ids)} + max_tokens "
                f"{p.max_tokens} exceeds max_model_len {max_model_len}"
            )
        out.append((int(pr.slot_id), ids))
    return out, p
