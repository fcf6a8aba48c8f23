"""The run's state as shapes with shardings: model, theta_t, optimizer state, theta_s snapshots and
the worst-case batch, over a mesh of (abstract) devices; nothing is allocated. The model is built
as ``dlc_jax.trainer.loop`` builds it (dtypes, remat, run options from the ``model`` section)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dlc_jax.model.config import shape_kwargs

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# dims of the model `make_tiny` writes with its defaults (the trainer's model.path='' case)
TINY_DIMS = shape_kwargs("tiny", tie_word_embeddings=False)

# model config fields that say how the model runs, settable from the trainer's model section
RUN_OPTIONS = ("attention_impl", "scan_layers", "remat_policy")
# mixture-of-experts run options (a dense family has no such fields: dropped below)
MOE_RUN_OPTIONS = ("moe_impl", "moe_dispatch")


def model_config(model_section):
    """Model config for the ``model`` section: ``path``'s config.json when it exists, else the
    preset named by the path's last component or by ``preset`` (``tiny``: ``make_tiny``'s dims),
    with the section's run options applied."""
    from dlc_jax.model import PRESETS, Qwen3Config
    from dlc_jax.model.registry import config_from_hf

    path = str(model_section.path or "")
    by_lower = {k.lower(): v for k, v in PRESETS.items()}
    if path and (Path(path) / "config.json").exists():
        cfg = config_from_hf(json.loads((Path(path) / "config.json").read_text()))
    elif path and Path(path).name.lower() in by_lower:
        cfg = by_lower[Path(path).name.lower()]
    elif str(model_section.preset).lower() in by_lower:
        cfg = by_lower[str(model_section.preset).lower()]
    elif not path and model_section.preset == "tiny":
        cfg = Qwen3Config(**TINY_DIMS)
    else:
        raise ValueError(
            f"model.path: {path!r} has no config.json and names no preset "
            f"(known: {sorted(PRESETS)}); set model.preset to one of them"
        )
    fields = {f.name for f in dataclasses.fields(cfg)}
    if hasattr(model_section, "run_options"):  # the trainer's ModelSection (remat policy resolved)
        given = model_section.run_options()
    else:
        given = {k: getattr(model_section, k) for k in RUN_OPTIONS if hasattr(model_section, k)}
    given.update(
        {k: getattr(model_section, k) for k in MOE_RUN_OPTIONS if hasattr(model_section, k)}
    )
    opts = {k: v for k, v in given.items() if k in fields}
    return cfg.replace(**opts) if opts else cfg


def plan_mesh(mesh_section, devices: list, num_slices: int):
    """(the trainer's mesh over ``devices``, note); with several slices ``data`` spans them."""
    from dlc_jax.model import MeshConfig, make_mesh

    data, fsdp, tensor = mesh_section.data, mesh_section.fsdp, mesh_section.tensor
    note = ""
    if num_slices > 1 and data % num_slices:
        if -1 not in (fsdp, tensor) and data != -1:
            raise ValueError(
                f"mesh: data={data} must be a multiple of --slices={num_slices} (the data axis "
                f"spans slices) or give fsdp=-1"
            )
        data = data * num_slices if data != -1 else data
        note = f"data axis x{num_slices} across slices"
    mc = MeshConfig(data=data, fsdp=fsdp, tensor=tensor, expert=getattr(mesh_section, "expert", 1))
    try:
        mc.shape(len(devices))
    except ValueError as e:
        raise ValueError(f"mesh: {e}") from e
    return make_mesh(mc, devices), note


def data_axis_spans_slices(mesh) -> bool:
    """True when there are several TPU slices and each 'data' index holds devices of one only."""
    devs = np.asarray(mesh.devices)
    slice_of = np.vectorize(lambda d: getattr(d, "slice_index", 0))(devs)
    per_data = [set(slice_of[i].flat) for i in range(devs.shape[0])]
    return len(set().union(*per_data)) > 1 and all(len(s) == 1 for s in per_data)


