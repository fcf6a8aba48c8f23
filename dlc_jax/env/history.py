"""The token-exact history of one episode: prompt, then generated and environment tokens in turn.

`add_generated` checks the prompt a turn's `Rollout` echoes against the history (a difference is a
prefix break) and appends its tokens with log-probs, head and weight versions; `add_env` appends an
answer's token delta (loss mask 0); `mismatches` re-checks at the end that every turn is a slice of
the final sequence. A split (``env.on_prefix_break: split``): `restart` begins a new sequence in
the same row from the sampler's own prompt (the rollout's ``segment_starts``).
"""

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
        """The current sequence (what the next turn's prompt must be): the whole history, or the
        part since the last split."""
        if self.starts:
            return self.response[self.starts[-1] :]
        return self.prompt + self.response

    def _base(self) -> int:
        """Row offset of the current sequence."""
        return len(self.prompt) + self.starts[-1] if self.starts else 0

    def __len__(self) -> int:
        return len(self.prompt) + len(self.response)

    def add_generated(self, r: Rollout) -> bool:
        """Append turn ``r``'s generated tokens; False (nothing appended) when the prompt the
        sampler echoes is not exactly the history."""
        echo = [int(t) for t in r.prompt_ids]
        gen = [int(t) for t in r.response_ids]
        if echo != self.tokens or len(r.logprobs) != len(gen):
            return False
        off = len(self.response)
        self.seen.append((self._base(), echo, gen))
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
        """Start a new sequence in this row from ``echo`` (the sampler's own prompt tokens, after
        a prefix break): context only (loss mask 0), not attending to what came before."""
        ids = [int(t) for t in echo]
        if not ids:
            raise ValueError("History.restart: an empty prompt")
        self.starts.append(len(self.response))
        self._add_context(ids)

    def mismatches(self) -> int:
        """Turns whose prompt seen or tokens generated are not a slice of their sequence in the
        final row, starting at that sequence's start (and not running into the next one)."""
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
        k = self.k
        t = len(self.response)
        return Rollout(
            prompt_ids=np.asarray(self.prompt, np.int32),
            response_ids=np.asarray(self.response, np.int32),
            logprobs=np.asarray(self.logprobs, np.float32),
            head_ids=np.concatenate(self.head_ids) if self.head_ids else np.zeros((t, k), np.int32),
            head_logprobs=(
                np.concatenate(self.head_lp) if self.head_lp else np.zeros((t, k), np.float32)
            ),
            finish_reason=finish_reason,
            version_spans=list(self.spans),
            loss_mask=np.asarray(self.mask, np.float32),
            reward=float(reward),
            episode=episode,
            segment_starts=tuple(self.starts),
        )
