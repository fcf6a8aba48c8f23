"""Soak the sampler service as a hostile client would, on loopback only, and count what went wrong.

A real sampler (`python -m dlc_jax.sampler.cli serve`, JAX backend on a tiny model; vLLM too when
asked) with a token, a push data port, a load root and short push limits receives:

* bad inputs: malformed Generate requests, bad authorization on every RPC, garbage bytes on the gRPC
  and data ports (and as serialized requests);
* push attacks: silent, stalled, trickling, partial, cut, oversized, out-of-order, NaN/Inf, wrong
  dtype / shape / name / checksum / version, socket-plane tricks, LoadWeights escapes, a 1 TB
  safetensors header, the served directory;
* 200 concurrent Generate streams with a good push in the middle;
* 100 requests with distinct sampling values (time and server RSS growth), 300 idle data
  connections (server thread count);
* a SIGKILL after a push, then a restart on the same staging root.

Counted: crashes (the server process died or stopped answering), bad weights served (a rejected
push changed what is served, a NaN log-prob, a version span naming a rejected version), files left
behind (staging directories after the samplers are gone), attacks accepted, errors whose message is
not one line. `run(out_dir)` writes `sampler_soak.json` / `.md` there and returns the result dict.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import signal
import socket
import struct
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np

from . import common

log = logging.getLogger(__name__)
TOKEN = "soak-token"


@dataclasses.dataclass
class SoakConfig:
    backends: tuple[str, ...] = ("jax",)
    streams: int = 200
    distinct_params: int = 100
    idle_connections: int = 300
    max_model_len: int = 128
    seed: int = 0


class Tally:
    """Outcome counts per category; `expect(cat, fn, codes)` runs one attack."""

    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.examples: list[str] = []

    def row(self, cat: str) -> dict:
        return self.rows.setdefault(
            cat,
            {
                "category": cat,
                "cases": 0,
                "refused": 0,
                "accepted": 0,
                "wrong_code": 0,
                "multi_line_errors": 0,
            },
        )

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


# -- the sampler under test ----------------------------------------------------------------------
def _make_model(root: Path) -> Path:
    from dlc_jax.model.tiny import make_tiny

    d = root / "tiny"
    make_tiny(
        str(d),
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    )
    return d


def _start(
    backend: str, model: Path, staging: Path, load_root: Path, cfg: SoakConfig, log_file: Path
):
    from dlc_jax.sampler.process import SamplerProcess

    args = [
        "--max-model-len",
        str(cfg.max_model_len),
        "--max-head-k",
        "8",
        "--max-n",
        "4",
        "--push-data-port",
        "0",
        "--staging-root",
        str(staging),
        "--load-root",
        str(load_root),
        "--push-idle-timeout",
        "1",
        "--push-max-seconds",
        "6",
        "--data-auth-timeout",
        "0.5",
        "--data-max-pending",
        "32",
    ]
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


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("Threads", "VmRSS"):
            out[k] = int(v.split()[0])
    return out


def _perturbed(weights: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        k: (v + 0.3 * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
        for k, v in weights.items()
    }


def _stream(weights: dict, version: int, *, mutate=None, commit=True, chunk=1 << 14):
    """A gRPC-plane push stream with sha256 trailers; `mutate(kind, msg)` may replace messages."""
    from dlc_jax.sampler import sampler_pb2 as pb

    specs = [
        pb.TensorSpec(name=n, shape=list(a.shape), dtype="float32", nbytes=int(a.nbytes))
        for n, a in weights.items()
    ]
    msgs = [
        pb.WeightMessage(header=pb.WeightHeader(version=version, tensors=specs, dtype="float32"))
    ]
    for i, a in enumerate(weights.values()):
        b = np.ascontiguousarray(a, np.float32).tobytes()
        for off in range(0, len(b), chunk):
            msgs.append(
                pb.WeightMessage(
                    chunk=pb.WeightChunk(tensor_index=i, offset=off, data=b[off : off + chunk])
                )
            )
        msgs.append(
            pb.WeightMessage(
                done=pb.TensorDone(tensor_index=i, sha256=hashlib.sha256(b).hexdigest())
            )
        )
    if commit:
        msgs.append(pb.WeightMessage(commit=pb.Commit()))
    for m in msgs:
        out = mutate(m.WhichOneof("kind"), m) if mutate else m
        if isinstance(out, list):
            yield from out
        elif out is not None:
            yield out


# -- phases --------------------------------------------------------------------------------------
def _bad_inputs(
    t: Tally, client, address: str, data_port: int, vocab: int, cfg: SoakConfig
) -> None:
    from dlc_jax.sampler import sampler_pb2 as pb
    from dlc_jax.sampler import sampler_pb2_grpc as pb_grpc

    def gen(params=None, prompts=((1, 2, 3),), **kw):
        p = {**dict(n=1, max_tokens=4, temperature=1.0, top_p=1.0), **(params or {})}
        req = pb.GenerateRequest(
            request_id="bad",
            prompts=[pb.Prompt(slot_id=i, token_ids=list(x)) for i, x in enumerate(prompts)],
            params=None if kw.get("no_params") else pb.SamplingParams(**p),
        )
        return lambda: list(client.stub.Generate(req, timeout=30, metadata=client._md()))

    nan, inf = float("nan"), float("inf")
    param_cases = [
        {"n": 0},
        {"n": 1000},
        {"max_tokens": 0},
        {"max_tokens": 100000},
        {"temperature": -1.0},
        {"temperature": nan},
        {"temperature": inf},
        {"temperature": -inf},
        {"temperature": 1e-40},
        {"temperature": 1e-10},
        {"temperature": 0.005},
        {"top_p": 1.5},
        {"top_p": -0.5},
        {"top_p": nan},
        {"top_k": -2},
        {"top_k": -100},
        {"head_k": 9},
        {"head_k": 1000},
        {"stop_token_ids": [vocab]},
        {"stop_token_ids": [-1]},
        {"stop_token_ids": [2**31 - 1]},
        {"stop_token_ids": [1, vocab + 5]},
        {"n": 5},
        {"head_k": 20},
        {"top_k": -3},
        {"max_tokens": cfg.max_model_len - 2},
        {"temperature": 1e-300},
        {"top_p": 1.0000001},
    ]
    for p in param_cases:
        t.rpc("generate: bad params", gen(p), ("INVALID_ARGUMENT",))
    prompt_cases = [
        (),
        ((),),
        ((-1,),),
        ((vocab,),),
        ((2**31 - 1,),),
        (tuple(range(1, cfg.max_model_len)),),
        tuple((1,) for _ in range(4097)),
        ((1, 2),) * 50 + ((vocab + 1,),),
        ((-(2**31),),),
    ]
    for pr in prompt_cases:
        t.rpc("generate: bad prompts", gen(prompts=pr), ("INVALID_ARGUMENT",))
    t.rpc("generate: bad prompts", gen(no_params=True), ("INVALID_ARGUMENT",))
    # authorization on every RPC
    chan = grpc.insecure_channel(address)
    stub = pb_grpc.SamplerStub(chan)
    auths = [
        None,
        "Bearer wrong",
        "Bearer",
        "bearer " + TOKEN,
        f"Bearer {TOKEN} ",
        "Basic " + TOKEN,
        TOKEN,
        f"Bearer {TOKEN}{TOKEN}",
    ]
    for a in auths:
        md = None if a is None else (("authorization", a),)
        t.rpc(
            "bad auth",
            lambda md=md: stub.Info(pb.InfoRequest(), timeout=10, metadata=md),
            ("UNAUTHENTICATED",),
        )
        req = pb.GenerateRequest(
            prompts=[pb.Prompt(token_ids=[1, 2])], params=pb.SamplingParams(n=1, max_tokens=2)
        )
        t.rpc(
            "bad auth",
            lambda md=md, req=req: list(stub.Generate(req, timeout=10, metadata=md)),
            ("UNAUTHENTICATED",),
        )
        t.rpc(
            "bad auth",
            lambda md=md: stub.PushWeights(
                iter([pb.WeightMessage(commit=pb.Commit())]), timeout=10, metadata=md
            ),
            ("UNAUTHENTICATED",),
        )
        t.rpc(
            "bad auth",
            lambda md=md: stub.LoadWeights(
                pb.LoadWeightsRequest(path="/", version=99), timeout=10, metadata=md
            ),
            ("UNAUTHENTICATED",),
        )
    chan.close()
    # garbage serialized as requests (the server's deserializer sees random bytes)
    rng = np.random.default_rng(cfg.seed)
    raw_chan = grpc.insecure_channel(address)
    ident = lambda b: b  # noqa: E731
    raw_gen = raw_chan.unary_stream(
        "/dlc_jax.sampler.v1.Sampler/Generate",
        request_serializer=ident,
        response_deserializer=ident,
    )
    raw_info = raw_chan.unary_unary(
        "/dlc_jax.sampler.v1.Sampler/Info", request_serializer=ident, response_deserializer=ident
    )
    for n in (1, 2, 3, 7, 64, 255, 1000, 4096, 100_000):
        junk = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        t.rpc(
            "garbage request bytes",
            lambda j=junk: list(raw_gen(j, timeout=10, metadata=client._md())),
            (),
        )
    t.rpc(
        "garbage request bytes",
        lambda: raw_info(b"\xff" * 50, timeout=10, metadata=client._md()),
        (),
    )
    raw_chan.close()
    # garbage on the wire (no answer expected; the server must just survive)
    host, port = address.rsplit(":", 1)
    wire = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1, 16, 200, 5000, 70000)]
    wire += [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 100,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + struct.pack(">I", 0xFFFFFF)[1:]
        + b"\x00\x00\x00\x00\x01",
        b"PRI * HTTP/2.0\r\n",
        b"",
    ]
    for w in wire:
        _send_raw(host, int(port), w)
        t.record("garbage on the gRPC port", "CLOSED", "", ())
    good_pid = uuid.uuid4().hex.encode()
    dwire = [
        b"junk" * 10,
        b"DLCPUSH2" + good_pid + b"\x00\x00",
        b"DLCPUSH1" + good_pid + struct.pack(">H", 5) + b"wrong",
        b"DLCPUSH1" + good_pid + struct.pack(">H", 65535) + b"x" * 100,
        b"DLCPUSH1" + good_pid + b"\x00\x00",
        b"DLC",
        b"",
        rng.integers(0, 256, 100000, dtype=np.uint8).tobytes(),
    ]
    for w in dwire:
        _send_raw(host, data_port, w)
        t.record("garbage on the data port", "CLOSED", "", ())


def _send_raw(host: str, port: int, data: bytes) -> None:
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            if data:
                s.sendall(data)
            s.settimeout(1.0)
            try:
                s.recv(4096)
            except (TimeoutError, OSError):
                pass
    except OSError:
        pass


def _all_int32(h) -> None:
    for spec in h.tensors:
        spec.dtype = "int32"


def _socket_plane_without_connection(h) -> None:
    h.data_plane = "socket"
    h.data_push_id = "a" * 32


def _push_attacks(t: Tally, client, weights: dict, load_root: Path, probe, v: int) -> None:
    from dlc_jax.sampler import sampler_pb2 as pb

    good = _perturbed(weights, 99)
    names = list(good)

    def messages(gen_fn):
        return lambda: client.push_messages(gen_fn())

    def silent():
        time.sleep(2.5)
        return
        yield

    def stalled():
        yield next(_stream(good, v + 1))
        time.sleep(2.5)

    def trickle():
        s = _stream(good, v + 1, chunk=64)
        yield next(s)
        for m in s:
            time.sleep(0.5)
            yield m

    def mut_chunk(fn):
        return messages(
            lambda: _stream(good, v + 1, mutate=lambda k, m: fn(m) if k == "chunk" else m)
        )

    def bad_header(fn):
        def mutate(k, m):
            if k == "header":
                fn(m.header)
            return m

        return messages(lambda: _stream(good, v + 1, mutate=mutate))

    def flip(m):
        if m.chunk.tensor_index == 1 and m.chunk.offset == 0:
            d = bytearray(m.chunk.data)
            d[0] ^= 1
            return pb.WeightMessage(chunk=pb.WeightChunk(tensor_index=1, offset=0, data=bytes(d)))
        return m

    def oversize(m):
        if m.chunk.tensor_index == 0 and m.chunk.offset == 0:
            return [
                m,
                pb.WeightMessage(
                    chunk=pb.WeightChunk(
                        tensor_index=0, offset=len(m.chunk.data), data=b"\0" * (1 << 20)
                    )
                ),
            ]
        return m

    nan = {k: np.full(a.shape, np.nan, np.float32) for k, a in weights.items()}
    inf1 = _perturbed(weights, 5)
    inf1[names[-1]].reshape(-1)[0] = np.inf
    attacks = {
        "silent stream": (messages(silent), ("ABORTED",)),
        "stalled after header": (messages(stalled), ("ABORTED",)),
        "trickle past max duration": (messages(trickle), ("ABORTED",)),
        "partial (no commit)": (messages(lambda: _stream(good, v + 1, commit=False)), ("ABORTED",)),
        "flipped bit, valid length": (mut_chunk(flip), ("DATA_LOSS",)),
        "oversized tensor": (mut_chunk(oversize), ("INVALID_ARGUMENT",)),
        "chunk out of order": (
            mut_chunk(
                lambda m: pb.WeightMessage(
                    chunk=pb.WeightChunk(
                        tensor_index=m.chunk.tensor_index,
                        offset=m.chunk.offset + 4,
                        data=m.chunk.data,
                    )
                )
            ),
            ("INVALID_ARGUMENT",),
        ),
        "tensor index out of range": (
            mut_chunk(
                lambda m: pb.WeightMessage(
                    chunk=pb.WeightChunk(tensor_index=10_000, offset=0, data=m.chunk.data)
                )
            ),
            ("INVALID_ARGUMENT",),
        ),
        "all NaN, valid checksums": (
            lambda: client.push_weights(nan, v + 1),
            ("INVALID_ARGUMENT",),
        ),
        "one Inf (bf16, socket)": (
            lambda: client.push_weights(inf1, v + 1, dtype="bfloat16", transport="socket"),
            ("INVALID_ARGUMENT",),
        ),
        "wrong dtype int32": (
            bad_header(_all_int32),
            ("INVALID_ARGUMENT",),
        ),
        "wrong shape": (
            bad_header(lambda h: h.tensors[0].shape.__setitem__(0, h.tensors[0].shape[0] + 1)),
            ("INVALID_ARGUMENT",),
        ),
        "unknown name": (
            bad_header(lambda h: setattr(h.tensors[0], "name", "model.evil.weight")),
            ("INVALID_ARGUMENT",),
        ),
        "missing tensor": (bad_header(lambda h: h.tensors.pop()), ("INVALID_ARGUMENT",)),
        "wrong sha256 in header": (
            bad_header(lambda h: setattr(h.tensors[0], "sha256", "0" * 64)),
            ("DATA_LOSS",),
        ),
        "unknown checksum": (
            bad_header(lambda h: setattr(h, "checksum", "md5")),
            ("INVALID_ARGUMENT",),
        ),
        "stale version": (lambda: client.push_weights(good, v), ("FAILED_PRECONDITION",)),
        "no header first": (
            messages(lambda: iter([pb.WeightMessage(commit=pb.Commit())])),
            ("INVALID_ARGUMENT",),
        ),
        "empty message": (messages(lambda: iter([pb.WeightMessage()])), ("INVALID_ARGUMENT",)),
        "socket plane, no data connection": (
            bad_header(_socket_plane_without_connection),
            ("FAILED_PRECONDITION", "INVALID_ARGUMENT"),
        ),
        "garbage message bytes": (
            messages(lambda: iter([b"\x0a\xff\xff\xff\xff\x0f" + b"x" * 10])),
            (),
        ),
    }
    outside = Path(tempfile.mkdtemp(prefix="soak_outside_"))
    try:
        from dlc_jax.sampler import safetensors_io as st

        st.write_file(outside / "model.safetensors", good)
        for name, arrays in (
            ("nan", nan),
            ("int32", {k: np.zeros(a.shape, np.int32) for k, a in weights.items()}),
        ):
            (load_root / name).mkdir(exist_ok=True)
            st.write_file(load_root / name / "model.safetensors", arrays)
        (load_root / "huge").mkdir(exist_ok=True)
        (load_root / "huge" / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
        (load_root / "escape").unlink(missing_ok=True)
        (load_root / "escape").symlink_to(outside)
        attacks.update(
            {
                "load: outside root": (
                    lambda: client.load_weights(str(outside), v + 1),
                    ("FAILED_PRECONDITION",),
                ),
                "load: symlink escape": (
                    lambda: client.load_weights(str(load_root / "escape"), v + 1),
                    ("FAILED_PRECONDITION",),
                ),
                "load: NaN values": (
                    lambda: client.load_weights(str(load_root / "nan"), v + 1),
                    ("INVALID_ARGUMENT",),
                ),
                "load: int32 zeros": (
                    lambda: client.load_weights(str(load_root / "int32"), v + 1),
                    ("INVALID_ARGUMENT",),
                ),
                "load: 1 TB header": (
                    lambda: client.load_weights(str(load_root / "huge"), v + 1),
                    ("INVALID_ARGUMENT",),
                ),
                "load: /etc": (
                    lambda: client.load_weights("/etc", v + 1),
                    ("FAILED_PRECONDITION",),
                ),
            }
        )
        for name, (fn, codes) in attacks.items():
            t.rpc(f"push attack: {name}", fn, codes)
            probe(f"after push attack {name!r}")
    finally:
        import shutil

        shutil.rmtree(outside, ignore_errors=True)


def _streams_with_push(client, weights: dict, v: int, n: int, vocab: int) -> dict:
    from dlc_jax.sampler.types import SamplingParams

    done = threading.Semaphore(0)
    results: list = [None] * n

    def one(i: int):
        try:
            rng = np.random.default_rng(i)
            prompt = rng.integers(1, vocab, int(rng.integers(2, 12))).tolist()
            (r,) = list(
                client.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0, seed=i))
            )
            results[i] = r
        except grpc.RpcError as e:
            results[i] = e
        finally:
            done.release()

    with ThreadPoolExecutor(n) as ex:
        for i in range(n):
            ex.submit(one, i)
        for _ in range(n // 4):
            done.acquire()
        push = client.push_weights(_perturbed(weights, 7), v + 1)
    errors = [r for r in results if not hasattr(r, "logprobs")]
    rolls = [r for r in results if hasattr(r, "logprobs")]
    bad = sum(
        1
        for r in rolls
        if not np.isfinite(r.logprobs).all()
        or any(ver not in (v, v + 1) for ver, _, _ in r.version_spans)
        or (
            r.version_spans
            and (r.version_spans[0][1] != 0 or r.version_spans[-1][2] != len(r.response_ids))
        )
    )
    return {
        "streams": n,
        "stream_errors": len(errors),
        "bad_rollouts": bad,
        "push_ok": bool(push.ok),
        "rollouts_with_new_version": sum(
            1 for r in rolls if any(x[0] == v + 1 for x in r.version_spans)
        ),
        "rollouts_spanning_two_versions": sum(
            1 for r in rolls if len({x[0] for x in r.version_spans}) > 1
        ),
        "error_examples": [f"{e.code().name}: {e.details()}" for e in errors[:3]],
    }


def _distinct_params(client, pid: int, n: int) -> dict:
    from dlc_jax.sampler.types import SamplingParams

    rng = np.random.default_rng(1)
    list(
        client.generate(
            [[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, top_k=5, head_k=2)
        )
    )
    rss0 = _proc_status(pid)["VmRSS"]
    t0 = time.perf_counter()
    nonfinite = 0
    for i in range(n):
        p = SamplingParams(
            max_tokens=4,
            temperature=float(rng.uniform(0.05, 2.0)),
            top_p=float(rng.uniform(0.3, 0.99)),
            top_k=int(rng.integers(1, 300)),
            head_k=int(rng.integers(1, 9)),
            seed=i,
        )
        (r,) = list(client.generate([[1, 2, 3]], p))
        nonfinite += int(not np.isfinite(r.logprobs).all())
    return {
        "distinct_param_requests": n,
        "distinct_params_s": time.perf_counter() - t0,
        "distinct_params_rss_growth_mb": (_proc_status(pid)["VmRSS"] - rss0) / 1024,
        "nonfinite": nonfinite,
    }


def _idle_connections(pid: int, host: str, data_port: int, n: int) -> dict:
    th0 = _proc_status(pid)["Threads"]
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection((host, data_port), timeout=5))
        except OSError:
            break
    time.sleep(0.3)
    th1 = _proc_status(pid)["Threads"]
    for s in socks:
        s.close()
    return {
        "idle_data_connections": len(socks),
        "server_threads_before": th0,
        "server_threads_with_idle": th1,
    }


def _staging_dirs(staging: Path) -> list[str]:
    return [p.name for p in staging.iterdir()] if staging.exists() else []


def _soak_backend(
    backend: str, cfg: SoakConfig, work: Path, t: Tally, metrics: dict, pids: list
) -> None:
    from dlc_jax.sampler import safetensors_io as st
    from dlc_jax.sampler.types import SamplingParams

    model = work / "tiny"
    staging, load_root = work / f"staging_{backend}", work / f"load_{backend}"
    load_root.mkdir(exist_ok=True)
    weights = dict(st.iter_tensors(model))
    proc = _start(backend, model, staging, load_root, cfg, work / f"sampler_{backend}.log")
    pids.append(proc.proc.pid)
    m = metrics.setdefault(backend, {"crashes": 0, "bad_weights_served": 0})
    try:
        client = proc.client(timeout=300, max_retries=0)
        info = client.info()
        vocab, v = info["vocab_size"], info["version"]
        probe_p = SamplingParams(max_tokens=6, temperature=1.0, seed=5, head_k=3)
        baseline = list(client.generate([[5, 6, 7, 8]], probe_p))[0]

        def probe(where: str) -> None:
            if proc.proc.poll() is not None:
                m["crashes"] += 1
                raise RuntimeError(f"{backend} sampler died {where}; log {proc.log_file}")
            try:
                (r,) = list(client.generate([[5, 6, 7, 8]], probe_p))
            except grpc.RpcError as e:
                m["crashes"] += 1
                t.examples.append(f"{backend}: probe failed {where}: {e.code().name} {e.details()}")
                return
            if (
                client.info()["version"] != v
                or not np.isfinite(r.logprobs).all()
                or not np.allclose(r.logprobs, baseline.logprobs, atol=1e-4)
            ):
                m["bad_weights_served"] += 1
                t.examples.append(f"{backend}: served weights changed {where}")

        host = proc.address.rsplit(":", 1)[0]
        _bad_inputs(t, client, proc.address, info["data_port"], vocab, cfg)
        probe("after the bad inputs")
        _push_attacks(t, client, weights, load_root, probe, v)
        m.update(_idle_connections(proc.proc.pid, host, info["data_port"], cfg.idle_connections))
        probe("after the idle connections")
        s = _streams_with_push(client, weights, v, cfg.streams, vocab)
        m.update(s)
        m["bad_weights_served"] += s["bad_rollouts"]
        m.update(_distinct_params(client, proc.proc.pid, cfg.distinct_params))
        m["bad_weights_served"] += m.pop("nonfinite")
        m["server_alive_at_end"] = proc.proc.poll() is None
        if not m["server_alive_at_end"]:
            m["crashes"] += 1
        client.close()
    finally:
        proc.stop()
    m["staging_left_after_stop"] = len(_staging_dirs(staging))
    if backend != "jax":
        return
    # SIGKILL after a push (no cleanup possible), then a restart on the same staging root
    proc = _start(backend, model, staging, load_root, cfg, work / f"sampler_{backend}_2.log")
    pids.append(proc.proc.pid)
    try:
        with proc.client(timeout=60) as c:
            c.push_weights(_perturbed(weights, 3), 1)
    except BaseException:
        proc.stop()
        raise
    os.kill(proc.proc.pid, signal.SIGKILL)  # not proc.kill(): that would clean up for it
    proc.proc.wait()
    m["staging_left_by_sigkill"] = len(_staging_dirs(staging))
    proc = _start(backend, model, staging, load_root, cfg, work / f"sampler_{backend}_3.log")
    pids.append(proc.proc.pid)
    m["staging_after_restart"] = len(_staging_dirs(staging))
    proc.stop()
    m["staging_left_at_end"] = len(_staging_dirs(staging))


def run(out_dir, cfg: SoakConfig | None = None) -> dict:
    """Run the soak (loopback only, bounded: a few minutes on a laptop CPU); write
    `<out_dir>/sampler_soak.{json,md}` and return the result dict."""
    cfg = cfg or SoakConfig()
    res = common.new_result(
        "sampler_soak",
        "Sampler service soak (hostile clients, loopback)",
        ["category", "cases", "refused", "accepted", "wrong_code", "multi_line_errors"],
    )
    res["config"] = dataclasses.asdict(cfg)
    t = Tally()
    metrics: dict = {}
    pids: list[int] = []
    with tempfile.TemporaryDirectory(prefix="dlc_soak_") as tmp:
        work = Path(tmp)
        _make_model(work)
        for backend in cfg.backends:
            _soak_backend(backend, cfg, work, t, metrics, pids)
        shm_left = [
            p.name
            for pid in pids
            for root in (Path("/dev/shm"), Path(tempfile.gettempdir()))
            for p in root.glob(f"dlc_push_p{pid}_*")
        ]
    res["rows"] = list(t.rows.values())
    bad_inputs = sum(r["cases"] for k, r in t.rows.items() if not k.startswith("push attack"))
    attacks = sum(r["cases"] for k, r in t.rows.items() if k.startswith("push attack"))
    crashes = sum(m["crashes"] for m in metrics.values())
    bad_served = sum(m["bad_weights_served"] for m in metrics.values())
    files_left = sum(
        m.get("staging_left_at_end", m["staging_left_after_stop"]) for m in metrics.values()
    )
    files_left += len(shm_left)
    accepted = sum(r["accepted"] for r in t.rows.values())
    multi = sum(r["multi_line_errors"] for r in t.rows.values())
    res["summary"] = {
        "bad_inputs": bad_inputs,
        "push_attacks": attacks,
        "crashes": crashes,
        "bad_weights_served": bad_served,
        "files_left_behind": files_left,
        "attacks_accepted": accepted,
        "multi_line_errors": multi,
        "wrong_codes": sum(r["wrong_code"] for r in t.rows.values()),
    }
    res["metrics"] = metrics
    res["targets"] = [
        common.target("bad inputs (count)", bad_inputs, 90, ">="),
        common.target("push attacks (count)", attacks, 20, ">="),
        common.target("crashes", crashes, 0, "<="),
        common.target("bad weights served", bad_served, 0, "<="),
        common.target("files left behind", files_left, 0, "<="),
        common.target("attacks accepted", accepted, 0, "<="),
        common.target("multi-line errors", multi, 0, "<="),
    ]
    for b, m in metrics.items():
        res["notes"].append(
            f"{b}: "
            + ", ".join(
                f"{k}={v if not isinstance(v, float) else round(v, 2)}" for k, v in m.items()
            )
        )
    res["notes"] += t.examples[:20]
    res["notes"].append(common.load_note(res["machine"]))
    common.finish(res)
    common.write_result(res, out_dir)
    return res


if __name__ == "__main__":  # python -m dlc_jax.bench.soak_sampler OUT_DIR [jax,vllm]
    import json
    import sys

    logging.basicConfig(level=logging.WARNING)
    out = sys.argv[1] if len(sys.argv) > 1 else "soak_out"
    backends = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("jax",)
    r = run(out, SoakConfig(backends=backends))
    print(json.dumps({"summary": r["summary"], "metrics": r["metrics"]}, indent=2, default=str))
