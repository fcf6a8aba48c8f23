"""Projected wire time of one resync (a full weight push of `params x sampler.dtype` bytes to S
samplers) for a stated NIC bandwidth, in `dlc-jax plan`: direct (S copies through one NIC), relay
chain (`SamplerPool(relay="chain")`: one copy, plus one largest tensor of store-and-forward delay
per extra hop) and sharded (model / H per trainer host NIC; the design's bound, issue 24, not yet
what the trainer does). Host-side load time is left out (docs/bench/weight_sync.md)."""

from __future__ import annotations

from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def sampler_count(address: str) -> int:
    """Samplers named by `sampler.address` (one spawned sampler when empty)."""
    return max(1, len([a for a in address.split(",") if a.strip()]))


def project_resync(
    params: int,
    dtype: str,
    samplers: int,
    hosts: int,
    nic_gbps: float,
    largest_tensor_params: int,
    step_s: float | None = None,
) -> dict:
    """Seconds per resync by way of sending (see the module doc), and per projected step."""
    if nic_gbps <= 0:
        raise ValueError(f"--nic-gbps must be > 0, got {nic_gbps}")
    nbytes = int(params) * DTYPE_BYTES[dtype]
    rate = nic_gbps * 1e9 / 8  # bytes per second through one NIC
    hop = int(largest_tensor_params) * DTYPE_BYTES[dtype] / rate
    out: dict[str, Any] = {
        "nic_gbps": nic_gbps,
        "dtype": dtype,
        "samplers": samplers,
        "trainer_hosts": hosts,
        "push_bytes": nbytes,
        "direct_s": samplers * nbytes / rate,
        "relay_chain_s": nbytes / rate + (samplers - 1) * hop,
        "sharded_s": nbytes / max(hosts, 1) / rate,
    }
    if step_s:
        out["relay_chain_per_step"] = out["relay_chain_s"] / step_s
    return out


def resync_line(p: dict) -> str:
    line = (
        f"  resync ({p['push_bytes'] / 1e9:.2f} GB push, {p['samplers']} sampler(s), "
        f"{p['nic_gbps']:g} Gb/s NIC): direct {p['direct_s']:.2f} s, relay chain "
        f"{p['relay_chain_s']:.2f} s, sharded over {p['trainer_hosts']} host(s) "
        f"{p['sharded_s']:.2f} s (wire time)"
    )
    if "relay_chain_per_step" in p:
        line += f"; relay chain = {100 * p['relay_chain_per_step']:.0f}% of a projected step"
    return line
