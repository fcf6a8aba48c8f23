"""The client side of a weight push, apart from the gRPC call: the `WeightMessage` stream."""

from __future__ import annotations

import collections.abc as cabc
import contextlib
import dataclasses
import hashlib
import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import crc32c
import numpy as np

from ..wire import chunk_wire
from ..wire import safetensors_io as st
from ..wire import sampler_pb2 as pb


@dataclasses.dataclass(frozen=True)
class TensorSource:
    """open(): a fresh iterator of (name, array); names_shapes: every tensor in header order;
    reiterable: open() may be called again (a failed push can be retried)."""

    open: Callable[[], Iterator]
    names_shapes: list[tuple[str, tuple[int, ...]]]
    reiterable: bool


def tensor_source(named_tensors, specs: cabc.Mapping[str, tuple[int, ...]] | None) -> TensorSource:
    """A Mapping name -> array, a Sequence of (name, array), a zero-argument callable returning an
    iterator of (name, array), or a one-shot iterator together with ``specs`` ({name: shape})."""
    if isinstance(named_tensors, (cabc.Mapping, cabc.Sequence)):
        pairs = named_tensors.items() if isinstance(named_tensors, cabc.Mapping) else named_tensors
        shapes = [(n, tuple(np.shape(a))) for n, a in pairs]
        return TensorSource(lambda: iter(pairs), shapes, True)
    if specs is not None:
        shapes = [(n, tuple(s)) for n, s in specs.items()]
        if callable(named_tensors):
            return TensorSource(named_tensors, shapes, True)
        it = iter(named_tensors)
        return TensorSource(lambda: it, shapes, False)
    if callable(named_tensors):
        # No specs: one extra pass to learn names and shapes (tensors are dropped right away).
        shapes = [(n, tuple(np.shape(a))) for n, a in named_tensors()]
        return TensorSource(named_tensors, shapes, True)
    raise TypeError(
        "push_weights: a one-shot iterator needs specs={name: shape} (the header lists all "
        "tensors first)"
    )


class VerifiedTensor(np.ndarray):
    """An array whose `checksum` (algorithm, value) is known: a relay forwards it unchecksummed."""

    checksum: tuple[str, int | str] | None = None


def with_checksum(arr: np.ndarray, algo: str, value: int | str) -> np.ndarray:
    """`arr` (no copy) marked with its known checksum (`VerifiedTensor`)."""
    v = arr.view(VerifiedTensor)
    v.checksum = (algo, value)
    return v


@dataclasses.dataclass(frozen=True)
class PreparedTensor:
    """A tensor ready to send: header index, converted array, its bytes and their checksum."""

    index: int
    array: np.ndarray
    buf: memoryview
    checksum: int | str


def prepared_tensors(
    source: Iterator, names_shapes: list[tuple[str, tuple[int, ...]]], dtype: str, checksum: str
) -> Iterator[PreparedTensor]:
    """Check, convert and checksum each (name, array) of `source`, in order."""
    np_dtype = st.NP_DTYPES[dtype]
    index = {n: i for i, (n, _) in enumerate(names_shapes)}
    seen: set[str] = set()
    for name, arr in source:
        if name not in index:
            raise ValueError(f"push_weights: tensor {name!r} is not in the header specs")
        if name in seen:
            raise ValueError(f"push_weights: tensor {name!r} yielded twice")
        seen.add(name)
        i = index[name]
        known = getattr(arr, "checksum", None) if isinstance(arr, VerifiedTensor) else None
        if known is not None and (arr.dtype != np_dtype or not arr.flags.c_contiguous):
            known = None  # converted or copied below: the bytes sent differ
        a, buf = as_sent(arr, np_dtype)
        if tuple(a.shape) != names_shapes[i][1]:
            raise ValueError(
                f"push_weights: tensor {name!r} has shape {a.shape}, "
                f"header says {names_shapes[i][1]}"
            )
        digest: int | str
        if known is not None and known[0] == checksum:  # verified upstream over these bytes
            digest = known[1]
        else:
            digest = hashlib.sha256(buf).hexdigest() if checksum == "sha256" else crc32c.crc32c(buf)
        yield PreparedTensor(i, a, buf, digest)


def as_sent(arr, np_dtype: np.dtype) -> tuple[np.ndarray, memoryview]:
    """(`arr` in `np_dtype` and C order, copied only if needed; a zero-copy byte view of it)."""
    a = np.ascontiguousarray(np.asarray(arr).astype(np_dtype, copy=False))
    return a, a.reshape(-1).view(np.uint8).data


