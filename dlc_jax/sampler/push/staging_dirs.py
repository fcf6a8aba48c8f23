"""Staging directories of weight pushes, `dlc_push_p<pid>_v<version>_*` with an `.owner` file
naming their pid namespace: where one goes, its creation, and removal of those of dead samplers."""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import tempfile

from .weight_checks import PushError

log = logging.getLogger(__name__)

STAGING_PREFIX = "dlc_push_p"
OWNER_FILE = ".owner"  # "<pid namespace> <pid>": who staged this directory
SHM_DIR = "/dev/shm"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def staging_roots(staging_root: str | None) -> list[pathlib.Path]:
    """Directories a server with this `staging_root` setting may stage into."""
    if staging_root not in (None, "", "auto"):
        return [pathlib.Path(staging_root)]
    return [pathlib.Path(SHM_DIR), pathlib.Path(tempfile.gettempdir())]


def _owner(d: pathlib.Path) -> int | None:
    head = d.name[len(STAGING_PREFIX) :].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def pid_namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]"; "" where unknown): pids are only
    comparable inside one namespace (containers sharing /dev/shm may each have a pid 7)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _same_namespace(d: pathlib.Path) -> bool:
    try:
        ns = (d / OWNER_FILE).read_text().split()[0]
    except (OSError, IndexError):
        return True  # no marker (older sampler, or being created): the name's pid decides
    return ns == pid_namespace()


def clean_stale_staging(roots: list[pathlib.Path], *, pid: int | None = None) -> list[str]:
    """Remove staging directories whose owner process is dead (or, with `pid`, those owned by that
    pid, which the caller knows is dead). -> the removed paths."""
    removed = []
    for root in roots:
        try:
            entries = list(root.iterdir())
        except OSError:
            continue
        for d in entries:
            if not d.name.startswith(STAGING_PREFIX) or not d.is_dir():
                continue
            owner = _owner(d)
            if owner is None or owner == os.getpid() or not _same_namespace(d):
                continue
            if (pid is not None and owner == pid) or (pid is None and not _pid_alive(owner)):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
    if removed:
        log.info("removed %d staging dir(s) of dead sampler(s): %s", len(removed), removed[:3])
    return removed


def resolve_staging_root(
    staging_root: str | None, nbytes: int, *, shm_dir: str = SHM_DIR, headroom: float = 2.0
) -> str | None:
    """Where a push of `nbytes` is staged: an explicit directory, else the RAM filesystem `shm_dir`
    when it has room for `headroom` x the push, else the system temp directory (None)."""
    if staging_root not in (None, "", "auto"):
        return staging_root
    try:
        free = shutil.disk_usage(shm_dir).free
    except OSError:
        return None
    return shm_dir if free >= headroom * nbytes else None


def make_staging_dir(
    staging_root: str | None, total: int, reserve_bytes: int, version: int
) -> pathlib.Path:
    """Create the directory a push of `total` bytes is staged in, if its filesystem keeps
    `reserve_bytes` free afterwards (else FAILED_PRECONDITION)."""
    root = resolve_staging_root(staging_root, total)
    if root is not None:
        pathlib.Path(root).mkdir(parents=True, exist_ok=True)
    where = root if root is not None else tempfile.gettempdir()
    try:
        free = shutil.disk_usage(where).free
    except OSError as e:
        raise PushError.precondition(f"staging directory {where}: {e}") from None
    if free - reserve_bytes < total:
        raise PushError.precondition(
            f"not enough space to stage the push: needs {total / 1e6:.1f} MB, {where} has "
            f"{free / 1e6:.1f} MB free with {reserve_bytes / 1e6:.1f} MB kept in reserve"
        )
    d = pathlib.Path(
        tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}_v{version}_", dir=root)
    )
    (d / OWNER_FILE).write_text(f"{pid_namespace()} {os.getpid()}\n")
    return d
