"""Which samplers of a pool are in rotation, and why (thread-safe, no I/O): out on a failed call
or push, back in only through a successful full push."""

from __future__ import annotations

import dataclasses
import threading

from ..wire.types import PushResult


class NoActiveSamplerError(RuntimeError):
    """Every sampler of the pool is out of rotation (the message lists why)."""


@dataclasses.dataclass
class SamplerStatus:
    """One pool member's rotation state, version and counters (a `report` row)."""

    index: int
    address: str
    active: bool = True
    version: int = -1
    pushes_ok: int = 0
    pushes_failed: int = 0
    generate_failures: int = 0
    last_error: str = ""


class Rotation:
    """The in-rotation state of samplers ``addresses`` (pool order) and its counters."""

    def __init__(self, addresses: list[str]):
        self.status = [SamplerStatus(i, a) for i, a in enumerate(addresses)]
        self.removed_total = 0
        self.readmitted_total = 0
        self.resubmitted_slots = 0
        self._lock = threading.Lock()

    def active_indices(self) -> list[int]:
        with self._lock:
            return [s.index for s in self.status if s.active]

    def require_active(self) -> list[int]:
        """The in-rotation indices; NoActiveSamplerError (saying why) when there are none."""
        active = self.active_indices()
        if not active:
            raise NoActiveSamplerError(self.why_none())
        return active

    def flags(self) -> list[bool]:
        with self._lock:
            return [s.active for s in self.status]

    def why_none(self) -> str:
        with self._lock:
            why = "; ".join(f"{s.address}: {s.last_error or 'out'}" for s in self.status)
        return "no sampler in rotation: " + why

    def take_out(self, i: int, reason: str) -> bool:
        """Sampler ``i`` leaves rotation (True if it was in it); ``reason`` becomes last_error."""
        with self._lock:
            st = self.status[i]
            st.last_error = reason
            if not st.active:
                return False
            st.active = False
            self.removed_total += 1
            return True

    def generate_failed(self, i: int, reason: str) -> None:
        with self._lock:
            self.status[i].generate_failures += 1
        self.take_out(i, reason)

    def resubmitted(self) -> None:
        with self._lock:
            self.resubmitted_slots += 1

    def set_version(self, i: int, version: int) -> None:
        with self._lock:
            self.status[i].version = int(version)

    def impose(self, active: list[bool], version: int | None, reason: str) -> None:
        """Take over flags decided elsewhere (multi-host: process 0 pushed; the others follow)."""
        if len(active) != len(self.status):
            raise ValueError(f"set_rotation: {len(active)} flags for {len(self.status)} samplers")
        with self._lock:
            for st, a in zip(self.status, active):
                if st.active and not a:
                    self.removed_total += 1
                    st.last_error = reason
                elif a and not st.active:
                    self.readmitted_total += 1
                st.active = bool(a)
                if a and version is not None:
                    st.version = int(version)

    def settle(self, results: dict[int, PushResult], version: int, seconds: float) -> PushResult:
        """Apply a push's per-sampler outcomes to the rotation; ok when any sampler took it."""
        removed, readmitted = [], []
        with self._lock:
            for i, r in results.items():
                st = self.status[i]
                if r.ok:
                    st.pushes_ok += 1
                    st.version = int(r.version)
                    if not st.active:
                        st.active = True
                        self.readmitted_total += 1
                        readmitted.append(st.address)
                else:
                    st.pushes_failed += 1
                    st.last_error = f"push of version {version} failed: {r.code} {r.message}"
                    if st.active:
                        st.active = False
                        self.removed_total += 1
                        removed.append(st.address)
            per = {self.status[i].address: r for i, r in results.items()}
        ok_n = sum(r.ok for r in results.values())
        msg = f"{ok_n}/{len(results)} samplers at version {version}"
        if removed:
            msg += f"; out of rotation: {removed}"
        return PushResult(
            ok=ok_n > 0,
            version=int(version) if ok_n else -1,
            message=msg,
            bytes=sum(r.bytes for r in results.values() if r.ok),
            seconds=seconds,
            code="OK" if ok_n else "UNAVAILABLE",
            per_sampler=per,
            removed=tuple(removed),
            readmitted=tuple(readmitted),
            transport=",".join(sorted({r.transport for r in results.values() if r.ok} - {""})),
        )

    def metrics(self) -> dict[str, float]:
        """The `pool/*` numbers: counts, totals, per-sampler flags and versions."""
        with self._lock:
            m = {
                "pool/active": float(sum(s.active for s in self.status)),
                "pool/out_of_rotation": float(sum(not s.active for s in self.status)),
                "pool/removed_total": float(self.removed_total),
                "pool/readmitted_total": float(self.readmitted_total),
                "pool/resubmitted_slots": float(self.resubmitted_slots),
            }
            for s in self.status:
                m[f"pool/sampler{s.index}/active"] = float(s.active)
                m[f"pool/sampler{s.index}/version"] = float(s.version)
            return m

    def report(self) -> list[dict]:
        """Per-sampler status dicts (address, active, version, counters, last_error)."""
        with self._lock:
            return [dataclasses.asdict(s) for s in self.status]
