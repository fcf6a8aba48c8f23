"""theta_t of a training run at a checkpoint step: the ``params`` subtree of the trainer's orbax
state, restored without a target and matched by path onto the run's initial HF model (a missing,
extra or mis-shaped leaf is an error)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np


def _key_str(k) -> str:
    return next((str(getattr(k, a)) for a in ("key", "name", "idx") if hasattr(k, a)), str(k))


def flatten_params(tree) -> dict[str, Any]:
    """``{"model/layers/0/mlp/up_proj/kernel": array}`` (a trailing NNX ``value`` dropped)."""
    import jax

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = [_key_str(k) for k in path]
        if parts and parts[-1] == "value":
            parts = parts[:-1]
        out["/".join(parts)] = leaf
    return out


def restore_raw_state(ckpt_dir: str | Path, step: int) -> dict:
    """The ``state`` item of checkpoint ``step`` as raw nested dicts of arrays (no target tree)."""
    import orbax.checkpoint as ocp

    from dlc_jax.trainer.checkpoint import CheckpointError

    ckpt_dir = Path(ckpt_dir).absolute()
    mgr = ocp.CheckpointManager(ckpt_dir, item_names=("state", "meta"))
    try:
        if step not in mgr.all_steps():
            raise CheckpointError(
                f"no checkpoint for step {step} in {ckpt_dir} (have {sorted(mgr.all_steps())})"
            )
        try:
            out = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        except Exception as e:  # noqa: BLE001 - orbax raises many types
            raise CheckpointError(
                f"checkpoint {ckpt_dir}/{step}: state unreadable ({type(e).__name__}: {e})"
            ) from e
        return out["state"]
    finally:
        mgr.close()


def find_params(state, key: str = "params"):
    """The first subtree named ``key`` (breadth-first) in a nested dict."""
    queue = [state]
    while queue:
        d = queue.pop(0)
        if isinstance(d, dict):
            if key in d:
                return d[key]
            queue.extend(v for v in d.values() if isinstance(v, dict))
    raise KeyError(
        f"checkpoint state has no {key!r} subtree (top-level keys: "
        f"{sorted(state) if isinstance(state, dict) else type(state).__name__})"
    )


@functools.lru_cache(maxsize=2)
def _template(model_dir: str):
    from flax import nnx

    from dlc_jax.model import load_hf

    return nnx.split(load_hf(model_dir), nnx.Param, ...)  # type: ignore[misc]


def model_with_params(model_dir: str, raw_params):
    """A model with the structure of ``model_dir`` and the weights in ``raw_params`` (fp32)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params, rest = _template(str(model_dir))
    want, got = flatten_params(params), flatten_params(raw_params)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        raise KeyError(
            f"checkpoint params do not match the model: missing {missing[:5]}, unexpected "
            f"{extra[:5]}"
        )
    leaves = []
    for name, leaf in want.items():  # in the tree's leaf order
        arr = np.asarray(got[name])
        if arr.shape != tuple(leaf.shape):
            raise ValueError(
                f"checkpoint param {name}: shape {arr.shape}, model expects {tuple(leaf.shape)}"
            )
        leaves.append(jnp.asarray(arr, jnp.float32))
    new = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves)
    return nnx.merge(graphdef, new, rest)


def load_checkpoint_model(cfg, step: int):
    """theta_t at ``step`` of the run configured by ``cfg`` (``model.path`` set)."""
    if not cfg.model.path:
        raise ValueError(
            "model.path: the experiment runner resolves the initial model; it must be set here"
        )
    raw = find_params(restore_raw_state(cfg.checkpoint.dir, step))
    return model_with_params(cfg.model.path, raw)
