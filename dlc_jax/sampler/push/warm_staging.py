"""Warm staging buffers for memory-mode pushes: a superseded push's staging file stays mapped and
the next push of the same size is received into it (no page faults on a fresh mapping). `take()`
hands a buffer to a push; a failed push gives it back at once, a committed one once replaced."""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import pathlib
import shutil
import threading

from .staging_dirs import STAGING_PREFIX, make_staging_dir


@dataclasses.dataclass
class StagingBuffer:
    """One staging file (``dir/model.safetensors`` of ``size`` bytes), open and mapped."""

    dir: pathlib.Path
    path: pathlib.Path
    fd: int
    mm: mmap.mmap
    size: int

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still held: unmapped when collected
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        shutil.rmtree(self.dir, ignore_errors=True)


def _rename(buf: StagingBuffer, version: int) -> None:
    """Name a reused directory after its new push (pid, version)."""
    tail = buf.dir.name.rsplit("_", 1)[-1]
    new = buf.dir.with_name(f"{STAGING_PREFIX}{os.getpid()}_v{version}_{tail}")
    try:
        os.rename(buf.dir, new)
    except OSError:  # keep the old name: only the name is wrong
        return
    buf.dir, buf.path = new, new / buf.path.name


def new_buffer(
    total: int, staging_root: str | None, reserve_bytes: int, version: int
) -> StagingBuffer:
    """A new mapped staging file of `total` bytes for the push of `version` (or PushError)."""
    d = make_staging_dir(staging_root, total, reserve_bytes, version)
    path = d / "model.safetensors"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, total)
        mm = mmap.mmap(fd, total)
    except BaseException:
        os.close(fd)
        shutil.rmtree(d, ignore_errors=True)
        raise
    return StagingBuffer(d, path, fd, mm, total)


class WarmStaging:
    """The staging buffers of one sampler server; at most `keep` wait free."""

    def __init__(self, keep: int = 1):
        self.keep = keep
        self._lock = threading.Lock()
        self._free: list[StagingBuffer] = []
        self._out: dict[pathlib.Path, StagingBuffer] = {}  # handed out, by directory
        self.reused = 0  # pushes received into a warm buffer (for tests and the bench)

    def take(
        self, total: int, staging_root: str | None, reserve_bytes: int, version: int
    ) -> StagingBuffer:
        """A mapped staging file of exactly `total` bytes (a free one, else new; or PushError)."""
        with self._lock:
            match = next((b for b in self._free if b.size == total), None)
            if match is not None:
                self._free.remove(match)
                _rename(match, version)
                self._out[match.dir] = match
                self.reused += 1
                return match
        self.release_free()  # other sizes: a different model or dtype
        buf = new_buffer(total, staging_root, reserve_bytes, version)
        with self._lock:
            self._out[buf.dir] = buf
        return buf

    def give_back(self, d: pathlib.Path) -> bool:
        """The push or served version staged in `d` is done with it (False: not a buffer here)."""
        with self._lock:
            buf = self._out.pop(d, None)
            if buf is None:
                return False
            if len(self._free) < self.keep:
                self._free.append(buf)
                return True
        buf.close()
        return True

    def release_free(self) -> None:
        """Unmap and delete the free buffers (not the ones handed out)."""
        with self._lock:
            stale, self._free = self._free, []
        for b in stale:
            b.close()

    def close(self) -> None:
        """Unmap and delete every buffer (server stop)."""
        with self._lock:
            bufs = self._free + list(self._out.values())
            self._free, self._out = [], {}
        for b in bufs:
            b.close()
