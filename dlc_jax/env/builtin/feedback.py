"""A multi-turn feedback environment (``env.fn: dlc_jax.env.builtin.feedback:Feedback``): a wrong
answer is told to try again, up to ``env.max_turns`` turns. Reward: ``correct * decay**k`` for a
correct answer at (0-based) turn k, which ends the episode; 0 for a wrong one."""

from __future__ import annotations

from fractions import Fraction

from dlc_jax.data.answers import candidate_answer, parse_number


class Feedback:
    def __init__(
        self,
        retry_message: str = "Not quite, try again.",
        correct: float = 1.0,
        decay: float = 0.5,
        system: str = "",
    ) -> None:
        self.retry_message = retry_message
        self.correct = float(correct)
        self.decay = float(decay)
        self.system = system
        self.gold: Fraction | None = None
        self.turn = 0

    def reset(self, row: dict) -> list[dict]:
        self.gold = parse_number(str(row["answer"]))
        self.turn = 0
        sys = [{"role": "system", "content": self.system}] if self.system else []
        return sys + [{"role": "user", "content": str(row["prompt"])}]

    def step(self, completion: str) -> tuple[list[dict], float, bool]:
        k, self.turn = self.turn, self.turn + 1
        cand = candidate_answer(completion)
        got = parse_number(cand) if cand is not None else None
        if got is not None and self.gold is not None and got == self.gold:
            return [], self.correct * self.decay**k, True
        return [{"role": "user", "content": self.retry_message}], 0.0, False
