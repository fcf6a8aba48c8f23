"""Receiving one weight push after its header, within the idle timeout and the deadline: chunks
written on the I/O thread (one in flight), the data socket claimed and read there. The caller owns
the stager (and discards it unless the returned directory was applied)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import pathlib
import socket

import grpc

from ..wire import chunk_wire
from . import data_plane
from .sliced import SlicedStager
from .staging import PushError, WeightStager


def _too_long(cfg, extra: str = "") -> PushError:
    return PushError(
        grpc.StatusCode.ABORTED,
        f"push exceeded the maximum duration of {cfg.push_max_s:g}s{extra}; discarded",
    )


async def next_message(it, deadline: float, cfg, what: str):
    """The next stream message (None at its end) within the idle timeout and the push deadline
    (event-loop time); PushError(ABORTED) naming which limit was hit."""
    left = deadline - asyncio.get_running_loop().time()
    if left <= 0:
        raise _too_long(cfg)
    idle = cfg.push_idle_timeout_s
    try:
        return await asyncio.wait_for(it.__anext__(), min(idle, left))
    except StopAsyncIteration:
        return None
    except TimeoutError:
        if idle <= left:
            raise PushError(
                grpc.StatusCode.ABORTED,
                f"no message for {idle:g}s while waiting for {what} (push idle timeout); discarded",
            ) from None
        raise _too_long(cfg) from None


async def claim_data(listener: data_plane.DataPlaneListener | None, push_id: str, wait: float):
    """The authenticated data connection for `push_id`, or PushError."""
    if listener is None:
        raise PushError.precondition(
            "push asks for the socket data plane but this server has no data port "
            "(start it with --push-data-port / ServerConfig.data_port; never offered with TLS)"
        )
    if len(push_id) != data_plane.PUSH_ID_LEN:
        raise PushError.invalid(
            f"header.data_push_id must be {data_plane.PUSH_ID_LEN} chars for the socket data plane"
        )
    conn = await asyncio.get_running_loop().run_in_executor(None, listener.claim, push_id, wait)
    if conn is None:
        raise PushError.precondition(
            f"no data connection for push id {push_id[:8]}.. within {wait}s "
            "(not connected, wrong push id, or missing/wrong token in its preamble)"
        )
    return conn


async def receive(
    stager: WeightStager,
    header,
    it,
    deadline: float,
    cfg,
    io_pool: concurrent.futures.Executor,
    listener: data_plane.DataPlaneListener | None,
    after_header=None,
    on_commit=None,
) -> pathlib.Path | None:
    """Stage the push `header` announces from the rest of `it` -> the committed directory.
    `after_header()` runs once the header passed; `on_commit` replaces `stager.commit`."""
    loop = asyncio.get_running_loop()
    writing: asyncio.Future | None = None  # the previous chunk's checksum + file write
    reading: asyncio.Future | None = None  # socket data plane: the reader of the raw bytes
    conn = None
    push_id = header.data_push_id
    try:
        stager.header(header)
        if after_header is not None:
            after_header()
        if stager.data_plane == "socket":
            conn = await claim_data(listener, push_id, cfg.data_wait_s)
            conn.settimeout(cfg.push_idle_timeout_s)  # a stalled data socket fails the push
            reading = loop.run_in_executor(io_pool, stager.read_socket, conn)
        while True:
            msg = await next_message(it, deadline, cfg, "the next chunk or Commit")
            if msg is None:
                break
            if writing is not None:  # one chunk in flight: ordered, host memory ~ 2 chunks
                await writing
                writing = None
            if reading is not None and reading.done():
                reading.result()  # a failed data socket / checksum rejects the push now
            if isinstance(msg, chunk_wire.RawChunk):  # checksum + copy overlap the next receive
                writing = loop.run_in_executor(io_pool, stager.chunk, msg)
                continue
            kind = msg.WhichOneof("kind")
            if kind == "header":
                raise PushError.invalid("second header in one push")
            elif kind == "chunk":
                stager.chunk(msg.chunk)
            elif kind == "done":
                stager.done(msg.done)
            elif kind == "slice":  # a part of a sliced push (`sliced.SlicedStager`)
                if not isinstance(stager, SlicedStager):
                    raise PushError.invalid("WeightSlice in a push whose header has no push_parts")
                stager.slice(msg.slice)
            elif kind == "commit":
                if reading is not None:
                    stager.end_data()  # a sliced part's reader stops after the announced slices
                    left = max(deadline - loop.time(), 0.001)
                    try:
                        await asyncio.wait_for(asyncio.shield(reading), left)
                    except TimeoutError:
                        raise _too_long(cfg, " waiting for its data socket") from None
                if writing is not None:
                    await writing
                    writing = None
                return await loop.run_in_executor(io_pool, on_commit or stager.commit)
            else:
                raise PushError.invalid("WeightMessage with no field set")
        if writing is not None:  # its error (if any) is the reason to report
            await writing
            writing = None
        raise PushError(grpc.StatusCode.ABORTED, "stream ended before Commit; push discarded")
    finally:
        if writing is not None:  # stream ended/cancelled with a write in flight: let it finish
            with contextlib.suppress(Exception):  # the push is discarded by the caller anyway
                await asyncio.shield(writing)
        stager.end_data()  # stops a sliced part's reader waiting for the next announced slice
        if conn is not None:  # stops a reader still blocked on the data socket
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        elif push_id and listener is not None:
            listener.drop(push_id)
        if reading is not None:
            with contextlib.suppress(Exception):  # the push is discarded by the caller anyway
                await asyncio.shield(reading)
