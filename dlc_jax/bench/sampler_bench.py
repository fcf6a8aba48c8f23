"""`dlc-jax bench sampler`: rollout tokens/s through our gRPC service vs the *same* vLLM engine
called directly, and weight-push MB/s over loopback gRPC (to a `TransportOnlyBackend`: staging and
verification, no engine load) vs a raw loopback socket copy of the same bytes into a file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import pathlib
import tempfile
import time

import numpy as np

from dlc_jax.sampler.backends.base import BackendConfig, SamplerBackend

from . import common


@dataclasses.dataclass(frozen=True)
class SamplerBenchConfig(common.BenchShape):
    """The rollout workload, and the pushed model's shape, dtype, chunk and repeats."""

    model_dir: str | None = None  # rollout model; None = make a tiny random Qwen3
    prompts: int = 16
    n: int = 4
    max_tokens: int = 64
    prompt_len: int = 16
    repeats: int = 3
    push_dtype: str = "bfloat16"
    chunk_mb: int = 16
    push_repeats: int = 2


SIZES = {
    "default": SamplerBenchConfig(**common.shape("qwen3_0p6b")),
    "small": SamplerBenchConfig(
        **common.shape("qwen3_0p6b", vocab_size=32768, num_hidden_layers=4),
        prompts=8,
        n=2,
        max_tokens=32,
        repeats=5,
    ),
}


ARGS = common.Options(
    "sampler",
    SIZES,
    ("--model", "model_dir", {"help": "rollout model dir (default: a tiny random Qwen3)"}),
    ("--push-layers", "num_hidden_layers", {"type": int}),
    ("--push-dtype", "push_dtype", {"choices": ["float32", "bfloat16"]}),
)
add_args, from_args = ARGS.add_args, ARGS.from_args


class TransportOnlyBackend(SamplerBackend):
    """No engine: accepts verified pushes and records the version (times transport + checks)."""

    name = "transport-only"

    def __init__(self, specs: dict[str, tuple[tuple[int, ...], str]], vocab_size: int):
        self.cfg = BackendConfig(model_dir="(none)")
        self.model_config = {"vocab_size": vocab_size}
        self.vocab_size = vocab_size
        self.version = 0
        self._expected = dict(specs)

    @classmethod
    def of_model(cls, model_config) -> TransportOnlyBackend:
        """For the tensors of a `Qwen3Config`'s model."""
        from dlc_jax.model import hf_param_shapes

        specs = {n: (s, "float32") for n, s in hf_param_shapes(model_config).items()}
        return cls(specs, model_config.vocab_size)

    async def start(self):
        pass

    def generate(self, request_id, prompts, params):
        raise NotImplementedError("TransportOnlyBackend has no engine")

    async def apply_weights(self, weights_dir, version):
        self.version = int(version)

    async def close(self):
        pass


def _push_client(mode: str, target: str, cfg_dict: dict, version: int) -> float:
    """Client process of the push bench (mode "grpc" | "raw") -> seconds of the transfer alone."""
    from dlc_jax.model import hf_param_shapes
    from dlc_jax.sampler.wire import safetensors_io as st

    cfg = SamplerBenchConfig(**cfg_dict)
    rng, np_dtype = np.random.default_rng(0), st.NP_DTYPES[cfg.push_dtype]
    tensors = {
        n: (0.02 * rng.standard_normal(s, dtype=np.float32)).astype(np_dtype)
        for n, s in hf_param_shapes(cfg.model_config()).items()
    }
    if mode == "grpc":
        from dlc_jax.sampler.client.client import SamplerClient

        with SamplerClient(target, timeout=3600) as c:
            c.wait_ready(60)
            kw = {"dtype": cfg.push_dtype, "chunk_bytes": cfg.chunk_mb << 20}
            t0 = time.perf_counter()
            common.accepted(c.push_weights(tensors, version, **kw))
            return time.perf_counter() - t0
    host, port = target.rsplit(":", 1)
    return common.raw_send((host, int(port)), tensors.values())