@dataclasses.dataclass
class AbstractRun:
    """Shapes-with-shardings of everything the step and the theta_s forward take."""

    mesh: object
    qcfg: Any
    model: Any  # the abstract model of the config's family (remat policy, scanned layers)
    graphdef: object
    params: object
    opt_state: object
    batch: dict
    tx: object
    rows: int
    seq_len: int
    trainable: Any = None  # NNX filter of the trained parameters (LoRA: the adapters); None: all

    @property
    def trained_params(self):
        """The trained part of ``params`` (what the optimizer state and theta_s snapshots copy)."""
        from dlc_jax.trainer.state import split_trainable

        return split_trainable(self.params, self.trainable)[0]


def per_chip_bytes(tree) -> int:
    """Bytes one device holds of a pytree of sharded ShapeDtypeStructs (the largest shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return total


def batch_structs(rows: int, seq_len: int, head_k: int, mesh, packed: bool = False) -> dict:
    """The step batch (``dlc_jax.trainer.step.STEP_KEYS``), rows sharded over ('data', 'fsdp')."""
    sh = NamedSharding(mesh, P(("data", "fsdp")))
    k = max(int(head_k), 0)
    i32, f32 = jnp.int32, jnp.float32
    two = dict(input_ids=i32, targets=i32, positions=i32, attention_mask=i32, mask=f32, lp_q=f32)
    two.update(lp_s=f32, self_mask=jnp.bool_, segment_ids=i32)
    three = dict(head_ids=i32, lq_head=f32, lps_head=f32)
    out = {n: jax.ShapeDtypeStruct((rows, seq_len), dt, sharding=sh) for n, dt in two.items()}
    out.update(
        {n: jax.ShapeDtypeStruct((rows, seq_len, k), dt, sharding=sh) for n, dt in three.items()}
    )
    adv_shape = (rows, seq_len) if packed else (rows,)  # packed rows: one advantage per token
    out["adv"] = jax.ShapeDtypeStruct(adv_shape, jnp.float32, sharding=sh)
    return out


def abstract_run(cfg, mesh) -> AbstractRun:
    """Abstract model, theta_t, optimizer state and worst-case batch of ``cfg`` on ``mesh``."""
    from dlc_jax.lora import apply_lora, trainable_filter
    from dlc_jax.model.abstract import abstract_model, abstract_params
    from dlc_jax.trainer.state import make_optimizer, opt_state_shardings, split_trainable

    qcfg = model_config(cfg.model)
    model = abstract_model(
        qcfg,
        mesh=mesh,
        param_dtype=DTYPES[cfg.model.param_dtype],
        compute_dtype=DTYPES[cfg.model.compute_dtype],
        remat=qcfg.remat_policy,
    )
    lora = getattr(cfg, "lora", None)
    trainable = None
    if lora is not None and lora.enabled:  # adapters as the trainer adds them; only they train
        apply_lora(model, lora)
        trainable = trainable_filter(lora)
    graphdef, params = abstract_params(model, mesh)
    trained = split_trainable(params, trainable)[0]
    shardings = jax.tree.map(lambda x: x.sharding, trained)
    tx = make_optimizer(cfg.optim, cfg.train.steps)
    opt_sh = opt_state_shardings(tx, trained, shardings, mesh)
    opt_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(tx.init, trained),
        opt_sh,
    )
    rows = cfg.train.batch_prompts * cfg.sampler.n
    seq_len = cfg.sampler.max_model_len
    batch = batch_structs(rows, seq_len, cfg.sampler.head_k, mesh, cfg.train.pack)
    moe = getattr(cfg, "moe", None)
    if moe is not None and moe.router_replay == "sampler" and hasattr(qcfg, "num_experts"):
        # the sampler's routed experts, replayed by the step and the theta_s forward
        batch["routed_experts"] = jax.ShapeDtypeStruct(
            (rows, seq_len, qcfg.num_hidden_layers, qcfg.num_experts_per_tok),
            jnp.int32,
            sharding=batch["input_ids"].sharding,
        )
    return AbstractRun(
        mesh, qcfg, model, graphdef, params, opt_state, batch, tx, rows, seq_len, trainable
    )


def param_count(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
