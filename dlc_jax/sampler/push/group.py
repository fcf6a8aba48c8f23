"""The sliced push group a sampler receives between its part streams (`PendingGroup`)."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from ..wire import sampler_pb2 as pb
from .sliced import SlicedStager
from .weight_checks import PushError

log = logging.getLogger(__name__)


class PendingGroup:
    """At most one pending group (a new one supersedes it, a full push drops it), and the ids of
    failed groups, whose later parts are refused."""

    def __init__(self) -> None:
        self.stager: SlicedStager | None = None
        self.failed: collections.deque[str] = collections.deque(maxlen=64)

    def drop(self, reason: str) -> None:
        if self.stager is not None:
            log.warning("push group %r discarded: %s", self.stager.group, reason)
            self.failed.append(self.stager.group)
            self.stager.discard()
            self.stager = None

    def stager_for(self, h: pb.WeightHeader, make: Callable[[], SlicedStager]) -> SlicedStager:
        """The group's stager for a part's header (a new group supersedes the pending one)."""
        if h.push_group in self.failed:
            raise PushError.precondition(
                f"push group {h.push_group!r} was discarded (a part failed or it was superseded)"
            )
        if self.stager is not None and self.stager.group != h.push_group:
            self.drop(f"superseded by push group {h.push_group!r}")
        if self.stager is None:
            self.stager = make()
        return self.stager

    def fail(self, group: str, reason: str) -> None:
        if self.stager is not None and self.stager.group == group:
            self.drop(reason)
        elif group:
            self.failed.append(group)

    def take(self, h: pb.WeightHeader, serving_version: int) -> SlicedStager:
        """The pending group a group-commit header names, now the caller's to apply or discard."""
        s = self.stager
        if s is None or s.group != h.push_group:
            raise PushError.precondition(
                f"group commit: push group {h.push_group!r} is not pending here"
            )
        self.stager = None
        if h.version != s.version or h.push_parts != s.parts:
            s.discard()
            raise PushError.invalid(
                f"group commit: version {h.version} / {h.push_parts} parts do not match the "
                f"group's {s.version} / {s.parts}"
            )
        if s.version is None or s.version <= serving_version:
            s.discard()
            raise PushError.precondition(
                f"stale version {s.version}: server already serves version {serving_version}"
            )
        return s
