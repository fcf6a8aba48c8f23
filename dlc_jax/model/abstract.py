"""Shape-only models for ahead-of-time compilation (e.g. for TPU topologies from a CPU host).

model = abstract_model(config, mesh=mesh, param_dtype=jnp.float32, compute_dtype=jnp.bfloat16)
graphdef, params = abstract_params(model, mesh)   # ShapeDtypeStructs carrying NamedShardings
jax.jit(lambda p, ids: nnx.merge(graphdef, p)(ids)).lower(params, ids_struct).compile()
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from .qwen3 import Qwen3ForCausalLM
from .registry import build_model
from .sharding import ActivationSharding, model_shardings


def abstract_model(
    config,
    *,
    mesh: Mesh | None,
    rules=None,
    param_dtype=jnp.float32,
    compute_dtype=jnp.float32,
    remat: bool | str | None = None,
) -> Qwen3ForCausalLM:
    """`nnx.eval_shape` of the config's family model, with activation constraints over `mesh`."""
    act = ActivationSharding(mesh, None if rules is None else tuple(rules))
    kw = dict(param_dtype=param_dtype, compute_dtype=compute_dtype, remat=remat, act_sharding=act)
    return nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0), **kw))


def abstract_params(model: Qwen3ForCausalLM, mesh: Mesh, rules=None):
    """(graphdef, params State of ShapeDtypeStruct with each parameter's NamedSharding)."""
    graphdef, params = nnx.split(model, nnx.Param)
    shardings = model_shardings(model, mesh, rules)

    def struct(v, s):
        x = v.get_value()
        return v.replace(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s.get_value()))

    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    return graphdef, jax.tree.map(struct, params, shardings, is_leaf=is_var)
