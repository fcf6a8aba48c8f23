"""`dlc-jax plan`'s resync projection: wire seconds of a full push for a NIC bandwidth."""

from __future__ import annotations

import pytest

from dlc_jax.plan.resync import project_resync, resync_line, sampler_count


def test_8b_bf16_push_over_100gbps():
    p = project_resync(8_000_000_000, "bfloat16", 4, 8, 100.0, 151936 * 4096, step_s=22.0)
    assert p["push_bytes"] == 16_000_000_000
    assert p["sharded_s"] == pytest.approx(1.28 / 8)  # 16 GB over 8 hosts' NICs at 12.5 GB/s
    assert p["direct_s"] == pytest.approx(4 * 1.28)  # one NIC carries 4 copies
    hop = 151936 * 4096 * 2 / 12.5e9
    assert p["relay_chain_s"] == pytest.approx(1.28 + 3 * hop)
    assert p["relay_chain_per_step"] == pytest.approx(p["relay_chain_s"] / 22.0)
    assert "relay chain" in resync_line(p) and "% of a projected step" in resync_line(p)


def test_sampler_count_and_bad_bandwidth():
    assert sampler_count("") == 1 and sampler_count("a:1, b:2,") == 2
    with pytest.raises(ValueError, match="nic-gbps"):
        project_resync(1, "float32", 1, 1, 0.0, 1)
