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


_REQUIRED = object()
# fmt: off
# (flag, type or choices, default, help) of `serve`, then of `info`
_SERVE = (
    ("--backend", ["vllm", "jax"], "vllm", None),
    ("--model", str, _REQUIRED, "HF Qwen3 directory (config.json + *.safetensors)"),
    ("--host", str, "127.0.0.1", None),
    ("--port", int, 0, "0 = pick a free port (printed as 'LISTENING host:port')"),
    ("--dtype", ["float32", "bfloat16"], "float32", None),
    ("--quantization", str, None, "vLLM: e.g. fp8_per_channel; jax: int8 | fp8_e4m3"),
    ("--tensor-parallel-size", int, 1, None),
    ("--max-model-len", int, 512, None),
    ("--max-n", int, 64, None),
    ("--max-head-k", int, 20, None),
    ("--max-lora-rank", int, 0,
     "serve LoRA adapter pushes up to this rank (vLLM: enables LoRA; 0 = off)"),
    ("--max-num-seqs", int, 64, None),
    ("--seed", int, 0, None),
    ("--kv-cache-gib", float, None, "vLLM KV cache size (default 1 GiB on CPU)"),
    ("--initial-version", int, 0, None),
    ("--weight-noise", float, 0.0, "jax: sigma relative to per-tensor rms"),
    ("--weight-noise-seed", int, 0, None),
    ("--token", str, None, "require 'authorization: Bearer TOKEN' on every call"),
    ("--token-file", str, None, "read TOKEN from this file (keeps it out of the process list)"),
    ("--tls-cert", str, None, None),
    ("--tls-key", str, None, None),
    ("--max-message-bytes", int, 64 << 20, None),
    ("--push-data-port", int, None,
     "also accept weight-push bytes over a raw TCP socket on this port (0 = pick a free one; "
     "default off). Plaintext: loopback / trusted networks only; refused together with TLS"),
    ("--push-idle-timeout", float, 60.0,
     "discard a weight push whose stream (or data socket) is silent this many seconds"),
    ("--push-max-seconds", float, 900.0,
     "discard a weight push that takes longer than this in all"),
    ("--data-auth-timeout", float, 5.0,
     "a push data connection must send its preamble (push id + token) within this many seconds"),
    ("--data-max-pending", int, 64,
     "push data connections held at once (awaiting preamble or push); more are closed"),
    ("--load-root", str, None,
     "allow LoadWeights of directories under this root (default: LoadWeights disabled)"),
    ("--staging-root", str, None,
     "directory for staged weight pushes (default auto: /dev/shm when it has room for 2x the "
     "push, else the system temp dir)"),
    ("--push-staging", ["memory", "file"], "memory",
     "memory (default): staging file memory-mapped, checks overlapped with receiving, the JAX "
     "engine loads each verified tensor as the next arrives; file: the engine loads the staged "
     "file at Commit"),
    ("--push-staging-warm", ["on", "off"], "on",
     "memory staging: keep the last superseded staging file mapped for the next push (on, "
     "default: no page faults, ~6x less receive CPU; one more staged model of RAM)"),
)
_INFO = (
    ("--address", str, _REQUIRED, None),
    ("--token", str, None, None),
    ("--token-file", str, None, None),
    ("--tls-root-cert", str, None, None),
    ("--tls-server-name", str, None, "expected name in the server certificate"),
    ("--timeout", float, 10.0, "seconds to wait for the answer"),
)
# fmt: on


def _parser() -> ArgumentParser:
    ap = ArgumentParser(prog="dlc-jax sampler", description="sampler service")
    sub = ap.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="start a sampler server")
    info = sub.add_parser("info", help="query a running server")
    for parser, flags in ((serve, _SERVE), (info, _INFO)):
        for flag, kind, default, help in flags:
            kw: dict = {"choices": kind} if isinstance(kind, list) else {"type": kind}
            kw |= {"required": True} if default is _REQUIRED else {"default": default}
            parser.add_argument(flag, help=help, **kw)
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