def weight_header(
    names_shapes: list[tuple[str, tuple[int, ...]]],
    version: int,
    dtype: str,
    checksum: str,
    *,
    socket_push_id: str | None = None,
    relay_to: Sequence[str] = (),
    relay_fanout: int = 1,
) -> pb.WeightHeader:
    """The header listing every tensor of a push; `socket_push_id`: its bytes come on the socket
    data plane (None: in chunks); `relay_to` / `relay_fanout`: where the receiver forwards it."""
    itemsize = st.NP_DTYPES[dtype].itemsize
    header = pb.WeightHeader(version=int(version), dtype=dtype, checksum=checksum)
    for n, shape in names_shapes:
        nb = int(np.prod(shape, dtype=np.int64)) * itemsize
        header.tensors.append(pb.TensorSpec(name=n, shape=list(shape), dtype=dtype, nbytes=nb))
    if socket_push_id is not None:
        header.data_plane, header.data_push_id = "socket", socket_push_id
    if relay_to:
        header.relay_to.extend(relay_to)
        header.relay_fanout = int(relay_fanout)
    return header


class TensorSender:
    """How a push's tensor bytes leave: chunk messages of `chunk_bytes`, or `send_data(tensor_index,
    bytes)` (the socket data plane); `on_sent(n)` once n bytes are handed to the transport."""

    def __init__(self, chunk_bytes: int, send_data=None, on_sent=None):
        self.chunk_bytes, self.send_data, self.on_sent = chunk_bytes, send_data, on_sent
        self.data_failed = False

    def messages(self, i: int, buf: memoryview, done: pb.TensorDone) -> Iterator:
        """Tensor (or slice) `i`'s bytes `buf`, then its trailer `done`."""
        if self.send_data is None:
            for off in range(0, len(buf), self.chunk_bytes):
                yield chunk_wire.encode_chunk(i, off, buf[off : off + self.chunk_bytes])
        elif not self.data_failed:
            try:
                self.send_data(i, buf)
            except OSError:  # keep the control stream going: the server says why it rejects
                self.data_failed = True
        if self.on_sent is not None and not self.data_failed:
            self.on_sent(len(buf))
        yield pb.WeightMessage(done=done)


def weight_messages(
    source: Iterator,
    names_shapes: list[tuple[str, tuple[int, ...]]],
    version: int,
    dtype: str,
    chunk_bytes: int,
    checksum: str,
    send_data: Callable[[int, memoryview], None] | None = None,
    push_id: str = "",
    prefetch: int = 1,
    relay_to: tuple[str, ...] = (),
    relay_fanout: int = 1,
    on_sent: Callable[[int], None] | None = None,
) -> Iterator:
    """The PushWeights request stream (arguments as in `TensorSender` and `weight_header`);
    ``prefetch``: tensors made ready ahead in a background thread (0: none)."""
    socket_id = push_id if send_data is not None else None
    header = weight_header(
        names_shapes, version, dtype, checksum, socket_push_id=socket_id,
        relay_to=relay_to, relay_fanout=relay_fanout,
    )  # fmt: skip
    ready = prepared_tensors(source, names_shapes, dtype, checksum)
    if prefetch > 0:
        ready = prefetched(ready, depth=prefetch)
    yield pb.WeightMessage(header=header)
    out = TensorSender(chunk_bytes, send_data, on_sent)
    sent: set[int] = set()
    for t in ready:
        done = pb.TensorDone(tensor_index=t.index, **{checksum: t.checksum})  # sha256 / crc32c
        yield from out.messages(t.index, t.buf, done)
        sent.add(t.index)
        del t
    missing = [n for i, (n, _) in enumerate(names_shapes) if i not in sent]
    if missing:
        raise ValueError(f"push_weights: source ended without tensors {missing[:3]}")
    yield pb.WeightMessage(commit=pb.Commit())


def put_unless(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put `item` into the bounded `q` unless `stop` is set first; -> whether it went in."""
    while not stop.is_set():
        with contextlib.suppress(queue.Full):
            q.put(item, timeout=0.1)
            return True
    return False


def prefetched(items: Iterator, depth: int = 1) -> Iterator:
    """Iterate `items` with the next `depth` produced ahead in a background thread; errors
    re-raise in the consumer, and a consumer that stops early stops the producer."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce():
        try:
            for x in items:
                if not put_unless(q, (True, x), stop):
                    return
            q.put((True, end))
        except BaseException as e:  # handed to the consumer
            q.put((False, e))

    t = threading.Thread(target=produce, name="push-prefetch", daemon=True)
    t.start()
    try:
        while True:
            ok, x = q.get()
            if not ok:
                raise x
            if x is end:
                return
            yield x
    finally:
        stop.set()
