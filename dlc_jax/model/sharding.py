"""Device mesh and logical-axis sharding rules. Parameters carry logical axis names (`out_sharding`
metadata); a rule table maps each to mesh axes. A dimension not divisible by its mesh axes is
replicated instead (e.g. 2 KV heads on a tensor axis of 4)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
# with MeshConfig.expert > 1 the mesh gains an `expert` axis (between fsdp and tensor)
MESH_AXES_EXPERT = ("data", "fsdp", "expert", "tensor")

# logical axis -> mesh axis / tuple of mesh axes / None (replicated)
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp", "expert")),  # tokens are data-parallel over the expert axis too
    ("length", None),
    ("embed", "fsdp"),  # parameters: FSDP shards the model dimension
    ("act_embed", None),  # activations keep the model dimension whole
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("norm", None),
    ("cache_length", None),
    ("layers", None),
    ("exp", "expert"),  # mixture-of-experts: expert parallelism
    ("moe_mlp", "tensor"),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape; -1 on one axis = all remaining devices. `expert` > 1 adds an `expert` axis (MoE
    experts split over it, tokens data-parallel over it); `shape` gives (data, fsdp, tensor)."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    expert: int = 1

    def shape(self, n_devices: int) -> tuple[int, int, int]:
        if self.expert < 1:
            raise ValueError(f"MeshConfig: expert must be >= 1, got {self}")
        if n_devices % self.expert:
            raise ValueError(f"MeshConfig {self}: {n_devices} devices not divisible by expert")
        n_devices //= self.expert
        dims = [self.data, self.fsdp, self.tensor]
        if sum(d == -1 for d in dims) > 1:
            raise ValueError(f"MeshConfig: at most one axis may be -1, got {self}")
        known = math.prod(d for d in dims if d != -1)
        if any(d == 0 or d < -1 for d in dims):
            raise ValueError(f"MeshConfig: axis sizes must be positive or -1, got {self}")
        if -1 in dims:
            if n_devices % known:
                raise ValueError(f"MeshConfig {self}: {n_devices} devices not divisible by {known}")
            dims[dims.index(-1)] = n_devices // known
        if math.prod(dims) != n_devices:
            raise ValueError(f"MeshConfig {self} needs {math.prod(dims)} devices, have {n_devices}")
        return dims[0], dims[1], dims[2]


def make_mesh(cfg: MeshConfig | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp[, expert], tensor) mesh over ``devices`` (default: all global devices)."""
    cfg = cfg or MeshConfig()
    devices = list(jax.devices() if devices is None else devices)
    shape: tuple[int, ...] = cfg.shape(len(devices))
    axes: tuple[str, ...] = MESH_AXES
    if cfg.expert > 1:
        shape = (shape[0], shape[1], cfg.expert, shape[2])
        axes = MESH_AXES_EXPERT
    from jax.experimental import mesh_utils

    n_slices = len({getattr(d, "slice_index", 0) for d in devices})
    try:
        if n_slices > 1 and shape[0] % n_slices == 0:
            # multi-slice: the data axis spans slices (DCN), ICI inside a slice
            arr = mesh_utils.create_hybrid_device_mesh(
                (shape[0] // n_slices, *shape[1:]), (n_slices,) + (1,) * (len(shape) - 1), devices
            )
        else:
            # single slice (possibly many hosts): topology-aware ICI mesh
            arr = mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError, AssertionError):
        arr = np.asarray(devices).reshape(shape)
    return Mesh(arr, axes)


def _rules_dict(rules) -> dict:
    return dict(LOGICAL_RULES if rules is None else rules)


