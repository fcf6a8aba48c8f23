"""`TrainState` (theta_t, optimizer state, version, theta_s snapshots) and its optax AdamW."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax


def make_schedule(optim, total_steps: int):
    """LR schedule from the ``optim`` section: linear warmup then cosine/linear/constant decay."""
    warm = int(optim.warmup)
    decay_steps = max(1, int(total_steps) - warm)
    if optim.decay == "cosine":
        tail = optax.cosine_decay_schedule(optim.lr, decay_steps, alpha=optim.min_lr_ratio)
    elif optim.decay == "linear":
        tail = optax.linear_schedule(optim.lr, optim.lr * optim.min_lr_ratio, decay_steps)
    else:
        tail = optax.constant_schedule(optim.lr)
    if warm == 0:
        return tail
    return optax.join_schedules([optax.linear_schedule(0.0, optim.lr, warm), tail], [warm])


def make_optimizer(optim, total_steps: int) -> optax.GradientTransformation:
    """Global-norm clip (if ``grad_clip`` > 0) then AdamW with the schedule."""
    o = optim
    clip = [optax.clip_by_global_norm(o.grad_clip)] if o.grad_clip > 0 else []
    sched = make_schedule(o, total_steps)
    adamw = optax.adamw(sched, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
    return optax.chain(*clip, adamw)


def all_finite(tree) -> jax.Array:
    """True when every float leaf of ``tree`` is free of NaN/Inf (a traced scalar bool)."""
    oks = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
    ]
    return jnp.all(jnp.stack(oks)) if oks else jnp.asarray(True)


def apply_updates(tx, params, opt_state, grads, lr_scale=1.0):
    """One optimizer update scaled by ``lr_scale`` (VCPO; traced ok). Not applied (params and
    optimizer state unchanged, step count included) when a gradient, ``lr_scale``, the update or
    the new params hold NaN/Inf."""
    updates, new_opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree.map(lambda u: u * jnp.asarray(lr_scale, u.dtype), updates)
    new_params = optax.apply_updates(params, updates)
    ok = all_finite((grads, updates, new_params, lr_scale))
    keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
    return jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state)


def update_count(opt_state) -> int | None:
    """The optimizer's update counter (the first ``count`` in its state), or None."""
    found = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    return int(found[0][1]) if found else None


def place_on_mesh(tree, mesh):
    """Leaves not already spread over ``mesh``'s devices are replicated over it."""
    from jax.sharding import NamedSharding, PartitionSpec

    devs = set(mesh.devices.flat)
    repl = NamedSharding(mesh, PartitionSpec())

    def place(x):
        spread = isinstance(x, jax.Array) and x.sharding.device_set == devs
        return x if spread else jax.device_put(x, repl)

    return jax.tree.map(place, tree)


def copy_tree(tree):
    """A device copy of a pytree of arrays (same shardings), so later donation cannot alias it."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


def opt_state_shardings(tx, params, param_shardings, mesh):
    """Shardings of ``tx.init(params)``: parameter-shaped leaves (Adam's mu/nu) take their
    parameter's, the rest (step counts) is replicated (``jax.jit(tx.init)`` alone leaves the
    moments on one device)."""
    from jax.sharding import NamedSharding, PartitionSpec

    repl = NamedSharding(mesh, PartitionSpec())
    abstract = jax.eval_shape(tx.init, params)
    return optax.tree_map_params(
        tx, lambda _, s: s, abstract, param_shardings, transform_non_params=lambda _: repl
    )


@dataclasses.dataclass
class TrainState:
    """theta_t (``params``), the optimizer state, the step (= weight ``version``),
    ``synced_version`` (the sampler's) and theta_s ``snapshots`` {version: trainable params}.
    trainable: an NNX filter of the trained parameters (None: all); the rest is frozen and shared
    (under LoRA the snapshots hold the adapters only)."""

    graphdef: Any
    params: object
    opt_state: object
    step: int = 0
    snapshots: dict = dataclasses.field(default_factory=dict)
    max_snapshots: int = 4
    synced_version: int = 0
    trainable: Any = None

    @classmethod
    def create(cls, model, tx, *, max_snapshots: int = 4, mesh=None, trainable=None) -> TrainState:
        """Split ``model``; the optimizer over its ``trainable`` part (sharded like it)."""
        from flax import nnx

        graphdef, params = nnx.split(model, nnx.Param)
        full, params = params, split_trainable(params, trainable)[0]
        if mesh is None:
            opt_state = jax.jit(tx.init)(params)
        else:
            from jax.sharding import NamedSharding, PartitionSpec

            repl = NamedSharding(mesh, PartitionSpec())
            on_mesh = lambda x: x.sharding if getattr(x.sharding, "mesh", None) == mesh else repl
            out = opt_state_shardings(tx, params, jax.tree.map(on_mesh, params), mesh)
            opt_state = jax.jit(tx.init, out_shardings=out)(params)
            opt_state = place_on_mesh(opt_state, mesh)
        st = cls(graphdef, full, opt_state, max_snapshots=max_snapshots, trainable=trainable)
        st.snapshot()
        return st

    @property
    def version(self) -> int:
        return self.step

    def model(self, params=None):
        """The NNX module of ``params`` (default: the current ones)."""
        from flax import nnx

        return nnx.merge(self.graphdef, self.params if params is None else params)

    def model_at(self, version: int):
        """The NNX module for the theta_s snapshot of weight ``version``."""
        return self.model(self.snapshot_params(version))

    def snapshot(self) -> None:
        """Record theta_t as the sampler's weights for ``self.version`` (theta_s <- theta_t)."""
        self.snapshots[self.version] = copy_tree(self.trainable_params())
        self.synced_version = self.version
        self.prune()

    def prune(self, keep_versions: set[int] | None = None) -> None:
        """Drop the oldest snapshots beyond ``max_snapshots`` (not synced or kept ones)."""
        for v in sorted(self.snapshots):
            if len(self.snapshots) <= self.max_snapshots:
                break
            if v != self.synced_version and v not in (keep_versions or set()):
                del self.snapshots[v]

    def snapshot_params(self, version: int):
        if version not in self.snapshots:
            raise KeyError(
                f"no theta_s snapshot for weight version {version} (have {sorted(self.snapshots)});"
                " raise resync.max_snapshots or use resync.stale_rollouts=drop"
            )
        return self.with_trainable(self.snapshots[version])

    def trainable_params(self):
        """The trained part of theta_t (all of it without a ``trainable`` filter)."""
        return split_trainable(self.params, self.trainable)[0]

    def with_trainable(self, trained):
        """Full parameters: ``trained`` (a trainable part) joined with the frozen part."""
        return join_trainable(trained, split_trainable(self.params, self.trainable)[1])


def split_trainable(params, trainable):
    """(trainable part, frozen part) of an ``nnx.State``; (params, None) without a filter."""
    if trainable is None:
        return params, None
    from flax import nnx

    return tuple(nnx.split_state(params, trainable, ...))


def join_trainable(train, frozen):
    """Inverse of :func:`split_trainable` (no copies: the same arrays in one State)."""
    if frozen is None:
        return train
    from flax import nnx

    return nnx.merge_state(train, frozen)
