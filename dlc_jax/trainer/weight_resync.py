"""A resync: theta_t pushed to the sampler as a new weight version and snapshotted as theta_s; the
snapshots no batch in flight needs are pruned, and with ``resync.stale_rollouts: drop`` older
rollouts in flight are dropped. Also the two resyncs outside the policy: before a step beyond the
staleness bound, and after reconnecting to a failed sampler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlc_jax.trainer import distributed as dist


class Resyncer:
    """Resyncs of one run: ``serve``: module -> what the sampler gets; ``batches``: the
    `BatchCollector` (versions in flight, staleness bound, stale drops); ``cfg``: the ``resync``
    section."""

    def __init__(
        self,
        state: Any,
        link: Any,
        serve: Callable[[Any], Any],
        batches: Any,
        counters: dict,
        cfg: Any,
    ):
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
        """Resync before a step whose sampler version is beyond the staleness bound (every rollout
        it would produce is stale). Decided from (version, synced_version): the same on every
        process."""
        if self.state.version - self.state.synced_version > self.batches.max_staleness:
            self.resync(reason="staleness")

    def recover(self, err: BaseException) -> None:
        """Reconnect, then push theta_t as a new version and snapshot it (a resync)."""
        self.link.reconnect(err)
        self.resync(reason="reconnect")
