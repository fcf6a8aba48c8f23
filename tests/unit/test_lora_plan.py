"""dlc-jax plan under LoRA: the abstract run carries the adapters, the optimizer state covers them
alone, and the theta_s snapshots are counted as adapter copies (no compile: shapes only)."""

import jax
import numpy as np

from dlc_jax.lora import LoraParam
from dlc_jax.model import MeshConfig, make_mesh
from dlc_jax.plan.abstract_state import abstract_run, param_count, per_chip_bytes
from dlc_jax.trainer.config import default_config_path, load_config


def _run(*extra):
    cfg = load_config(default_config_path(), ["model.preset=tiny", *extra])
    return abstract_run(cfg, make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1)))


def test_abstract_lora_run_counts_adapters_only():
    full, lora = _run(), _run("lora.rank=8")
    n_full = param_count(full.params)
    n_adapt = param_count(lora.trained_params)
    # tiny: 2 layers, D 128, F 256, 4 heads x 32, 2 kv heads x 32; rank 8 on 7 projections
    per_layer = 8 * ((128 + 128) + (128 + 64) * 2 + (128 + 128) + (128 + 256) * 2 + (256 + 128))
    assert n_adapt == 2 * per_layer
    assert param_count(lora.params) == n_full + n_adapt
    assert all(
        isinstance(v, LoraParam)
        for _, v in jax.tree_util.tree_flatten_with_path(
            lora.trained_params, is_leaf=lambda x: isinstance(x, LoraParam)
        )[0]
    )
    moments = lambda r: sum(  # noqa: E731
        int(np.prod(x.shape)) for x in jax.tree.leaves(r.opt_state) if len(x.shape) > 0
    )
    assert moments(full) == 2 * n_full and moments(lora) == 2 * n_adapt
    # B factors [r, out] keep out's sharding (tensor axis), so on an fsdp mesh they are replicated:
    # still a fraction of the full optimizer state per chip
    assert per_chip_bytes(lora.opt_state) < 0.5 * per_chip_bytes(full.opt_state)
    assert lora.trainable is LoraParam and full.trainable is None
