"""Sampler soak, push attacks: silent, stalled, trickling, partial, cut, oversized, out-of-order,
NaN/Inf, wrong dtype / shape / name / checksum / version pushes, socket-plane and relay tricks, and
LoadWeights escapes (outside the root, symlinks, NaN, int32, a 1 TB header, /etc); each must be
refused with its status code while the served weights stay unchanged (`probe`)."""

from __future__ import annotations

import functools
import shutil
import struct
import tempfile
import time
from pathlib import Path

import numpy as np

from .harness import Tally, perturbed, push_stream

# the status codes an attack must get
ABORTED, INVALID, DATA_LOSS = ("ABORTED",), ("INVALID_ARGUMENT",), ("DATA_LOSS",)
STALE = ("FAILED_PRECONDITION",)


def all_int32(h) -> None:
    for spec in h.tensors:
        spec.dtype = "int32"


def socket_plane_without_connection(h) -> None:
    h.data_plane = "socket"
    h.data_push_id = "a" * 32


def push_attacks(t: Tally, client, weights: dict, load_root: Path, probe, v: int) -> None:
    from dlc_jax.sampler.wire import sampler_pb2 as pb

    good = perturbed(weights, 99)
    names = list(good)

    def messages(gen_fn):
        return lambda: client.push_messages(gen_fn())

    def silent():
        time.sleep(2.5)
        return
        yield

    def stalled():
        yield next(push_stream(good, v + 1))
        time.sleep(2.5)

    def trickle():
        s = push_stream(good, v + 1, chunk=64)
        yield next(s)
        for m in s:
            time.sleep(0.5)
            yield m

    def mut_chunk(fn):
        return messages(
            lambda: push_stream(good, v + 1, mutate=lambda k, m: fn(m) if k == "chunk" else m)
        )

    def bad_header(fn):
        def mutate(k, m):
            if k == "header":
                fn(m.header)
            return m

        return messages(lambda: push_stream(good, v + 1, mutate=mutate))

    def moved(m, tensor_index: int, offset: int):
        """The chunk ``m``'s data sent as tensor ``tensor_index`` at ``offset``."""
        c = pb.WeightChunk(tensor_index=tensor_index, offset=offset, data=m.chunk.data)
        return pb.WeightMessage(chunk=c)

    def flip(m):
        if m.chunk.tensor_index == 1 and m.chunk.offset == 0:
            d = bytearray(m.chunk.data)
            d[0] ^= 1
            return pb.WeightMessage(chunk=pb.WeightChunk(tensor_index=1, offset=0, data=bytes(d)))
        return m

    def oversize(m):
        if m.chunk.tensor_index == 0 and m.chunk.offset == 0:
            extra = pb.WeightChunk(tensor_index=0, offset=len(m.chunk.data), data=b"\0" * (1 << 20))
            return [m, pb.WeightMessage(chunk=extra)]
        return m

    def relayed_flip(k, m):  # a corrupt push that asks to be relayed: never forwarded whole
        if k == "header":
            m.header.relay_to.append("127.0.0.1:9")
            return m
        return flip(m) if k == "chunk" else m

    nan = {k: np.full(a.shape, np.nan, np.float32) for k, a in weights.items()}
    inf1 = perturbed(weights, 5)
    inf1[names[-1]].reshape(-1)[0] = np.inf
    attacks = {
        "silent stream": (messages(silent), ABORTED),
        "stalled after header": (messages(stalled), ABORTED),
        "trickle past max duration": (messages(trickle), ABORTED),
        "partial (no commit)": (messages(lambda: push_stream(good, v + 1, commit=False)), ABORTED),
        "flipped bit, valid length": (mut_chunk(flip), DATA_LOSS),
        "oversized tensor": (mut_chunk(oversize), INVALID),
        "chunk out of order": (
            mut_chunk(lambda m: moved(m, m.chunk.tensor_index, m.chunk.offset + 4)),
            INVALID,
        ),
        "tensor index out of range": (mut_chunk(lambda m: moved(m, 10_000, 0)), INVALID),
        "all NaN, valid checksums": (lambda: client.push_weights(nan, v + 1), INVALID),
        "one Inf (bf16, socket)": (
            lambda: client.push_weights(inf1, v + 1, dtype="bfloat16", transport="socket"),
            INVALID,
        ),
        "wrong dtype int32": (bad_header(all_int32), INVALID),
        "wrong shape": (
            bad_header(lambda h: h.tensors[0].shape.__setitem__(0, h.tensors[0].shape[0] + 1)),
            INVALID,
        ),
        "unknown name": (
            bad_header(lambda h: setattr(h.tensors[0], "name", "model.evil.weight")),
            INVALID,
        ),
        "missing tensor": (bad_header(lambda h: h.tensors.pop()), INVALID),
        "wrong sha256 in header": (
            bad_header(lambda h: setattr(h.tensors[0], "sha256", "0" * 64)),
            DATA_LOSS,
        ),
        "unknown checksum": (bad_header(lambda h: setattr(h, "checksum", "md5")), INVALID),
        "stale version": (lambda: client.push_weights(good, v), STALE),
        "no header first": (
            messages(lambda: iter([pb.WeightMessage(commit=pb.Commit())])),
            INVALID,
        ),
        "empty message": (messages(lambda: iter([pb.WeightMessage()])), INVALID),
        "socket plane, no data connection": (
            bad_header(socket_plane_without_connection),
            ("FAILED_PRECONDITION", "INVALID_ARGUMENT"),
        ),
        "garbage message bytes": (
            messages(lambda: iter([b"\x0a\xff\xff\xff\xff\x0f" + b"x" * 10])),
            (),
        ),
        "relay: flipped bit, forwarded to a dead hop": (
            messages(lambda: push_stream(good, v + 1, mutate=relayed_flip)),
            DATA_LOSS,
        ),
        "relay: 300 hops": (
            bad_header(lambda h: h.relay_to.extend(f"127.0.0.1:{i + 1}" for i in range(300))),
            INVALID,
        ),
        "relay: the same hop twice": (
            bad_header(lambda h: h.relay_to.extend(["127.0.0.1:9", "127.0.0.1:9"])),
            INVALID,
        ),
    }
    outside = Path(tempfile.mkdtemp(prefix="soak_outside_"))
    try:
        from dlc_jax.sampler.wire import safetensors_io as st

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
        for name, path, code in (
            ("outside root", outside, "FAILED_PRECONDITION"),
            ("symlink escape", load_root / "escape", "FAILED_PRECONDITION"),
            ("NaN values", load_root / "nan", "INVALID_ARGUMENT"),
            ("int32 zeros", load_root / "int32", "INVALID_ARGUMENT"),
            ("1 TB header", load_root / "huge", "INVALID_ARGUMENT"),
            ("/etc", "/etc", "FAILED_PRECONDITION"),
        ):
            load = functools.partial(client.load_weights, str(path), v + 1)
            attacks[f"load: {name}"] = (load, (code,))
        for name, (fn, codes) in attacks.items():
            t.rpc(f"push attack: {name}", fn, codes)
            probe(f"after push attack {name!r}")
    finally:
        shutil.rmtree(outside, ignore_errors=True)