def _push_in_child(mode: str, target: str, cfg: SamplerBenchConfig, version: int) -> float:
    args = (mode, target, dataclasses.asdict(cfg), version)
    return float(common.call_in_child("dlc_jax.bench.sampler_bench", "_push_client", *args))


def _bench_push(cfg: SamplerBenchConfig, res: dict, tmp: pathlib.Path) -> None:
    from dlc_jax.model import hf_param_shapes
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread
    from dlc_jax.sampler.wire import safetensors_io as st

    shapes = hf_param_shapes(cfg.model_config())
    itemsize = st.NP_DTYPES[cfg.push_dtype].itemsize
    total = sum(int(np.prod(s)) * itemsize for s in shapes.values())
    backend = TransportOnlyBackend.of_model(cfg.model_config())
    srv = ServerThread(backend, ServerConfig(staging_root=str(tmp))).start()
    grpc_s, raw_s = [], []
    try:
        for r in range(cfg.push_repeats):  # interleaved
            grpc_s.append(_push_in_child("grpc", srv.address, cfg, r + 1))
            raw_path = tmp / "raw_copy.bin"
            rsrv, th, errors = common.raw_receiver(total, raw_path, cfg.chunk_mb << 20)
            raw_s.append(_push_in_child("raw", f"127.0.0.1:{rsrv.getsockname()[1]}", cfg, 0))
            th.join()
            if errors:
                raise errors[0]
            raw_path.unlink()
    finally:
        srv.stop()
    mb = total / 1e6
    g, rw = common.median(grpc_s), common.median(raw_s)
    what = "weight push MB/s: gRPC (chunks + CRC-32C + staged file + verify) vs raw loopback TCP"
    res["rows"].append(_row(f"{what} -> file", mb / g, mb / rw, "MB/s"))
    res["targets"].append(
        common.target("weight push MB/s: gRPC / raw loopback socket", rw / g, 0.5, ">=")
    )
    res["config"].update(push_bytes=total, push_tensors=len(shapes))
    res["notes"].append(
        f"push model: {len(shapes)} tensors, {mb:.0f} MB {cfg.push_dtype} (Qwen3 shapes: "
        f"{cfg.num_hidden_layers} layers, D={cfg.hidden_size}, V={cfg.vocab_size}, tied); "
        f"chunk {cfg.chunk_mb} MiB; sender in its own process; median of {cfg.push_repeats}: "
        f"gRPC {g:.2f} s, raw socket {rw:.2f} s; the push server verifies and stages but does "
        f"not load into an engine (TransportOnlyBackend)"
    )


