"""Sliced push parts over the socket data plane (`sliced_push.SlicedStager.read_socket`): the
stream announces each slice and carries its trailer, the slice's bytes come on the part's data
connection. Parts on the socket and on gRPC chunks assemble the tensors exactly; a corrupted, cut,
NaN or trailer-less slice on the socket is refused before it reaches the staged tensor or the
engine's load, and the group is never applied."""

from __future__ import annotations

import socket
import threading

import crc32c
import numpy as np
import pytest
from slice_helpers import SHAPES, slice_weights, two_senders

from dlc_jax.sampler.push.slice_stream import part_messages
from dlc_jax.sampler.push.sliced import SlicedStager
from dlc_jax.sampler.push.weight_checks import PushError
from dlc_jax.sampler.wire import chunk_wire
from dlc_jax.sampler.wire import sampler_pb2 as pb


class RecordingLoad:
    def __init__(self):
        self.got: dict[str, np.ndarray] = {}

    def add(self, name, array):
        self.got[name] = np.array(array)


def _stager(tmp_path, load):
    expected = {n: (s, "float32") for n, s in SHAPES.items()}
    return SlicedStager(expected, 0, str(tmp_path), memory=True, load=load)


def _feed(s: SlicedStager, slices, part: int, *, socket_plane: bool, spoil=None) -> None:
    """Send part `part` of a 2-part group into `s` as the server's push path would: control
    messages in stream order; on the socket plane the bytes `part_messages` hands to `send_data`
    go through a socketpair (`spoil(bytes) -> bytes` may change them) and `read_socket` reads
    them after the part's Commit (end_data)."""
    sent: list[bytes] = []
    stream = part_messages(
        slices,
        list(SHAPES.items()),
        1,
        "float32",
        group="g",
        part=part,
        parts=2,
        chunk_bytes=1000,
        send_data=(lambda i, buf: sent.append(bytes(buf))) if socket_plane else None,
        push_id="0" * 32 if socket_plane else "",
    )
    dones = 0
    for raw in stream:
        m = chunk_wire.decode_weight_message(raw) if isinstance(raw, bytes) else raw
        if isinstance(m, chunk_wire.RawChunk):
            s.chunk(m)
            continue
        kind = m.WhichOneof("kind")
        if kind == "header":
            s.header(m.header)
            assert s.data_plane == ("socket" if socket_plane else "grpc")
        elif kind == "slice":
            s.slice(m.slice)
        elif kind == "done":
            dones += 1
            if spoil is _no_trailer and dones == len(slices):  # the last slice's is left out
                continue
            s.done(m.done)
        elif kind == "commit" and socket_plane:
            payload = b"".join(sent)
            _read(s, spoil(payload) if spoil is not None else payload)
            s.end_part()
        elif kind == "commit":
            s.end_part()


def _read(s: SlicedStager, payload: bytes) -> None:
    """The part's data connection carrying `payload`, read after its Commit (end_data)."""
    a, b = socket.socketpair()

    def send():
        a.sendall(payload)
        a.close()

    t = threading.Thread(target=send)
    t.start()
    try:
        s.end_data()
        s.read_socket(b, piece=512)
    finally:
        t.join()
        b.close()


def test_socket_and_grpc_parts_assemble_every_tensor(tmp_path):
    w, load = slice_weights(1), RecordingLoad()
    s = _stager(tmp_path, load)
    p0, p1 = two_senders(w)
    _feed(s, p0, 0, socket_plane=True)
    assert load.got == {}  # no tensor is complete from one part
    _feed(s, p1, 1, socket_plane=False)
    s.apply()
    assert s.bytes_received == sum(a.nbytes for a in w.values())
    assert sorted(load.got) == sorted(w)
    for n, a in w.items():
        np.testing.assert_array_equal(load.got[n], a)
    s.discard()


def _flip(payload: bytes) -> bytes:
    b = bytearray(payload)
    b[len(b) // 2] ^= 0x10
    return bytes(b)


def _cut(payload: bytes) -> bytes:
    return payload[: len(payload) - 100]


def _no_trailer(payload: bytes) -> bytes:
    return payload


@pytest.mark.parametrize(
    "spoil, why",
    [
        (_flip, "crc32c missing or mismatched"),
        (_cut, "data socket closed after"),
        ("nan", "NaN or Inf"),
        (_no_trailer, "without its TensorDone"),
    ],
)
def test_bad_socket_slices_are_refused_before_the_load(tmp_path, spoil, why):
    w, load = slice_weights(2), RecordingLoad()
    s = _stager(tmp_path, load)
    p0, p1 = two_senders(w)
    _feed(s, p0, 0, socket_plane=False)
    if spoil == "nan":  # a valid checksum over NaN values
        n, start, stop, arr = p1[2]
        p1[2] = (n, start, stop, np.full_like(arr, np.nan))
        spoil = None
    with pytest.raises(PushError, match=why):
        _feed(s, p1, 1, socket_plane=True, spoil=spoil)
    # whatever did not verify never reached the staged tensor's load; the group is incomplete
    assert "b.weight" not in load.got
    with pytest.raises(PushError):
        s.apply()
    s.discard()


def test_a_part_failed_mid_stream_stops_its_reader(tmp_path):
    """The push path calls end_data when a part's stream fails: a reader waiting for the next
    announced slice returns instead of hanging."""
    s = _stager(tmp_path, RecordingLoad())
    msgs = part_messages([], list(SHAPES.items()), 1, "float32", group="g", part=0, parts=2,
                         send_data=lambda i, b: None, push_id="1" * 32)  # fmt: skip
    s.header(next(msgs).header)
    a, b = socket.socketpair()
    t = threading.Thread(target=s.read_socket, args=(b,))
    t.start()
    s.end_data()
    t.join(5)
    assert not t.is_alive()
    a.close()
    b.close()
    s.discard()


def test_chunks_are_refused_in_a_socket_part(tmp_path):
    s = _stager(tmp_path, RecordingLoad())
    msgs = iter(part_messages(two_senders(slice_weights())[0], list(SHAPES.items()), 1, "float32",
                              group="g", part=0, parts=2, send_data=lambda i, b: None,
                              push_id="2" * 32))  # fmt: skip
    s.header(next(msgs).header)
    s.slice(next(msgs).slice)
    raw = chunk_wire.decode_weight_message(chunk_wire.encode_chunk(0, 0, b"\0" * 8))
    with pytest.raises(PushError, match="socket data plane"):
        s.chunk(raw)
    s.end_data()
    s.discard()


def test_trailer_crc_is_of_the_slice_bytes():
    """The sender's trailer covers exactly the bytes it hands to the data connection."""
    w = slice_weights(3)
    sent: list[bytes] = []
    msgs = list(part_messages(two_senders(w)[0], list(SHAPES.items()), 1, "float32", group="g",
                              part=0, parts=2, send_data=lambda i, b: sent.append(bytes(b)),
                              push_id="3" * 32))  # fmt: skip
    dones = [m.done for m in msgs if isinstance(m, pb.WeightMessage) and m.HasField("done")]
    assert [d.crc32c for d in dones] == [crc32c.crc32c(b) for b in sent]
    assert not any(isinstance(m, bytes) for m in msgs)  # no chunk messages on the socket plane
