"""Sampler soak, bad inputs: malformed Generate requests, bad authorization on every RPC, garbage
serialized as requests, and garbage bytes on the gRPC and push data ports (the server must
survive each)."""

from __future__ import annotations

import contextlib
import functools
import socket
import struct
import uuid

import grpc
import numpy as np

from .harness import TOKEN, SoakConfig, Tally


def bad_inputs(t: Tally, client, address: str, data_port: int, vocab: int, cfg: SoakConfig) -> None:
    from dlc_jax.sampler.wire import sampler_pb2 as pb
    from dlc_jax.sampler.wire import sampler_pb2_grpc as pb_grpc

    def gen(params=None, prompts=((1, 2, 3),), **kw):
        p = {**dict(n=1, max_tokens=4, temperature=1.0, top_p=1.0), **(params or {})}
        req = pb.GenerateRequest(
            request_id="bad",
            prompts=[pb.Prompt(slot_id=i, token_ids=list(x)) for i, x in enumerate(prompts)],
            params=None if kw.get("no_params") else pb.SamplingParams(**p),
        )
        return lambda: list(client.stub.Generate(req, timeout=30, metadata=client._md()))

    nan, inf = float("nan"), float("inf")
    bad_values = {  # each value alone in an otherwise valid request
        "n": (0, 1000, 5),
        "max_tokens": (0, 100000, cfg.max_model_len - 2),
        "temperature": (-1.0, nan, inf, -inf, 1e-40, 1e-10, 0.005, 1e-300),
        "top_p": (1.5, -0.5, nan, 1.0000001),
        "top_k": (-2, -100, -3),
        "head_k": (9, 1000, 20),
        "stop_token_ids": ([vocab], [-1], [2**31 - 1], [1, vocab + 5]),
    }
    for key, values in bad_values.items():
        for value in values:
            t.rpc("generate: bad params", gen({key: value}), ("INVALID_ARGUMENT",))
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
    gen_req = pb.GenerateRequest(
        prompts=[pb.Prompt(token_ids=[1, 2])], params=pb.SamplingParams(n=1, max_tokens=2)
    )
    commit = [pb.WeightMessage(commit=pb.Commit())]
    load_req = pb.LoadWeightsRequest(path="/", version=99)
    calls = (  # every RPC, with metadata md
        lambda md: stub.Info(pb.InfoRequest(), timeout=10, metadata=md),
        lambda md: list(stub.Generate(gen_req, timeout=10, metadata=md)),
        lambda md: stub.PushWeights(iter(commit), timeout=10, metadata=md),
        lambda md: stub.LoadWeights(load_req, timeout=10, metadata=md),
    )
    for a in auths:
        md = None if a is None else (("authorization", a),)
        for call in calls:
            t.rpc("bad auth", functools.partial(call, md), ("UNAUTHENTICATED",))
    chan.close()
    # garbage serialized as requests (the server's deserializer sees random bytes)
    rng = np.random.default_rng(cfg.seed)
    raw_chan = grpc.insecure_channel(address)
    ident = lambda b: b  # noqa: E731
    raw = {"request_serializer": ident, "response_deserializer": ident}
    raw_gen = raw_chan.unary_stream("/dlc_jax.sampler.v1.Sampler/Generate", **raw)
    raw_info = raw_chan.unary_unary("/dlc_jax.sampler.v1.Sampler/Info", **raw)
    md = client._md()
    for n in (1, 2, 3, 7, 64, 255, 1000, 4096, 100_000):
        junk = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        t.rpc("garbage request bytes", lambda j=junk: list(raw_gen(j, timeout=10, metadata=md)))
    t.rpc("garbage request bytes", lambda: raw_info(b"\xff" * 50, timeout=10, metadata=md))
    raw_chan.close()
    # garbage on the wire (no answer expected; the server must just survive)
    host, port = address.rsplit(":", 1)
    wire = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1, 16, 200, 5000, 70000)]
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # HTTP/2 connection preface
    wire += [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        preface + b"\xff" * 100,
        preface + struct.pack(">I", 0xFFFFFF)[1:] + b"\x00\x00\x00\x00\x01",
        b"PRI * HTTP/2.0\r\n",
        b"",
    ]
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
    for name, to, messages in (("gRPC", int(port), wire), ("data", data_port, dwire)):
        for w in messages:
            send_raw(host, to, w)
            t.record(f"garbage on the {name} port", "CLOSED", "", ())


def send_raw(host: str, port: int, data: bytes) -> None:
    """Send ``data`` on a new connection, then wait up to 1 s for an answer (errors ignored)."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=5) as s:
        if data:
            s.sendall(data)
        s.settimeout(1.0)
        s.recv(4096)
