"""Orbax checkpoints of a training run: per step the ``state`` arrays (theta_t, optimizer state,
theta_s snapshots) and JSON ``meta`` with per-array ``checksums``. Saves are read back and verified
before older steps rotate out; a bad step is moved to ``<dir>/corrupt/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from dlc_jax.errors import UserError, one_line
from dlc_jax.model.checksums import array_checksums

if TYPE_CHECKING:
    from dlc_jax.trainer.state import TrainState

logger = logging.getLogger(__name__)

CHECKSUM_FORMAT = 1


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be restored (corrupt, incomplete, non-finite, of another shape)."""


# ---- restores that fail in one line: orbax closes a restore's asyncio loop at the first failed
# read; the reads still running then print ``Event loop is closed`` from TensorStore threads
class _DropAfterClose(asyncio.SelectorEventLoop):
    """An event loop that ignores ``call_soon_threadsafe`` once closed instead of raising."""

    def call_soon_threadsafe(self, callback, *args, context=None):  # type: ignore[override]
        if self.is_closed():
            return None
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        except RuntimeError:
            if self.is_closed():  # closed between the check and the call
                return None
            raise

    def call_exception_handler(self, context: dict) -> None:
        if self.is_closed() and "never retrieved" in str(context.get("message", "")):
            logger.debug(
                "orbax read abandoned after a failed restore: %s", context.get("exception")
            )
            return
        super().call_exception_handler(context)


class _Policy(asyncio.DefaultEventLoopPolicy):  # type: ignore[misc,valid-type]
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _DropAfterClose()


_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: Any = None


@contextlib.contextmanager
def quiet_reads() -> Iterator[None]:
    """Event loops made in this block drop late callbacks (re-entrant, thread-safe)."""
    global _DEPTH, _SAVED
    with _LOCK:
        if _DEPTH == 0:
            _SAVED = asyncio.get_event_loop_policy()
            asyncio.set_event_loop_policy(_Policy())
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                asyncio.set_event_loop_policy(_SAVED)
                _SAVED = None


def _describe(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")


def verify_tree(tree, meta: dict) -> None:
    """ValueError unless ``tree`` is finite and matches ``meta``'s checksums (if any)."""
    sums, bad = array_checksums(tree)
    if bad:
        raise ValueError(f"non-finite values in {_describe(bad)}")
    want = meta.get("checksums")
    if want is None:
        return
    if set(want) != set(sums):
        raise ValueError(
            f"arrays differ from the saved list (missing {_describe(sorted(set(want) - set(sums)))}"
            f"; extra {_describe(sorted(set(sums) - set(want)))})"
        )
    if wrong := [k for k in sums if list(want[k]) != sums[k]]:
        raise ValueError(f"checksum mismatch in {len(wrong)} array(s): {_describe(wrong)}")


class Checkpointer:
    """Checkpoints under ``directory`` (a local path or a URI such as ``gs://bucket/ckpt``). every:
    the save period (0 = forced saves only); keep: last N steps kept; verify_on_save: read every
    save back (room for a second copy of the state in device memory)."""

    def __init__(
        self, directory: str | Path, *, keep: int = 2, every: int = 0, verify_on_save: bool = True
    ):
        d = str(directory)  # URIs (``scheme://...``) untouched, local paths made absolute
        self.directory = epath.Path(d if "://" in d else Path(d).absolute())
        self.every = int(every)
        self.keep = int(keep)
        self.verify_on_save = verify_on_save
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=None,
            create=False,  # made by the first save: reading a missing directory creates nothing
            save_root_metadata=False,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=True,  # half-written saves of a killed run
        )
        self._mgr = ocp.CheckpointManager(
            self.directory, options=opts, item_names=("state", "meta")
        )

    def should_save(self, step: int) -> bool:
        return self.every > 0 and step > 0 and step % self.every == 0

    def save(self, step: int, state, meta: dict, *, force: bool = False) -> bool:
        """Write, read back and verify ``state`` + ``meta`` at ``step``, then rotate out steps
        beyond ``keep``; CheckpointError for a non-finite state or a save that does not verify."""
        if not (force or self.should_save(step)) or step in self._mgr.all_steps():
            return False
        sums, bad = array_checksums(state)
        if bad:
            raise CheckpointError(
                f"not saving step {step} to {self.directory}: non-finite values in {_describe(bad)}"
            )
        meta = dict(meta, step=int(step), checksums=sums, checksum_format=CHECKSUM_FORMAT)
        self.directory.mkdir(parents=True, exist_ok=True)
        items = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self._mgr.save(step, args=items, force=True)
        self._mgr.wait_until_finished()
        if self.verify_on_save:
            try:
                self.restore_state(state, step, meta=meta)
            except CheckpointError as e:
                where = self.quarantine(step)
                raise CheckpointError(
                    f"checkpoint step {step} did not verify after saving ({e}); moved to {where}, "
                    f"older checkpoints kept"
                ) from e
        self.clear(keep=self.keep)
        return True

    def quarantine(self, step: int) -> str:
        """Move step ``step`` to ``<dir>/corrupt/<step>-<time>`` (by process 0); where it went."""
        src = self.directory / str(step)
        dst = self.directory / "corrupt" / f"{step}-{int(time.time())}"
        if jax.process_index() == 0:
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                src.rename(dst)
            except OSError:  # a filesystem without rename (some object stores): copy + delete
                shutil.copytree(str(src), str(dst))
                shutil.rmtree(str(src), ignore_errors=True)
        self._mgr.reload()
        return str(dst)

    def all_steps(self) -> list[int]:
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def restore_meta(self, step: int | None = None) -> dict:
        """The JSON metadata of ``step`` (latest when None)."""
        step = self._resolve(step)
        meta = self.restore_items(step, "metadata unreadable", 200, meta=ocp.args.JsonRestore())
        meta = meta["meta"]
        if not isinstance(meta, dict) or meta.get("step") != step:
            raise CheckpointError(
                f"checkpoint {self.directory}/{step}: metadata is corrupt "
                f"(got {one_line(repr(meta), 200)})"
            )
        return meta

    def restore_state(self, abstract_state, step: int | None = None, *, meta: dict | None = None):
        """Arrays of ``step`` onto ``abstract_state``'s layout, verified against ``meta``."""
        step = self._resolve(step)
        meta = self.restore_meta(step) if meta is None else meta
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        item = ocp.args.StandardRestore(abstract)
        out = self.restore_items(step, "state unreadable or corrupt", 300, state=item)
        try:
            verify_tree(out["state"], meta)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {self.directory}/{step}: corrupt: {e}") from e
        return out["state"]

    def restore_items(self, step: int, what: str, chars: int, **items) -> dict:
        """The orbax ``items`` of ``step``; a failure is a CheckpointError naming ``what``."""
        try:
            with quiet_reads():
                return self._mgr.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # noqa: BLE001 - orbax raises many types; rewrap with the path
            short = one_line(str(e).split(" See full TensorStore details")[0], chars)
            raise CheckpointError(
                f"checkpoint {self.directory}/{step}: {what} ({type(e).__name__}: {short})"
            ) from e

    def _resolve(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"no checkpoint in {self.directory}")
            step = steps[-1]
        if step not in steps:
            raise CheckpointError(
                f"no checkpoint for step {step} in {self.directory} (have {steps})"
            )
        return step

    def clear(self, keep: int = 0) -> list[int]:
        """Delete every step but the last ``keep``; returns the deleted steps."""
        steps = self.all_steps()
        steps = steps[: max(0, len(steps) - keep)]
        for s in steps:
            self._mgr.delete(s)
        return steps

    def close(self) -> None:
        self._mgr.close()


