"""Resync policies: when the trainer pushes theta_t to the sampler (theta_s <- theta_t).

* ``ess``: DLC -- after a step whose lag ESS (``statistic``: token or sequence) < threshold; with
  ``max_interval`` k > 0 also after k steps without a sync (bounded staleness).
* ``every_k``: every k optimizer steps. ``never``: a stale sampler (for experiments).
* ``onpolicy``: every step, and no prefetch: theta_s == theta_t at every step (lag exactly 0).
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


_POLICIES = {"ess": EssPolicy, "every_k": EveryKPolicy, "never": NeverPolicy, "onpolicy": OnPolicy}


def make_policy(resync_cfg) -> ResyncPolicy:
    """Policy object from the ``resync`` config section (the keys its class declares)."""
    cls = _POLICIES.get(resync_cfg.policy)
    if cls is None:
        raise ValueError(f"resync.policy: unknown policy {resync_cfg.policy!r}")
    own = {f.name for f in dataclasses.fields(cls)} - {"name", "allows_prefetch"}
    return cls(**{k: getattr(resync_cfg, k) for k in own})
