"""The token-exact history of one episode: prompt, then generated and environment tokens in turn.
A turn whose echoed prompt differs from the history is a prefix break; after a split, `restart`
begins a new sequence in the same row (the rollout's ``segment_starts``)."""

from __future__ import annotations

import numpy as np

from dlc_jax.sampler.wire.types import Rollout


class History:
    def __init__(self, prompt_ids, head_k: int) -> None:
        self.prompt = [int(t) for t in prompt_ids]
        self.k = int(head_k)
        self.response: list[int] = []
        self.mask: list[float] = []
        self.logprobs: list[float] = []
        self.head_ids: list[np.ndarray] = []
        self.head_lp: list[np.ndarray] = []
        self.spans: list[tuple[int, int, int]] = []
        # per turn: (row offset of its sequence, prompt echoed, generated)
        self.seen: list[tuple[int, list[int], list[int]]] = []
        self.env_tokens = 0
        self.starts: list[int] = []  # response offsets where a split-off sequence starts

    @property
    def tokens(self) -> list[int]:
        """The current sequence (the next turn's prompt): all of it, or the part since a split."""
        return self.response[self.starts[-1] :] if self.starts else self.prompt + self.response

    def __len__(self) -> int:
        return len(self.prompt) + len(self.response)

    def add_generated(self, r: Rollout) -> bool:
        """Append turn ``r``'s tokens; False (none added) unless it echoes the history exactly."""
        echo = [int(t) for t in r.prompt_ids]
        gen = [int(t) for t in r.response_ids]
        if echo != self.tokens or len(r.logprobs) != len(gen):
            return False
        off = len(self.response)
        base = len(self.prompt) + self.starts[-1] if self.starts else 0  # row offset of `tokens`
        self.seen.append((base, echo, gen))
        self.response += gen
        self.mask += [1.0] * len(gen)
        self.logprobs += [float(x) for x in r.logprobs]
        k = self.k
        hid = np.zeros((len(gen), k), np.int32)
        hlp = np.zeros((len(gen), k), np.float32)
        if k and r.head_ids.ndim == 2 and r.head_ids.shape[1] >= k:
            hid[:] = r.head_ids[:, :k]
            hlp[:] = r.head_logprobs[:, :k]
        self.head_ids.append(hid)
        self.head_lp.append(hlp)
        for v, s, e in r.version_spans:
            if self.spans and self.spans[-1][0] == v and self.spans[-1][2] == off + s:
                self.spans[-1] = (v, self.spans[-1][1], off + e)
            else:
                self.spans.append((int(v), off + s, off + e))
        return True

    def _add_context(self, ids: list[int]) -> None:
        """Append tokens that are context only: loss mask 0, no log-prob, an empty head."""
        n = len(ids)
        self.response += ids
        self.mask += [0.0] * n
        self.logprobs += [0.0] * n
        self.head_ids.append(np.zeros((n, self.k), np.int32))
        self.head_lp.append(np.zeros((n, self.k), np.float32))

    def add_env(self, ids: list[int]) -> None:
        """Append an environment answer's tokens (context only)."""
        self._add_context([int(t) for t in ids])
        self.env_tokens += len(ids)

    def restart(self, echo) -> None:
        """Start a new sequence in this row from ``echo`` (after a prefix break): context only."""
        ids = [int(t) for t in echo]
        if not ids:
            raise ValueError("History.restart: an empty prompt")
        self.starts.append(len(self.response))
        self._add_context(ids)

    def mismatches(self) -> int:
        """Turns whose prompt or generated tokens are not a slice of their sequence in the row."""
        full = self.prompt + self.response
        ends = [len(self.prompt) + s for s in self.starts] + [len(full)]
        bad = 0
        for base, echo, gen in self.seen:
            end = min(e for e in ends if e > base)
            p, g = base + len(echo), base + len(echo) + len(gen)
            if full[base:p] != echo or full[p:g] != gen or g > end:
                bad += 1
        return bad

    def rollout(self, finish_reason: str, reward: float, episode: dict) -> Rollout:
        t_k = (len(self.response), self.k)
        hid = np.concatenate(self.head_ids) if self.head_ids else np.zeros(t_k, np.int32)
        hlp = np.concatenate(self.head_lp) if self.head_lp else np.zeros(t_k, np.float32)
        return Rollout(
            prompt_ids=np.asarray(self.prompt, np.int32),
            response_ids=np.asarray(self.response, np.int32),
            logprobs=np.asarray(self.logprobs, np.float32),
            head_ids=hid,
            head_logprobs=hlp,
            finish_reason=finish_reason,
            version_spans=list(self.spans),
            loss_mask=np.asarray(self.mask, np.float32),
            reward=float(reward),
            episode=episode,
            segment_starts=tuple(self.starts),
        )
