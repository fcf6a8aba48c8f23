"""Model FLOPs of a Qwen3 forward/backward and known accelerator peaks, for MFU. As in the
PaLM/Megatron MFU papers: an [m,k] x [k,n] matmul costs 2mkn, a train step 3x forward; attention
counts the full T x T square; embedding lookups, norms, RoPE and softmax are not counted.
"""

from __future__ import annotations

# Dense peak FLOP/s per chip (vendor datasheets), by compute dtype.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12 / 2},
    "TPU v5 lite": {"bfloat16": 197e12, "float32": 197e12 / 2},  # v5e reports "TPU v5 lite"
    "TPU v5e": {"bfloat16": 197e12, "float32": 197e12 / 2},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12 / 2},
    "TPU v5": {"bfloat16": 459e12, "float32": 459e12 / 2},
    "NVIDIA H100": {"bfloat16": 989e12, "float32": 67e12},
    "NVIDIA H200": {"bfloat16": 989e12, "float32": 67e12},
}


def peak_flops(device_kind: str, dtype: str = "float32") -> float | None:
    """Peak FLOP/s of one chip of ``device_kind`` (None when unknown, e.g. any CPU)."""
    known = [k for k in PEAK_FLOPS if device_kind.startswith(k)]
    return PEAK_FLOPS[max(known, key=len)].get(dtype) if known else None


def qwen3_forward_flops(cfg, batch: int, length: int) -> float:
    """Forward FLOPs of ``batch`` x ``length`` tokens of a ``Qwen3Config``, vocab projection in."""
    from dlc_jax.plan.flops import model_matmul_params

    mm = model_matmul_params(cfg)
    dense = 2 * batch * length * (mm["decoder"] + mm["vocab"])
    attn = 4 * cfg.num_hidden_layers * batch * length**2 * cfg.num_attention_heads * cfg.head_dim
    return float(dense + attn)


def qwen3_train_flops(cfg, batch: int, length: int) -> float:
    """Forward + backward FLOPs (3x forward)."""
    return 3.0 * qwen3_forward_flops(cfg, batch, length)


def mfu(
    flops_per_s: float, device_kind: str, dtype: str = "float32", n_chips: int = 1
) -> float | None:
    peak = peak_flops(device_kind, dtype)
    return None if peak is None else flops_per_s / (peak * n_chips)
