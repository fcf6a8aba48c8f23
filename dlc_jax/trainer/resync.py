"""Resync policies, when theta_t is pushed to the sampler: ``ess`` (lag ESS < threshold, or
``max_interval`` steps without a sync), ``every_k``, ``never``, ``onpolicy`` (every step, no
prefetch: lag exactly 0). `Resyncer` pushes, snapshots theta_s and prunes the snapshots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dlc_jax.trainer import distributed as dist


@dataclasses.dataclass
class ResyncPolicy:
    """The ``never`` policy; the others decide from the step's metrics and steps since a sync."""

    name: str = "never"
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
class OnPolicy(ResyncPolicy):
    name: str = "onpolicy"
    allows_prefetch: bool = False

    def should_resync(self, metrics: dict, steps_since_sync: int) -> bool:
        return True


_POLICIES = {"ess": EssPolicy, "every_k": EveryKPolicy, "never": ResyncPolicy, "onpolicy": OnPolicy}


def make_policy(resync_cfg) -> ResyncPolicy:
    """Policy object from the ``resync`` config section (the keys its class declares)."""
    cls = _POLICIES.get(resync_cfg.policy)
    if cls is None:
        raise ValueError(f"resync.policy: unknown policy {resync_cfg.policy!r}")
    own = {f.name for f in dataclasses.fields(cls)} - {"name", "allows_prefetch"}
    return cls(**{k: getattr(resync_cfg, k) for k in own})


class Resyncer:
    """Resyncs of one run; ``serve``: module -> what the sampler gets."""

    def __init__(self, state, link, serve: Callable[[Any], Any], batches, counters: dict, cfg):
        self.state, self.link, self.serve = state, link, serve
        self.batches, self.counters = batches, counters
        self.stale_rollouts = cfg.stale_rollouts

    def resync(self, reason: str) -> None:
        """Push theta_t as a new sampler version and snapshot it as theta_s."""
        st = self.state
        self.link.push_retrying(st.version, lambda: self.serve(st.model()), reason)
        st.snapshot()
        keep = self.batches.versions_in_flight()
        st.prune(
            set(dist.global_versions(keep & set(st.snapshots), set(st.snapshots) | {st.version}))
        )
        self.counters["resync_count"] += 1
        if reason in ("ess", "staleness"):
            self.counters["resync_ess" if reason == "ess" else "resync_forced"] += 1
        if self.stale_rollouts == "drop":
            self.counters["dropped_on_resync"] += self.batches.drop_versions_below(st.version)

    def if_too_stale(self) -> None:
        """Resync before a step whose every rollout would be stale (same on every process)."""
        if self.state.version - self.state.synced_version > self.batches.assembler.max_staleness:
            self.resync(reason="staleness")

    def recover(self, err: BaseException) -> None:
        """Reconnect, then resync."""
        self.link.reconnect(err)
        self.resync(reason="reconnect")
