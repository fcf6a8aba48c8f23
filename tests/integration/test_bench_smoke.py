"""Tiny-size runs of each benchmark: the JSON has its fields and every ratio is computed from the
measured times / analysed bytes stored next to it (not a constant)."""

import json

import pytest

from dlc_jax.bench import dlc_bench, logprobs_bench, trainer_bench


def test_trainer_bench_tiny(tmp_path):
    from dlc_jax.bench import common

    res = trainer_bench.run(trainer_bench.SIZES["tiny"])
    common.write_result(res, tmp_path)
    data = json.loads((tmp_path / "trainer.json").read_text())
    rows = {r["implementation"]: r for r in data["rows"]}
    assert set(rows) == {"ours (chunked logprobs)", "ours (full logits)", "transformers"}
    med = {k: min(v) for k, v in data["times_s"].items()}
    for k, r in rows.items():
        assert r["ratio_vs_transformers"] == pytest.approx(med["transformers"] / med[k])
        assert r["tokens_per_s"] == pytest.approx(2 * 32 / med[k])
        assert r["mfu"] is None  # CPU: no known peak
    # same weights: our loss equals transformers' on the same batch
    assert data["summary"]["loss_abs_diff_ours_vs_transformers"] < 1e-4
    assert data["targets"][0]["value"] == pytest.approx(
        rows["ours (chunked logprobs)"]["ratio_vs_transformers"]
    )
    assert any("tunix" in n for n in data["notes"])


def test_dlc_bench_tiny():
    res = dlc_bench.run(dlc_bench.SIZES["tiny"])
    med = {k: min(v) for k, v in res["times_s"].items()}
    grpo, dlc = res["rows"]
    assert dlc["ratio_vs_grpo"] == pytest.approx(med["dlc"] / med["grpo"])
    assert dlc["snapshot_forward_ms"] == pytest.approx(1e3 * med["snapshot"])
    assert res["summary"]["ratio_dlc_vs_grpo_isolated"] == pytest.approx(dlc["ratio_vs_grpo"])
    assert res["dlc_metrics_sample"]["loss/dlc_centering_active"] == 1.0
    assert res["targets"][0]["target"] == 1.35
    fl = res["xla_flops"]
    assert fl["snapshot"] < fl["grpo"]  # a forward without gradient costs less than a train step
    assert res["summary"]["flops_ratio_dlc_vs_grpo"] == pytest.approx(
        (fl["dlc_train"] + fl["snapshot"]) / fl["grpo"]
    )


def test_logprobs_bench_tiny():
    cfg = logprobs_bench.SIZES["tiny"]
    res = logprobs_bench.run(cfg)
    assert [r["tokens"] for r in res["rows"]] == [b * t for b, t in cfg.points]
    for row, an in zip(res["rows"], res["analyses"]):
        assert row["fwd_ratio"] == pytest.approx(an["ours_fwd"]["temp"] / an["naive_fwd"]["temp"])
        assert row["fwd_bwd_ratio"] == pytest.approx(
            an["ours_fwd_bwd"]["temp"] / an["naive_fwd_bwd"]["temp"]
        )
    # the naive path's scratch holds [B,T,V] f32 logits: at least 4*V bytes per token
    assert res["linear_fits"]["naive_fwd"]["bytes_per_token"] >= 4 * cfg.vocab_size
    # ours does not: its growth per token is far below one logits row
    assert res["linear_fits"]["ours_fwd_bwd"]["bytes_per_token"] < 4 * cfg.vocab_size / 8
    assert res["linear_fits"]["ours_fwd_bwd_total"]["r2"] > 0.98
    for row, an in zip(res["rows"], res["analyses"]):
        tot = lambda a: a["argument"] + a["output"] + a["temp"]
        assert row["total_ratio"] == pytest.approx(
            tot(an["ours_fwd_bwd"]) / tot(an["naive_fwd_bwd"])
        )
    assert res["check"]["max_abs_diff_lp"] < 1e-4