def _bench_rollouts(cfg: SamplerBenchConfig, res: dict, tmp: pathlib.Path) -> None:
    from vllm import TokensPrompt

    from dlc_jax.sampler.backends import make_backend
    from dlc_jax.sampler.backends.vllm_backend import vllm_sampling_params
    from dlc_jax.sampler.client.client import SamplerClient
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread
    from dlc_jax.sampler.wire import safetensors_io as st
    from dlc_jax.sampler.wire.types import SamplingParams

    model_dir = cfg.model_dir
    if model_dir is None:
        from dlc_jax.model import make_tiny

        model_dir = str(tmp / "tiny")
        make_tiny(model_dir)
    max_len, max_seqs = cfg.prompt_len + cfg.max_tokens + 8, max(cfg.prompts * cfg.n, 1)
    bcfg = BackendConfig(model_dir=model_dir, max_model_len=max_len, max_num_seqs=max_seqs)
    backend = make_backend("vllm", bcfg)
    srv = ServerThread(backend, ServerConfig()).start()
    client = SamplerClient(srv.address, timeout=3600)
    vocab = backend.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab, cfg.prompt_len).tolist() for _ in range(cfg.prompts)]
    params = SamplingParams(n=cfg.n, max_tokens=cfg.max_tokens, temperature=1.0, head_k=0, seed=1)
    counter = itertools.count(1)

    def via_grpc():
        """The gRPC client runs in its own process (as a trainer would), timing only generate()."""
        args = (srv.address, prompts, dataclasses.asdict(params))
        return tuple(common.call_in_child("dlc_jax.bench.sampler_bench", "_client_run", *args))

    async def _direct():
        sp = vllm_sampling_params(params)

        async def one(p):
            final = None
            async for out in backend.engine.generate(
                TokensPrompt(prompt_token_ids=p), sp, request_id=f"direct-{next(counter)}"
            ):
                final = out
            return sum(len(c.token_ids) for c in final.outputs)

        return sum(await asyncio.gather(*(one(p) for p in prompts)))

    def direct():
        return common.measure(lambda: srv.run(_direct()))[:2]  # (tokens, seconds)

    try:
        via_grpc(), direct()  # warm-up
        runs: dict[str, list] = {"grpc": [], "direct": []}
        for _ in range(cfg.repeats):  # interleaved A B A B
            runs["grpc"].append(via_grpc())
            runs["direct"].append(direct())
        tokens = {k: v[0][0] for k, v in runs.items()}
        times = {k: [s for _, s in v] for k, v in runs.items()}
        # engine apply time for a push into the running vLLM engine (tiny model)
        w = dict(st.iter_tensors(model_dir))
        pr, apply_s, _, _ = common.measure(lambda: client.push_weights(w, 1))
        common.accepted(pr)
    finally:
        client.close()
        srv.stop()
    g = tokens["grpc"] / common.median(times["grpc"])
    d = tokens["direct"] / common.median(times["direct"])
    res["rows"].insert(
        0, _row("rollout tokens/s: gRPC service vs vLLM AsyncLLM direct", g, d, "tok/s")
    )
    res["targets"].append(
        common.target("rollout tokens/s: gRPC service / direct vLLM", g / d, 0.9, ">=")
    )
    res["notes"] += [
        f"rollouts: {cfg.prompts} prompts x n={cfg.n} x {cfg.max_tokens} tokens (prompt "
        f"{cfg.prompt_len}), T=1, ignore EOS, per-request seed, vLLM fp32 eager on CPU, same "
        f"engine for both paths; median of {cfg.repeats} interleaved runs; the gRPC client is a "
        "separate process (like the trainer; one untimed warm-up call in that process before the "
        "timed one), the direct peer calls AsyncLLM.generate on the server's event loop",
        "full push + vLLM reload_weights of the rollout model "
        f"({sum(a.nbytes for a in w.values()) / 1e6:.1f} MB): {apply_s:.3f} s",
    ]


def _client_run(address: str, prompts: list[list[int]], params: dict) -> tuple[int, float]:
    """Client-process side of the rollout benchmark: -> (response tokens, seconds)."""
    from dlc_jax.sampler.client.client import SamplerClient
    from dlc_jax.sampler.wire.types import SamplingParams

    p = SamplingParams(**{**params, "stop_token_ids": tuple(params["stop_token_ids"])})
    with SamplerClient(address, timeout=3600) as c:
        c.wait_ready(60)
        # one untimed call first: a trainer's client is long-lived, so a fresh process's one-time
        # costs (stream setup, message classes) are not per-call costs
        sum(len(r.response_ids) for r in c.generate(prompts, p))
        return common.measure(lambda: sum(len(r.response_ids) for r in c.generate(prompts, p)))[:2]


def _row(measurement: str, ours: float, peer: float, unit: str) -> dict:
    """A table row: our throughput against the peer's (ratio = ours / peer)."""
    return dict(measurement=measurement, ours=ours, peer=peer, unit=unit, ratio=ours / peer)


def run(cfg: SamplerBenchConfig = SIZES["default"]) -> dict:
    title = "Sampler service: gRPC vs direct vLLM, weight push vs raw socket"
    res = common.new_result("sampler", title, ["measurement", "ours", "peer", "unit", "ratio"], cfg)
    with tempfile.TemporaryDirectory(prefix="dlc_sampler_bench_") as d:
        tmp = pathlib.Path(d)
        _bench_rollouts(cfg, res, tmp)
        _bench_push(cfg, res, tmp)
    return common.finish(res)


if __name__ == "__main__":
    import sys

    from .cli import cli

    sys.exit(cli(["sampler", *sys.argv[1:]]))