# ---- a training run's state ------------------------------------------------------------------
def state_tree(state: TrainState, snapshots: dict | None = None) -> dict:
    """The arrays of a checkpoint (snapshots keyed by str(version))."""
    snaps = state.snapshots if snapshots is None else snapshots
    return {
        "params": state.trainable_params(),  # LoRA: the adapters alone
        "opt_state": state.opt_state,
        "snapshots": {str(v): p for v, p in snaps.items()},
    }


def save_train_state(
    ckpt: Checkpointer, state: TrainState, extra_meta: dict, *, force: bool = False
) -> bool:
    """Save ``state`` at its step with its versions + ``extra_meta`` (collective multi-host)."""
    meta = {
        "step": state.step,
        "synced_version": state.synced_version,
        "snapshot_versions": sorted(state.snapshots),
        **extra_meta,
    }
    return ckpt.save(state.step, state_tree(state), meta, force=force)


def restore_train_state(
    ckpt: Checkpointer, state: TrainState, check_meta: Callable[[dict], Any] | None = None
) -> dict:
    """Restore the newest good checkpoint into ``state``; returns its meta. A bad step is reported,
    moved to ``corrupt/`` and the next older tried; ``check_meta(meta)`` runs before the arrays
    are read (its errors raised as they are). CheckpointError when no step is good."""
    refused: list[tuple[int, str]] = []
    for step in reversed(ckpt.all_steps()):
        try:
            meta = ckpt.restore_meta(step)
            if check_meta is not None:
                check_meta(meta)
            versions = [int(v) for v in meta["snapshot_versions"]]
            tree = ckpt.restore_state(
                state_tree(state, {v: state.trainable_params() for v in versions}), step, meta=meta
            )
        except (CheckpointError, KeyError, TypeError, ValueError) as e:
            msg = str(e) if isinstance(e, CheckpointError) else f"metadata lacks {e}"
            refused.append((step, msg))
            logger.warning("%s; trying an older checkpoint", one_line(msg, 400))
            continue
        state.params, state.opt_state = state.with_trainable(tree["params"]), tree["opt_state"]
        state.snapshots = {int(v): p for v, p in tree["snapshots"].items()}
        state.step, state.synced_version = int(meta["step"]), int(meta["synced_version"])
        if refused:  # out of the way of later saves of the same steps and of later resumes
            moved = [ckpt.quarantine(s) for s, _ in refused]
            logger.warning(
                "resuming from step %d, the newest good checkpoint: step(s) %s were corrupt "
                "(moved to %s)",
                step,
                [s for s, _ in refused],
                ", ".join(moved),
            )
        return meta
    raise CheckpointError(
        f"no good checkpoint in {ckpt.directory}: "
        + "; ".join(f"step {s}: {one_line(m, 160)}" for s, m in refused)
        + " -- start over with checkpoint.resume=false checkpoint.overwrite=true"
    )
