"""The JAX sampler backend's numerics knobs (bf16 compute, int8 / FP8 weights, weight noise) each
move its log-probs away from an fp32 reference by a measurable, ordered amount: five whole
backends compiled, so integration tier."""

import numpy as np

from dlc_jax.sampler.wire.types import SamplingParams


def test_jax_backend_numerics_knobs_create_a_controlled_discrepancy(tmp_path):
    """fp32 matches the fp32 reference; bf16 compute, int8 weights and weight noise each move the
    sampler's logprobs away from it by a measurable, ordered amount."""
    import asyncio

    from sampler_reference import load_hf_reference, processed_logprobs

    from dlc_jax.model import make_tiny
    from dlc_jax.sampler.backends import BackendConfig, make_backend

    d = str(tmp_path / "tiny")
    make_tiny(d)
    ref = load_hf_reference(d)
    p = SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=5)

    def run(**kw):
        b = make_backend("jax", BackendConfig(model_dir=d, max_model_len=64, **kw))

        async def go():
            await b.start()
            return [r async for r in b.generate("k", [(0, [3, 4, 5]), (1, [9, 8])], p)]

        rs = asyncio.run(go())
        diffs = [
            np.abs(processed_logprobs(ref, r.prompt_ids, r.response_ids)[0] - r.logprobs)
            for r in rs
        ]
        return rs, float(np.mean(np.concatenate(diffs)))

    _, d32 = run()  # (same-seed determinism of this backend: test_sampler_service, gRPC vs direct)
    _, d16 = run(dtype="bfloat16")
    _, d8 = run(quantization="int8")
    _, d_fp8 = run(quantization="fp8_e4m3")
    _, dn = run(weight_noise=0.2, weight_noise_seed=1)
    print(
        f"mean |lp - fp32 ref|: fp32 {d32:.1e}, bf16 {d16:.1e}, int8 {d8:.1e}, fp8 {d_fp8:.1e}, "
        f"noise0.2 {dn:.1e}"
    )
    assert d32 < 1e-5
    assert d16 > 1e-4 and d8 > 1e-4 and dn > 1e-3
    assert dn > d8  # 20% rms noise is a larger perturbation than int8 rounding (~0.2% rms)
    # e4m3's 3 mantissa bits (~2% rms) round coarser than int8's 255 levels per row
    assert d_fp8 > d8
