"""Background rollout requests: one thread per Generate stream, feeding a BatchAssembler.

A stream that fails records the error (``failures``) and leaves its cells open, so after a
reconnect the trainer requests the still-missing cells again: no batch is lost, no cell filled
twice. An INVALID_ARGUMENT answer is filed in ``refused`` (batch, slots, error) for the trainer.
"""

from __future__ import annotations

import threading

import numpy as np

from dlc_jax.trainer.batching import BatchAssembler


class RolloutFeeder:
    """Issues Generate calls for batch cells and fills ``assembler`` from background threads.

    client_fn / version_fn: () -> the current sampler / the trainer's weight version; params_fn:
    ``(batch, attempt, sample_index) -> SamplingParams`` (n = 1); accept_fn: ``rollout -> bool``,
    the rollouts it refuses (versions without a snapshot) are counted and their cells re-requested.
    """

    def __init__(self, assembler: BatchAssembler, client_fn, version_fn, params_fn, accept_fn=None):
        self.asm = assembler
        self.accept_fn = accept_fn or (lambda r: True)
        self.rejected_unknown_version = 0
        self.client_fn = client_fn
        self.version_fn = version_fn
        self.params_fn = params_fn
        self.cond = threading.Condition()
        self.outstanding: dict[int, int] = {}
        self.failures: list[BaseException] = []
        self.refused: list[tuple[int, list[int], BaseException]] = []  # INVALID_ARGUMENT answers
        self.attempts: dict[int, int] = {}

    def request_missing(self, batch: int, prompt_ids: dict, alone=frozenset()) -> int:
        """Request every open cell of ``batch`` not already being generated; returns how many.

        One Generate call (n = 1) per sample index g over the slots missing g, each rollout
        renumbered to g; slots in ``alone`` get a request of their own. ``prompt_ids``: slot ->
        int32 [P]."""
        with self.cond:
            if self.outstanding.get(batch, 0):
                return 0
            b = self.asm.batches[batch]
            missing = b.missing()
            if not missing:
                return 0
            attempt = self.attempts.get(batch, 0)
            self.attempts[batch] = attempt + 1
            by_req: dict[tuple[int, int], list[int]] = {}  # (g, own slot or -1) -> slots
            for s, g in missing:
                by_req.setdefault((g, s if s in alone else -1), []).append(s)
            self.outstanding[batch] = len(by_req)
        for (g, _), slots in sorted(by_req.items()):
            params = self.params_fn(batch, attempt, g)
            args = (batch, g, slots, [prompt_ids[s] for s in slots], params)
            threading.Thread(
                target=self._run, args=args, daemon=True, name=f"rollouts-b{batch}-g{g}"
            ).start()
        return len(missing)

    def _run(self, batch, g, slots, prompts, params):
        try:
            for r in self.client_fn().generate(
                [np.asarray(p).tolist() for p in prompts], params, slot_ids=slots
            ):
                r.sample_index = g
                with self.cond:
                    if not self.accept_fn(r):
                        self.rejected_unknown_version += 1
                        continue
                    self.asm.add(r, self.version_fn())
                    self.cond.notify_all()
        except BaseException as e:  # handed to the trainer thread
            with self.cond:
                if _invalid_argument(e):
                    self.refused.append((batch, list(slots), e))
                else:
                    self.failures.append(e)
                self.cond.notify_all()
        finally:
            with self.cond:
                self.outstanding[batch] -= 1
                self.cond.notify_all()

    def take_refused(self, batch: int) -> list[tuple[list[int], BaseException]]:
        """The refused requests of ``batch`` (slots, error), removed (hold cond)."""
        mine = [(slots, e) for b, slots, e in self.refused if b == batch]
        self.refused = [x for x in self.refused if x[0] != batch]
        return mine

    def idle(self, batch: int) -> bool:
        return self.outstanding.get(batch, 0) == 0


def _invalid_argument(e: BaseException) -> bool:
    """True for a gRPC INVALID_ARGUMENT answer, or the same check refusing the request in process
    (`RequestError`): the request, not the sampler, is at fault."""
    import grpc

    from dlc_jax.sampler.service.request_checks import RequestError

    if isinstance(e, RequestError):
        return True
    return isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT
