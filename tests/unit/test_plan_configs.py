"""The shipped Qwen3 configs name a TPU slice (plan.topology) and their recorded plan fits.

The plans themselves (full-size AOT compiles, minutes each on this CPU) are produced by
`dlc-jax bench plan` into docs/bench/plan/; this test reads those records, so a config change
without a fresh plan fails here.
"""

import json
from pathlib import Path

import pytest

from dlc_jax.bench.plan_cases import SHIPPED
from dlc_jax.plan.topology import parse_topology
from dlc_jax.trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case", SHIPPED, ids=lambda c: c.model)
def test_shipped_config_names_a_topology_whose_plan_fits(case):
    path = ROOT / case.argv()[1]
    cfg = load_config(path)
    topo = parse_topology(cfg.plan.topology, cfg.plan.slices)
    assert topo.accelerator_type == case.topology
    assert (cfg.train.batch_prompts * cfg.sampler.n, cfg.sampler.max_model_len) == (
        case.rows,
        case.seq_len,
    )
    record = ROOT / "docs" / "bench" / "plan" / f"{case.key}.json"
    assert record.exists(), f"no plan for {path.name}: run `dlc-jax bench plan --size targets`"
    r = json.loads(record.read_text())
    assert r["fits"] is True and r["topology"]["accelerator_type"] == case.topology
    assert r["config"]["rows"] == case.rows and r["config"]["seq_len"] == case.seq_len
    assert r["config"]["micro_batches"] == cfg.train.micro_batches
