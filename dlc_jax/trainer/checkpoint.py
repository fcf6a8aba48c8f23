"""Orbax checkpoints of a training run: array state + JSON metadata per step, keep last N.

Each step directory holds two items written atomically by orbax (temp dir + rename):
* ``state``: a pytree of arrays (params theta_t, optimizer state, theta_s snapshots keyed by
version,
  RNG key data), restored onto the shardings of a caller-supplied abstract tree;
* ``meta``: JSON (step, weight version, snapshot versions, data iterator state, config, counters).

A checkpoint whose files are missing or unreadable is refused with :class:`CheckpointError`;
nothing is silently reinitialized.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import jax
import orbax.checkpoint as ocp
from etils import epath

if TYPE_CHECKING:
    from dlc_jax.trainer.state import TrainState


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored (corrupt, incomplete, or of another shape)."""


def _checkpoint_path(directory: str | Path) -> epath.Path:
    """``epath.Path`` of a checkpoint directory: URIs (``scheme://...``) untouched, local paths
    absolute."""
    s = str(directory)
    if "://" in s:
        return epath.Path(s)
    return epath.Path(Path(s).absolute())


class Checkpointer:
    """Periodic + on-exit checkpoints under ``directory``.

    directory: a local path or a cloud URI (``gs://bucket/run/ckpt``): held as an
    ``etils.epath.Path``
    (orbax's own path type); local paths are made absolute, URIs are kept as they are.
    every: save when ``step % every == 0`` (0 = only forced saves); keep: the last N are kept.
    """

    def __init__(self, directory: str | Path, *, keep: int = 2, every: int = 0):
        self.directory = _checkpoint_path(directory)
        self.every = int(every)
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=int(keep), create=True, enable_async_checkpointing=False
        )
        self._mgr = ocp.CheckpointManager(
            self.directory, options=opts, item_names=("state", "meta")
        )

    def should_save(self, step: int) -> bool:
        return self.every > 0 and step > 0 and step % self.every == 0

    def save(self, step: int, state, meta: dict, *, force: bool = False) -> bool:
        """Write ``state`` (pytree of jax/numpy arrays) and ``meta`` (JSON-able) at ``step``."""
        if not force and not self.should_save(step):
            return False
        if step in self._mgr.all_steps():
            return False
        self._mgr.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                meta=ocp.args.JsonSave(dict(meta, step=int(step))),
            ),
            force=True,
        )
        self._mgr.wait_until_finished()
        return True

    def all_steps(self) -> list[int]:
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def restore_meta(self, step: int | None = None) -> dict:
        """The JSON metadata of ``step`` (latest when None)."""
        step = self._resolve(step)
        try:
            out = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        except Exception as e:  # noqa: BLE001 - orbax raises many types; rewrap with the path
            raise CheckpointError(
                f"checkpoint {self.directory}/{step}: metadata unreadable ({type(e).__name__}: {e})"
            ) from e
        meta = out["meta"]
        if not isinstance(meta, dict) or meta.get("step") != step:
            raise CheckpointError(
                f"checkpoint {self.directory}/{step}: metadata is corrupt (got {meta!r:.200})"
            )
        return meta

    def restore_state(self, abstract_state, step: int | None = None):
        """Arrays of ``step`` restored with the shapes/dtypes/shardings of ``abstract_state``
        (a pytree of ``jax.ShapeDtypeStruct`` or arrays)."""
        step = self._resolve(step)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        try:
            out = self._mgr.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
            )
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(
                f"checkpoint {self.directory}/{step}: state unreadable or corrupt "
                f"({type(e).__name__}: {str(e)[:500]})"
            ) from e
        return out["state"]

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

    def close(self) -> None:
        self._mgr.close()


# ---- a training run's state
# -----------------------------------------------------------------------
def state_tree(state: TrainState, snapshots: dict | None = None) -> dict:
    """The arrays of a checkpoint: theta_t, optimizer state, theta_s snapshots keyed by
    str(version)."""
    snaps = state.snapshots if snapshots is None else snapshots
    return {
        "params": state.params,
        "opt_state": state.opt_state,
        "snapshots": {str(v): p for v, p in snaps.items()},
    }


def save_train_state(
    ckpt: Checkpointer, state: TrainState, extra_meta: dict, *, force: bool = False
) -> bool:
    """Save ``state`` at its step with meta (step, synced_version, snapshot_versions) +
    ``extra_meta``
    (data_state, counters, seed, config, ...). Collective in a multi-host run (orbax
    coordinates)."""
    meta = {
        "step": state.step,
        "synced_version": state.synced_version,
        "snapshot_versions": sorted(state.snapshots),
        **extra_meta,
    }
    return ckpt.save(state.step, state_tree(state), meta, force=force)


def restore_train_state(ckpt: Checkpointer, state: TrainState) -> dict:
    """Restore the latest checkpoint into ``state`` (params, optimizer state, snapshots, step,
    synced_version) onto the shardings ``state`` already has; returns its meta."""
    meta = ckpt.restore_meta()
    versions = [int(v) for v in meta["snapshot_versions"]]
    tree = ckpt.restore_state(state_tree(state, {v: state.params for v in versions}))
    state.params, state.opt_state = tree["params"], tree["opt_state"]
    state.snapshots = {int(v): p for v, p in tree["snapshots"].items()}
    state.step, state.synced_version = int(meta["step"]), int(meta["synced_version"])
    return meta