def spec_axes(entry) -> tuple[str, ...]:
    """The mesh axis names of a PartitionSpec entry (None, a name or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def logical_to_spec(
    logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules=None
) -> PartitionSpec:
    """PartitionSpec for an array of `shape` with `logical` axis names (indivisible: replicated)."""
    return spec_on(logical, shape, mesh.shape, rules)


def spec_on(
    logical: Sequence[str | None], shape: Sequence[int], mesh_shape: Mapping[str, int], rules=None
) -> PartitionSpec:
    """`logical_to_spec` on a mesh given by its {axis: size} (``Mesh.shape``)."""
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
    table = _rules_dict(rules)
    used: set[str] = set()
    out = []
    for name, size in zip(logical, shape):
        target = table.get(name) if name is not None else None
        axes = tuple(
            a for a in spec_axes(target) if a in mesh_shape and mesh_shape[a] > 1 and a not in used
        )
        # keep the longest prefix of the mesh axes whose product divides the dimension
        while axes and size % math.prod(mesh_shape[a] for a in axes):
            axes = axes[:-1]
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def logprob_axes(rows: int, seq_len: int, mesh_shape: Mapping[str, int], rules=None):
    """(rows, positions): the PartitionSpec entries `rl.vocab_parallel_token_logprobs` splits a
    [rows, seq_len] batch over on a mesh of {axis: size}: rows over the `batch` rule's axes that
    divide them, positions over the longest run of the other axes whose product divides seq_len."""
    row_axes = spec_on(("batch",), (rows,), mesh_shape, rules)[0]
    rest = tuple(a for a, n in mesh_shape.items() if n > 1 and a not in spec_axes(row_axes))
    while rest and seq_len % math.prod(mesh_shape[a] for a in rest):
        rest = rest[:-1]
    return row_axes, (None if not rest else rest[0] if len(rest) == 1 else rest)


def logprob_shards(
    rows: int, seq_len: int, mesh_shape: Mapping[str, int], rules=None
) -> tuple[int, int]:
    """(parts the rows are split into, parts each row's positions are split into)."""
    row, pos = (
        math.prod(mesh_shape[a] for a in spec_axes(e))
        for e in logprob_axes(rows, seq_len, mesh_shape, rules)
    )
    return row, pos


def logprob_vocab_axes(mesh: Mesh, rows, positions) -> tuple[str, ...]:
    """The axes of `logprob_axes`' entries `dlc_jax.rl.vocab_parallel` splits the vocabulary over:
    all, less `data` on a multi-slice mesh (DCN is too slow for per-chunk collectives)."""
    axes = spec_axes(rows) + spec_axes(positions)
    devices = np.asarray(mesh.devices).ravel()
    if len({getattr(d, "slice_index", 0) for d in devices}) > 1:
        axes = tuple(a for a in axes if a != "data")
    return axes


def batch_replication(rows: int, mesh: Mesh, rules=None) -> int:
    """How many times each row of a [rows, ...] batch is computed: the size of the `batch` rule's
    mesh axes over that of those dividing ``rows`` (1 = an even split; 16 rows on fsdp 32: 32)."""
    names = spec_axes(_rules_dict(rules).get("batch"))
    wanted = math.prod(mesh.shape[a] for a in names if a in mesh.shape)
    split = spec_on(("batch",), (rows,), mesh.shape, rules)[0]
    return wanted // math.prod(mesh.shape[a] for a in spec_axes(split))


def named_sharding(logical, shape, mesh: Mesh, rules=None) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(logical, shape, mesh, rules))


@dataclasses.dataclass(frozen=True)
class ActivationSharding:
    """Mesh + rules for activation constraints inside the model (hashable: a static attribute)."""

    mesh: Mesh | None = None
    rules: tuple | None = None

    def logprob_axes(self, rows: int, seq_len: int):
        """`logprob_axes` on this mesh; (None, None) without one."""
        if self.mesh is None or self.mesh.size == 1:
            return None, None
        return logprob_axes(rows, seq_len, self.mesh.shape, self.rules)

    def constrain(self, x, logical: Sequence[str | None]):
        """`with_sharding_constraint(x, ...)` by logical names; identity without a mesh."""
        if self.mesh is None or self.mesh.size == 1:
            return x
        return jax.lax.with_sharding_constraint(
            x, named_sharding(logical, x.shape, self.mesh, self.rules)
        )


def param_logical_axes(variable) -> tuple | None:
    """Logical axis names stored on an nnx Variable (None if it has none)."""
    md = variable.get_metadata()
    return md.get("out_sharding") or md.get("sharding_names")


def model_shardings(model, mesh: Mesh, rules=None):
    """nnx.State of NamedSharding for every parameter of `model` (from its logical axes)."""
    from flax import nnx

    state = nnx.state(model, nnx.Param)

    def one(v):
        axes = param_logical_axes(v) or (None,) * len(v.shape)
        return v.replace(named_sharding(axes, v.shape, mesh, rules))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model, mesh: Mesh, rules=None):
    """Place every parameter on its NamedSharding (in place) and enable activation constraints."""
    from flax import nnx

    placed = jax.tree.map(
        lambda v, s: v.replace(jax.device_put(v.get_value(), s.get_value())),
        nnx.state(model, nnx.Param),
        model_shardings(model, mesh, rules),
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    nnx.update(model, placed)
    act = ActivationSharding(mesh, None if rules is None else tuple(rules))
    for _, m in nnx.iter_modules(model):
        if hasattr(m, "act_sharding"):
            m.act_sharding = act
    return model
