"""Resync policies: when the trainer pushes theta_t to the sampler (theta_s <- theta_t).

* ``ess``: DLC — after a step whose lag ESS < threshold: the token ESS of exp(lp - lp_s) over valid
  tokens (``statistic: token``) or the sequence ESS of exp(sum of a response's lp - lp_s)
  (``statistic: sequence``); with ``max_interval`` k > 0 also after k steps without a sync (bounded
  staleness: an asynchronous run synced at least every k steps, and sooner when the ESS falls).
* ``every_k``: fixed staleness — every k optimizer steps.
* ``never``: a stale sampler (kept for experiments).
* ``onpolicy``: every step, and the next batch is sampled only after the push (no prefetch), so
  theta_s == theta_t at every step: the lag is exactly zero and no snapshot forward runs.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ResyncPolicy:
    """Base: subclasses decide from the step's metrics and the steps since the last sync."""

    name: str = "never"
    #: whether batches may be sampled ahead with older weights (False only for onpolicy)
    allows_prefetch: bool = True

    def should_resync(self, metrics: dict, steps_since_sync: int) -> bool:
        return False


ESS_METRICS = {"token": "ess_lag", "sequence": "ess_lag_seq"}


@dataclasses.dataclass
class EssPolicy(ResyncPolicy):
    name: str = "ess"
    threshold: float = 0.5
    statistic: str = "token"
    max_interval: int = 0  # 0: no cap

    def should_resync(self, metrics: dict, steps_since_sync: int) -> bool:
        if self.max_interval and steps_since_sync >= self.max_interval:
            return True
        key = ESS_METRICS[self.statistic]
        e = metrics.get(key)
        if e is None:
            raise KeyError(f"resync.policy=ess needs the step metric {key!r}")
        return float(e) < self.threshold


@dataclasses.dataclass
class EveryKPolicy(ResyncPolicy):
    name: str = "every_k"
    k: int = 4

    def should_resync(self, metrics: dict, steps_since_sync: int) -> bool:
        return steps_since_sync >= self.k


@dataclasses.dataclass
class NeverPolicy(ResyncPolicy):
    name: str = "never"


@dataclasses.dataclass
class OnPolicy(ResyncPolicy):
    name: str = "onpolicy"
    allows_prefetch: bool = False

    def should_resync(self, metrics: dict, steps_since_sync: int) -> bool:
        return True


def make_policy(resync_cfg) -> ResyncPolicy:
    """Policy object from the ``resync`` config section."""
    p = resync_cfg.policy
    if p == "ess":
        return EssPolicy(
            threshold=resync_cfg.threshold,
            statistic=resync_cfg.statistic,
            max_interval=resync_cfg.max_interval,
        )
    if p == "every_k":
        return EveryKPolicy(k=resync_cfg.k)
    if p == "never":
        return NeverPolicy()
    if p == "onpolicy":
        return OnPolicy()
    raise ValueError(f"resync.policy: unknown policy {p!r}")
