"""The sampler soak's harness: config, outcome tally, the tiny model and the sampler process under
test (token, push data port, load root, short push limits), and push streams the attacks mutate."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import grpc
import numpy as np

from .trainer_harness import CountRows

TOKEN = "soak-token"


@dataclasses.dataclass
class SoakConfig:
    backends: tuple[str, ...] = ("jax",)
    streams: int = 200
    distinct_params: int = 100
    idle_connections: int = 300
    max_model_len: int = 128
    seed: int = 0


class Tally(CountRows):
    """Outcome counts per category; `rpc(cat, fn, codes)` runs one attack."""

    KEY = "category"
    ZERO = dict.fromkeys(("cases", "refused", "accepted", "wrong_code", "multi_line_errors"), 0)

    def record(self, cat: str, code: str, message: str, codes: tuple[str, ...]) -> None:
        r = self.row(cat)
        r["cases"] += 1
        if code == "OK":
            r["accepted"] += 1
            self.examples.append(f"{cat}: ACCEPTED ({message[:80]})")
            return
        r["refused"] += 1
        if codes and code not in codes:
            r["wrong_code"] += 1
            self.examples.append(f"{cat}: {code} (expected {codes}): {message[:120]}")
        if "\n" in message or len(message) > 400:
            r["multi_line_errors"] += 1
            self.examples.append(f"{cat}: multi-line error: {message[:120]!r}")

    def rpc(self, cat: str, fn, codes: tuple[str, ...] = ()) -> None:
        try:
            out = fn()
            if hasattr(out, "ok") and not out.ok:  # a PushResult carrying a rejection
                self.record(cat, out.code, out.message, codes)
            else:
                self.record(cat, "OK", str(out)[:80], codes)
        except grpc.RpcError as e:
            self.record(cat, e.code().name, e.details() or "", codes)


def make_model(root: Path) -> Path:
    from dlc_jax.model.config import shape_kwargs
    from dlc_jax.model.tiny import make_tiny

    d = root / "tiny"
    dims = shape_kwargs("bench_tiny", num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    make_tiny(str(d), **dims)
    return d


def start_sampler(
    backend: str, model: Path, staging: Path, load_root: Path, cfg: SoakConfig, log_file: Path
):
    from dlc_jax.sampler.service.process import SamplerProcess

    flags = {
        "--max-model-len": cfg.max_model_len,
        "--max-head-k": 8,
        "--max-n": 4,
        "--push-data-port": 0,
        "--staging-root": staging,
        "--load-root": load_root,
        "--push-idle-timeout": 1,
        "--push-max-seconds": 6,
        "--data-auth-timeout": 0.5,
        "--data-max-pending": 32,
    }
    args = [str(x) for flag_value in flags.items() for x in flag_value]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return SamplerProcess(
        backend,
        str(model),
        extra_args=args,
        token=TOKEN,
        log_file=str(log_file),
        env={k: v for k, v in env.items() if k not in os.environ},
        die_with_parent=False,
    ).start()


def proc_status(pid: int) -> dict[str, int]:
    """The process's thread count and resident memory (kB): {"Threads", "VmRSS"}."""
    lines = (ln.partition(":") for ln in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: int(v.split()[0]) for k, _, v in lines if k in ("Threads", "VmRSS")}


def perturbed(weights: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        k: (v + 0.3 * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
        for k, v in weights.items()
    }


def push_stream(weights: dict, version: int, *, mutate=None, commit=True, chunk=1 << 14):
    """A gRPC-plane push stream with sha256 trailers; `mutate(kind, msg)` may replace messages."""
    from dlc_jax.sampler.wire import sampler_pb2 as pb

    specs = [
        pb.TensorSpec(name=n, shape=list(a.shape), dtype="float32", nbytes=int(a.nbytes))
        for n, a in weights.items()
    ]
    header = pb.WeightHeader(version=version, tensors=specs, dtype="float32")
    msgs = [pb.WeightMessage(header=header)]
    for i, a in enumerate(weights.values()):
        b = np.ascontiguousarray(a, np.float32).tobytes()
        for off in range(0, len(b), chunk):
            c = pb.WeightChunk(tensor_index=i, offset=off, data=b[off : off + chunk])
            msgs.append(pb.WeightMessage(chunk=c))
        done = pb.TensorDone(tensor_index=i, sha256=hashlib.sha256(b).hexdigest())
        msgs.append(pb.WeightMessage(done=done))
    if commit:
        msgs.append(pb.WeightMessage(commit=pb.Commit()))
    for m in msgs:
        out = mutate(m.WhichOneof("kind"), m) if mutate else m
        if isinstance(out, list):
            yield from out
        elif out is not None:
            yield out
