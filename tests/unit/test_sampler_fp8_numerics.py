"""The FP8 (e4m3) sampler numerics of the JAX backend and the |delta| measure of
experiments/numerics.py, on hand-known numbers."""

from __future__ import annotations

import numpy as np
import pytest

from dlc_jax.experiments.numerics import delta_stats, response_mask
from dlc_jax.experiments.prefixes import PrefixSet
from dlc_jax.sampler.backends.base import BackendConfig
from dlc_jax.sampler.backends.jax_backend import (
    JaxBackend,
    fp8_e4m3_roundtrip,
    has_knobs,
    transform_weights,
)

pytestmark = pytest.mark.unit


def test_fp8_e4m3_roundtrip_per_output_channel():
    w = np.array([[1.0, 0.5, 0.3, -0.1], [100.0, 3.0, -7.0, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    q = fp8_e4m3_roundtrip(w)
    # each row's max |w| maps to 448, e4m3's largest value: kept exactly
    assert q[0, 0] == 1.0 and q[1, 0] == 100.0 and not q[2].any()
    # 3 mantissa bits: relative rounding error at most 2^-4 for normal values
    nz = w != 0
    assert np.all(np.abs(q[nz] - w[nz]) <= np.abs(w[nz]) * 2.0**-4 + 1e-7)
    # 0.3 * 448 = 134.4 -> the e4m3 grid around 128 has step 16: 128 -> 128 / 448 = 0.2857
    assert q[0, 2] == pytest.approx(128 / 448, rel=1e-6)


def test_fp8_is_a_backend_knob_and_norms_stay():
    cfg = BackendConfig(model_dir="unused", quantization="fp8_e4m3")
    assert has_knobs(cfg) and not has_knobs(BackendConfig(model_dir="unused"))
    norm = np.array([1.03, 0.9871], np.float32)
    assert np.array_equal(transform_weights("model.norm.weight", norm, cfg), norm)
    w = np.array([[0.3, 1.0]], np.float32)
    assert transform_weights("w", w, cfg)[0, 0] == pytest.approx(128 / 448, rel=1e-6)
    with pytest.raises(ValueError, match="fp8_e4m3"):
        JaxBackend(BackendConfig("x", quantization="fp4"))


def test_delta_stats_and_the_eos_cut():
    ps = PrefixSet(
        tokens=np.array([[5, 6, 7, 9, 8], [5, 7, 8, 8, 8]], np.int32),
        prompt_lens=np.array([1, 1], np.int32),
        response_lens=np.array([4, 4], np.int32),
    )
    # EOS = 9: the first response ends at its third token; the second has none
    m = response_mask(ps, 9)
    np.testing.assert_array_equal(m, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    lp = np.zeros((2, 5))
    lq = np.array([[0.1, -0.2, 0.0, 5.0, 5.0], [0.3, 0.0, 0.0, 0.0, 9.0]])
    got = delta_stats(lp, lq, m)
    assert got["tokens"] == 7 and got["delta_abs_mean"] == pytest.approx(0.6 / 7, abs=1e-6)
    assert got["delta_abs_p99"] == pytest.approx(np.percentile([0.1, 0.2, 0, 0.3, 0, 0, 0], 99))
    assert delta_stats(lp, lq, np.zeros((2, 5)))["delta_abs_mean"] is None


def test_measure_numerics_orders_the_knobs_on_a_tiny_model(tmp_path):
    from dlc_jax.experiments.numerics import measure_numerics, write_numerics
    from dlc_jax.model import make_tiny

    d = str(make_tiny(tmp_path / "tiny", seed=0))
    rng = np.random.default_rng(0)
    ps = PrefixSet(
        tokens=rng.integers(3, 200, (4, 12)).astype(np.int32),
        prompt_lens=np.full(4, 3, np.int32),
        response_lens=np.full(4, 9, np.int32),
    )
    got = measure_numerics(d, ps, ["jax_int8", "jax_fp8_e4m3", "noise_0.2"], log=lambda _: None)
    assert [v["tokens"] for v in got.values()] == [36, 36, 36]
    means = [got[k]["delta_abs_mean"] for k in ("jax_int8", "jax_fp8_e4m3", "noise_0.2")]
    assert 0 < means[0] < means[1] < means[2], got
    assert all(v["delta_abs_p99"] >= v["delta_abs_mean"] for v in got.values())
    md = write_numerics(tmp_path / "out", got).read_text()
    assert md.splitlines()[3].startswith("| jax_fp8_e4m3 | ")
