"""`dlc-jax bench lora` at tiny size, one repeat: an adapter push and the full pushes of the same
model to a JAX sampler process; the rows' ratios come from the bytes the sampler counted and the
times stored next to them, and each row carries the load it ran at."""

import dataclasses

import pytest


def test_lora_bench_tiny_rows(tmp_path):
    from dlc_jax.bench import common, lora_bench

    cfg = dataclasses.replace(lora_bench.SIZES["tiny"], repeats=1)
    res = lora_bench.run(cfg)
    common.write_result(res, tmp_path)
    rows = {r["path"]: r for r in res["rows"]}
    assert list(rows) == [lora_bench.FULL_GRPC, lora_bench.FULL_SOCKET, lora_bench.ADAPTER]
    full, adapter = rows[lora_bench.FULL_GRPC], rows[lora_bench.ADAPTER]
    s = res["summary"]
    # rank 4 bf16 factors of every projection of the 2 layers (64 wide, 2 x 16 kv heads)
    per_layer = 4 * (64 + 64) + 2 * 4 * (64 + 32) + 4 * (64 + 64) + 3 * 4 * (64 + 128)
    assert s["adapter_bytes"] == 2 * 2 * per_layer
    assert adapter["bytes_vs_full"] == pytest.approx(s["adapter_bytes"] / s["full_bytes"])
    assert rows[lora_bench.FULL_SOCKET]["MB"] == full["MB"]
    t = res["times"]
    assert adapter["seconds_vs_full"] == pytest.approx(
        min(t[lora_bench.ADAPTER]) / min(t[lora_bench.FULL_GRPC])
    )
    for r in rows.values():
        assert r["reliable"] == (r["load_1m"] <= lora_bench.MAX_LOAD)
    assert (tmp_path / "lora.json").exists() and (tmp_path / "lora.md").exists()