def test_linear_fit_by_hand():
    a, b, r2 = logprobs_bench.linear_fit([1, 2, 3], [5, 7, 9])
    assert (a, b, r2) == pytest.approx((3.0, 2.0, 1.0))
    assert logprobs_bench.linear_fit([1, 2, 3], [1, 4, 9])[2] < 1.0


def test_raw_socket_copy_delivers_every_byte(tmp_path):
    import numpy as np

    from dlc_jax.bench.weight_sync_bench import raw_socket_copy

    arrays = [np.arange(1000, dtype=np.float32), np.ones((3, 7), np.uint16)]
    dt = raw_socket_copy(arrays, tmp_path / "copy.bin", chunk=256)
    assert dt > 0
    assert (tmp_path / "copy.bin").read_bytes() == b"".join(a.tobytes() for a in arrays)


def test_weight_sync_bench_tiny():
    from dlc_jax.bench import weight_sync_bench

    res = weight_sync_bench.run(weight_sync_bench.SIZES["tiny"])
    med = {k: min(v) for k, v in res["times_s"].items()}
    rows = {r["path"]: r for r in res["rows"]}
    assert set(rows) == {
        "export + push (gRPC)",
        "push only (gRPC)",
        "export + push (socket data plane)",
        "push only (gRPC, socket data plane)",
        "raw socket",
    }
    mb = res["config"]["push_bytes"] / 1e6
    for k, r in rows.items():
        assert r["MB_per_s"] == pytest.approx(mb / med[k])
        assert r["ratio_vs_raw_socket"] == pytest.approx(med["raw socket"] / med[k])
    ep, po = res["summary"]["export_push_best"], res["summary"]["push_only_best"]
    assert ep.startswith("export + push") and po.startswith("push only")
    assert res["summary"]["export_push_vs_raw"] == pytest.approx(rows[ep]["ratio_vs_raw_socket"])
    assert res["summary"]["push_only_vs_raw"] == pytest.approx(rows[po]["ratio_vs_raw_socket"])
    assert res["summary"]["export_push_grpc_vs_raw"] == pytest.approx(
        rows["export + push (gRPC)"]["ratio_vs_raw_socket"]
    )
    assert any(po in t["name"] for t in res["targets"])
    assert (
        res["config"]["push_tensors"] == 24
    )  # 2 layers x 11 + embed + final norm (tied: no lm_head)


def test_all_bench_combines_results(tmp_path):
    """`all` over logprobs (run) and a reused earlier result: one RESULTS.md with every target."""
    from dlc_jax.bench import all_bench, common

    prev = common.finish(common.new_result("dlc", "DLC (earlier run)", ["variant"]))
    prev["targets"].append(common.target("DLC / GRPO step time (isolation)", 1.2, 1.35, "<="))
    common.write_result(prev, tmp_path)
    res = all_bench.run(
        all_bench.AllBenchConfig(
            size="tiny", out=str(tmp_path), only=("logprobs", "dlc"), reuse=True
        )
    )
    text = (tmp_path / "RESULTS.md").read_text()
    assert (tmp_path / "logprobs.json").exists()
    assert "DLC (earlier run)" in text and "Log-prob memory" in text
    names = [(r["benchmark"], r["target"]) for r in res["rows"]]
    assert ("dlc", "DLC / GRPO step time (isolation)") in names
    assert sum(1 for b, _ in names if b == "logprobs") == 4
    assert res["results"]["logprobs"]["ok"] and res["results"]["dlc"]["ok"]
    # only the earlier result is reused: logprobs ran (its JSON written during this run)
    assert res["results"]["dlc"]["reused"] and not res["results"]["logprobs"]["reused"]
    assert "; reused: dlc\n" in text


def test_all_bench_records_a_failing_benchmark(tmp_path, monkeypatch):
    from dlc_jax.bench import all_bench, cli

    monkeypatch.setitem(cli.BENCHMARKS, "broken", "dlc_jax.bench.no_such_module")
    res = all_bench.run(all_bench.AllBenchConfig(out=str(tmp_path), only=("broken",)))
    assert res["results"]["broken"]["ok"] is False
    assert "no_such_module" in res["results"]["broken"]["error"]
    assert "FAILED" in (tmp_path / "RESULTS.md").read_text()
