"""`dlc-jax sampler serve ...` and `dlc-jax sampler info --address HOST:PORT`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys

from dlc_jax.cli_args import ArgumentParser
from dlc_jax.errors import UserError


class SamplerCliError(UserError):
    """``dlc-jax sampler serve`` / ``info`` could not start or get an answer."""


def _parser() -> ArgumentParser:
    ap = ArgumentParser(prog="dlc-jax sampler", description="sampler service")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="start a sampler server")
    s.add_argument("--backend", choices=["vllm", "jax"], default="vllm")
    s.add_argument(
        "--model", required=True, help="HF Qwen3 directory (config.json + *.safetensors)"
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument(
        "--port",
        type=int,
        default=0,
        help="0 = pick a free port (printed as 'LISTENING host:port')",
    )
    s.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    s.add_argument(
        "--quantization", default=None, help="vLLM: e.g. fp8_per_channel; jax: int8 | fp8_e4m3"
    )
    s.add_argument("--tensor-parallel-size", type=int, default=1)
    s.add_argument("--max-model-len", type=int, default=512)
    s.add_argument("--max-n", type=int, default=64)
    s.add_argument("--max-head-k", type=int, default=20)
    s.add_argument(
        "--max-lora-rank",
        type=int,
        default=0,
        help="serve LoRA adapter pushes up to this rank (vLLM: enables LoRA; 0 = off)",
    )
    s.add_argument("--max-num-seqs", type=int, default=64)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--kv-cache-gib", type=float, default=None, help="vLLM KV cache size (default 1 GiB on CPU)"
    )
    s.add_argument("--initial-version", type=int, default=0)
    s.add_argument(
        "--weight-noise", type=float, default=0.0, help="jax: sigma relative to per-tensor rms"
    )
    s.add_argument("--weight-noise-seed", type=int, default=0)
    s.add_argument(
        "--token", default=None, help="require 'authorization: Bearer TOKEN' on every call"
    )
    s.add_argument(
        "--token-file",
        default=None,
        help="read TOKEN from this file (keeps it out of the process list)",
    )
    s.add_argument("--tls-cert", default=None)
    s.add_argument("--tls-key", default=None)
    s.add_argument("--max-message-bytes", type=int, default=64 << 20)
    s.add_argument(
        "--push-data-port",
        type=int,
        default=None,
        help="also accept weight-push bytes over a raw TCP socket on this port "
        "(0 = pick a free one; default off). Plaintext: loopback / trusted networks only; "
        "refused together with TLS",
    )
    s.add_argument(
        "--push-idle-timeout",
        type=float,
        default=60.0,
        help="discard a weight push whose stream (or data socket) is silent this many seconds",
    )
    s.add_argument(
        "--push-max-seconds",
        type=float,
        default=900.0,
        help="discard a weight push that takes longer than this in all",
    )
    s.add_argument(
        "--data-auth-timeout",
        type=float,
        default=5.0,
        help="a push data connection must send its preamble (push id + token) within this many "
        "seconds",
    )
    s.add_argument(
        "--data-max-pending",
        type=int,
        default=64,
        help="push data connections held at once (awaiting preamble or push); more are closed",
    )
    s.add_argument(
        "--load-root",
        default=None,
        help="allow LoadWeights of directories under this root (default: LoadWeights disabled)",
    )
    s.add_argument(
        "--staging-root",
        default=None,
        help="directory for staged weight pushes (default auto: /dev/shm when it has room for 2x "
        "the push, else the system temp dir)",
    )
    s.add_argument(
        "--push-staging",
        choices=["memory", "file"],
        default="memory",
        help="memory (default): staging file memory-mapped, checks overlapped with receiving, the "
        "JAX engine loads each verified tensor as the next arrives; file: the engine loads the "
        "staged file at Commit",
    )
    s.add_argument(
        "--push-staging-warm",
        choices=["on", "off"],
        default="on",
        help="memory staging: keep the last superseded staging file mapped for the next push "
        "(on, default: no page faults, ~6x less receive CPU; one more staged model of RAM)",
    )
    i = sub.add_parser("info", help="query a running server")
    i.add_argument("--address", required=True)
    i.add_argument("--token", default=None)
    i.add_argument("--token-file", default=None)
    i.add_argument("--tls-root-cert", default=None)
    i.add_argument(
        "--tls-server-name", default=None, help="expected name in the server certificate"
    )
    i.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer")
    return ap


# `serve` flags whose config field has another name (the others have the field's name)
_RENAMED = {
    "model": "model_dir",
    "push_data_port": "data_port",
    "push_idle_timeout": "push_idle_timeout_s",
    "push_max_seconds": "push_max_s",
    "data_auth_timeout": "data_auth_timeout_s",
}


def _fields(cls, args) -> dict:
    """The `serve` flags that are fields of the config dataclass `cls`, as its keywords."""
    given = {_RENAMED.get(k, k): v for k, v in vars(args).items()}
    given["push_staging_warm"] = args.push_staging_warm == "on"
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in given.items() if k in names}


async def _serve(args) -> int:
    from ..backends import BackendConfig, make_backend
    from .server import SamplerServer, ServerConfig

    backend = make_backend(args.backend, BackendConfig(**_fields(BackendConfig, args)))
    server = SamplerServer(backend, ServerConfig(**_fields(ServerConfig, args)))
    await server.start()
    print(f"LISTENING {server.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()
    return 0


def _resolve_token(ap: argparse.ArgumentParser, args) -> None:
    if args.token_file:
        if args.token:
            ap.error("--token and --token-file are exclusive")
        try:
            args.token = open(args.token_file).read().strip()
        except OSError as e:
            ap.error(f"--token-file: {e}")
        if not args.token:
            ap.error(f"--token-file: {args.token_file} is empty")


def cli(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    _resolve_token(ap, args)
    if args.cmd == "serve":
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        try:
            return asyncio.run(_serve(args))
        except (ValueError, OSError, RuntimeError, ImportError) as e:  # flags, model, engine
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise SamplerCliError(f"serve: {msg}") from e
    import grpc

    from ..client.client import SamplerClient

    try:
        with SamplerClient(
            args.address,
            token=args.token,
            tls_root_cert=args.tls_root_cert,
            tls_server_name=args.tls_server_name,
            max_retries=0,
            timeout=args.timeout,
        ) as c:
            info = c.info()
    except grpc.RpcError as e:
        detail = (e.details() or "").splitlines()[0] if e.details() else ""
        raise SamplerCliError(
            f"info: no answer from {args.address}: {e.code().name}"
            + (f" ({detail})" if detail else "")
        ) from None
    except (ValueError, OSError) as e:
        raise SamplerCliError(f"info: {e}") from None
    print(json.dumps(info, indent=2))
    return 0


# `python -m dlc_jax.sampler.service.cli` (a spawned sampler): the same errors
if __name__ == "__main__":
    from dlc_jax.cli import run_command

    sys.exit(run_command("sampler", sys.argv[1:]))
