"""Smoke test of the sampler soak (`dlc_jax.bench.soak.sampler.run`) with a shrunken config: a
real JAX sampler process on loopback takes every bad input and push attack; the run must report
no crash, no bad weights served and no staging files left behind."""

from __future__ import annotations

import json

from dlc_jax.bench.soak import sampler as soak_sampler


def test_soak_sampler_small_reports_zeros(tmp_path):
    cfg = soak_sampler.SoakConfig(streams=6, distinct_params=3, idle_connections=8)
    r = soak_sampler.run(tmp_path, cfg)
    s = r["summary"]
    assert s["crashes"] == 0, r["notes"]
    assert s["bad_weights_served"] == 0, r["notes"]
    assert s["files_left_behind"] == 0, r["notes"]
    assert s["attacks_accepted"] == 0, r["notes"]
    assert s["push_attacks"] >= 20 and s["bad_inputs"] >= 90  # every catalogue ran
    m = r["metrics"]["jax"]
    assert m["push_ok"] and m["stream_errors"] == 0 and m["idle_data_connections"] == 8
    assert m["staging_left_by_sigkill"] >= 1 and m["staging_after_restart"] == 0
    assert json.loads((tmp_path / "sampler_soak.json").read_text())["summary"] == s
