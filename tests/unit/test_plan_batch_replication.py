"""Rows per micro-batch that the batch-sharded chips cannot split are computed on every chip: the
factor `batch_replication` reports (8 fake CPU devices), and the plan's warning naming the
micro-batch counts that split evenly. The 30B-A3B row (16 rows per micro-batch on fsdp 32) compiled
its expert kernels on 1,048,576 rows per chip instead of 32,768 (docs/bench/PLAN.md)."""

import types

import jax
import pytest

from dlc_jax.model import MeshConfig, make_mesh
from dlc_jax.model.sharding import batch_replication
from dlc_jax.plan.report import _batch_replication


@pytest.fixture(scope="module")
def fsdp8():
    return make_mesh(MeshConfig(data=1, fsdp=8, tensor=1), jax.devices()[:8])


def test_factor_is_chips_over_the_axes_the_rows_split_over(fsdp8):
    assert batch_replication(16, fsdp8) == 1  # 2 rows a chip
    assert batch_replication(8, fsdp8) == 1
    assert batch_replication(4, fsdp8) == 8  # 4 % 8: replicated, every chip all 4 rows
    assert batch_replication(12, fsdp8) == 8
    dp2 = make_mesh(MeshConfig(data=2, fsdp=4, tensor=1), jax.devices()[:8])
    assert batch_replication(8, dp2) == 1
    assert batch_replication(2, dp2) == 4  # split over data only: each fsdp group repeats it
    assert batch_replication(6, dp2) == 4


def test_plan_warns_and_names_even_micro_batch_counts(fsdp8):
    cfg = types.SimpleNamespace(train=types.SimpleNamespace(micro_batches=4))
    run = types.SimpleNamespace(rows=16)
    out = _batch_replication(cfg, run, fsdp8)
    assert out["rows_per_micro_batch"] == 4 and out["factor"] == 8
    assert "train.micro_batches=4 leaves 4 rows per micro-batch" in out["warning"]
    assert "computes 8x its share" in out["warning"] and "in [1, 2]" in out["warning"]
    cfg.train.micro_batches = 2
    assert _batch_replication(cfg, run, fsdp8) == {"rows_per_micro_batch": 8, "factor": 1}
