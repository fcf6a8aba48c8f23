"""`dlc-jax bench weight_sync` engine and relay rows at the tiny size: a push + load into a JAX
engine sampler (memory and file staging) and a relay chain of 2 transport-only samplers, each in
its own process. Checks the load-independent parts: rows present, exact egress byte counts (a
relay chain sends one model from the trainer), and the targets listed."""

from __future__ import annotations

import dataclasses


def test_engine_and_relay_rows_tiny():
    from dlc_jax.bench import weight_sync_bench

    cfg = dataclasses.replace(
        weight_sync_bench.SIZES["tiny"], engines=("jax",), relay_samplers=2, repeats=1
    )
    res = weight_sync_bench.run(cfg)
    rows = {r["path"]: r for r in res["rows"]}
    total_mb = res["config"]["push_bytes"] / 1e6
    for k in (
        "push + load into JAX engine (memory staging)",
        "push + load into JAX engine (file staging)",
        "push to 1 sampler (memory staging)",
    ):
        assert rows[k]["seconds"] > 0 and rows[k]["cpu_s"] is not None
        assert rows[k]["egress_MB"] == total_mb
    assert rows["relay chain to 2 samplers"]["egress_MB"] == total_mb  # not 2x
    names = [t["name"] for t in res["targets"]]
    assert any("trainer egress" in n for n in names)
    egress = next(t for t in res["targets"] if "trainer egress" in t["name"])
    assert egress["value"] == 1.0 and egress["met"]
