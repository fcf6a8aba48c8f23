"""Sliced multi-sender pushes (`sliced_push` / `slice_stream`) against an in-process gRPC server
with a recording transport-only backend: parts from several "senders" assemble into the served
tensors; slices that do not tile a tensor (gap, overlap, out of bounds), a corrupted slice, a
missing part or a part of a failed group are refused and the old weights keep serving."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from slice_helpers import SHAPES, slice_weights, two_senders

from dlc_jax.bench.sampler_bench import TransportOnlyBackend
from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.push.slice_stream import commit_messages, part_messages
from dlc_jax.sampler.service.server import ServerConfig, ServerThread
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire import sampler_pb2 as pb


class RecordingBackend(TransportOnlyBackend):
    async def apply_weights(self, weights_dir, version):
        self.weights = dict(st.iter_tensors(weights_dir))
        self.version = int(version)


NAMES_SHAPES = list(SHAPES.items())


@pytest.fixture(params=["memory", "file"])
def served(request, tmp_path):
    backend = RecordingBackend({n: (s, "float32") for n, s in SHAPES.items()}, 100)
    backend.staging = request.param
    cfg = ServerConfig(
        staging_root=str(tmp_path / "stage"), push_staging=request.param, data_port=0
    )
    srv = ServerThread(backend, cfg).start()
    c = SamplerClient(srv.address, timeout=30)
    assert c.push_weights(slice_weights(1), 1).ok  # version 1 serves
    yield c, backend, tmp_path / "stage"
    c.close()
    srv.stop()


def _push(c, parts, version, group="g", chunk_bytes=1000, planes=None):
    """Send every part (over `planes[p]`: "grpc" chunks or the "socket" data plane), then the
    group commit; -> (part results, commit result)."""
    outs = []
    for p, s in enumerate(parts):

        def stream(send_data=None, push_id="", s=s, p=p):
            return part_messages(
                s,
                NAMES_SHAPES,
                version,
                "float32",
                group=group,
                part=p,
                parts=len(parts),
                chunk_bytes=chunk_bytes,
                send_data=send_data,
                push_id=push_id,
            )

        socket_plane = planes is not None and planes[p] == "socket"
        outs.append(c.push_with_data(stream) if socket_plane else c.push_messages(stream()))
    return outs, c.push_messages(commit_messages(version, group, len(parts)))


def _old_weights_serve(c, backend, stage):
    assert backend.version == 1 and c.info()["version"] == 1
    for n, a in slice_weights(1).items():
        np.testing.assert_array_equal(backend.weights[n], a)
    # the serving push stays staged (memory staging: plus at most one warm buffer, warm_staging)
    dirs = [d.name for d in stage.iterdir()]
    assert sum("_v1_" in d for d in dirs) == 1
    assert len(dirs) <= (2 if backend.staging == "memory" else 1)


def test_parts_assemble_the_tensors(served):
    c, backend, stage = served
    w = slice_weights(2)
    outs, commit = _push(c, two_senders(w), 2)
    assert all(r.ok and r.version == 1 for r in outs), [r.message for r in outs]
    assert sum(r.bytes for r in outs) == sum(a.nbytes for a in w.values())
    assert commit.ok and commit.version == 2, commit.message
    for n, a in w.items():
        np.testing.assert_array_equal(backend.weights[n], a)
    # the serving group's staging, plus (memory staging) v1's buffer kept warm (warm_staging)
    assert len(list(stage.iterdir())) == (2 if backend.staging == "memory" else 1)


def _gap(parts):
    parts[1] = [x for x in parts[1] if x[0] != "b.weight"]


def _overlap(parts):
    n, _, stop, arr = parts[1][2]
    parts[1][2] = (n, (499,), stop, np.concatenate([arr[:1], arr]))


def _out_of_bounds(parts):
    n, start, _, arr = parts[1][1]
    parts[1][1] = (n, start, (65, 33), np.concatenate([arr, arr[:1]]))


def _corrupt(parts):
    n, start, stop, arr = parts[0][0]
    parts[0][0] = (n, start, stop, np.full_like(arr, np.nan))


@pytest.mark.parametrize(
    "spoil, at_commit",
    [(_gap, True), (_overlap, False), (_out_of_bounds, False), (_corrupt, False)],
)
def test_bad_slices_are_refused_and_old_weights_serve(served, spoil, at_commit):
    c, backend, stage = served
    parts = two_senders(slice_weights(2))
    spoil(parts)
    outs, commit = _push(c, parts, 2)
    assert all(r.ok for r in outs) == at_commit, [r.message for r in outs]
    assert not commit.ok
    _old_weights_serve(c, backend, stage)
    outs, commit = _push(c, two_senders(slice_weights(3)), 2, group="again")  # the next push works
    assert commit.ok and backend.version == 2, commit.message
    np.testing.assert_array_equal(backend.weights["c.bias"], slice_weights(3)["c.bias"])


def test_missing_part_and_parts_of_failed_group_are_refused(served):
    c, backend, stage = served
    p0, p1 = two_senders(slice_weights(2))
    kw = dict(group="g", parts=2)
    assert c.push_messages(part_messages(p0, NAMES_SHAPES, 2, "float32", part=0, **kw)).ok
    r = c.push_messages(commit_messages(2, "g", 2))  # part 1 never sent
    assert not r.ok and "parts [1] of 2 did not arrive" in r.message
    _old_weights_serve(c, backend, stage)
    # the group was discarded: its late part is refused too
    r = c.push_messages(part_messages(p1, NAMES_SHAPES, 2, "float32", part=1, **kw))
    assert not r.ok and "discarded" in r.message
    # a part whose header differs from the group's first part
    kw = dict(group="h", parts=2)
    assert c.push_messages(part_messages(p0, NAMES_SHAPES, 2, "float32", part=0, **kw)).ok
    r = c.push_messages(part_messages(p1, NAMES_SHAPES, 3, "float32", part=1, **kw))
    assert not r.ok and "differs" in r.message
    assert not c.push_messages(commit_messages(2, "h", 2)).ok
    _old_weights_serve(c, backend, stage)


def test_slices_need_a_sliced_header(served):
    c, backend, stage = served
    part0 = two_senders(slice_weights(2))[0]
    msgs = list(part_messages(part0, NAMES_SHAPES, 2, "float32", group="g", part=0, parts=1))
    h = pb.WeightHeader()
    h.CopyFrom(msgs[0].header)
    h.push_parts, h.push_group = 0, ""
    r = c.push_messages([pb.WeightMessage(header=h)] + msgs[1:])
    assert not r.ok and "no push_parts" in r.message
    _old_weights_serve(c, backend, stage)


def test_socket_parts_assemble_the_tensors(served):
    """A part's slices over the socket data plane, next to a part as gRPC chunks."""
    c, backend, stage = served
    w = slice_weights(2)
    outs, commit = _push(c, two_senders(w), 2, planes=("socket", "grpc"))
    assert all(r.ok for r in outs), [r.message for r in outs]
    assert [r.bytes for r in outs] == [sum(x[3].nbytes for x in p) for p in two_senders(w)]
    assert commit.ok and commit.version == 2, commit.message
    for n, a in w.items():
        np.testing.assert_array_equal(backend.weights[n], a)


def test_hostile_socket_slices_leave_the_old_weights(served, monkeypatch):
    """A flipped byte or a data connection cut mid-slice: the part is refused, the group is not
    applied, the old weights serve; then a clean all-socket push works."""
    c, backend, stage = served

    def corrupt(sock, i, buf):
        b = bytearray(buf)
        b[len(b) // 2] ^= 0x01
        sock.sendall(b)

    def cut(sock, i, buf):
        sock.sendall(buf[: len(buf) // 2])
        sock.shutdown(socket.SHUT_RDWR)

    for spoil, why in ((corrupt, "mismatch"), (cut, "closed after")):
        monkeypatch.setattr(c, "_send_data", spoil)
        outs, commit = _push(
            c, two_senders(slice_weights(2)), 2, group=why, planes=("grpc", "socket")
        )
        monkeypatch.undo()
        assert outs[0].ok and not outs[1].ok and why in outs[1].message, outs[1].message
        assert not commit.ok
        _old_weights_serve(c, backend, stage)
    w = slice_weights(3)
    outs, commit = _push(c, two_senders(w), 2, group="clean", planes=("socket", "socket"))
    assert commit.ok and backend.version == 2, commit.message
    for n, a in w.items():
        np.testing.assert_array_equal(backend.weights[n], a)


@pytest.fixture
def chain(tmp_path):
    """Three samplers serving version 1 (memory staging, data ports): the head and two to relay
    to."""
    made = []
    for k in range(3):
        backend = RecordingBackend({n: (s, "float32") for n, s in SHAPES.items()}, 100)
        backend.staging = "memory"
        cfg = ServerConfig(staging_root=str(tmp_path / f"stage{k}"), data_port=0)
        srv = ServerThread(backend, cfg).start()
        c = SamplerClient(srv.address, timeout=30)
        assert c.push_weights(slice_weights(1), 1).ok
        made.append((srv, c, backend))
    yield made
    for srv, c, _ in made:
        c.close()
        srv.stop()


def _relay_push(c, parts, version, relay_to, group):
    outs = [
        c.push_with_data(
            lambda send_data, push_id, s=s, p=p: part_messages(
                s, NAMES_SHAPES, version, "float32", group=group, part=p, parts=len(parts),
                chunk_bytes=1000, send_data=send_data, push_id=push_id, relay_to=relay_to,
            )
        )
        for p, s in enumerate(parts)
    ]  # fmt: skip
    return outs, c.push_messages(commit_messages(version, group, len(parts)))


def test_sliced_group_relayed_along_a_chain(chain):
    """The head assembles the group and forwards each complete tensor to the others (a chain);
    they commit with the group. A group that fails at the head reaches none of them; a dead hop
    is reported and cuts the rest of the chain, the head still applies."""
    (_, head, hb), (srv1, _, b1), (_, _, b2) = chain
    addrs = [srv1.address, chain[2][0].address]
    w = slice_weights(2)
    outs, commit = _relay_push(head, two_senders(w), 2, addrs, "r")
    assert all(r.ok for r in outs) and commit.ok, (commit.message, [r.message for r in outs])
    assert sorted(commit.relayed) == sorted(addrs) and all(r.ok for r in commit.relayed.values())
    for b in (hb, b1, b2):
        assert b.version == 2
        for n, a in w.items():
            np.testing.assert_array_equal(b.weights[n], a)
    parts = two_senders(slice_weights(3))
    _gap(parts)  # the group never completes at the head: the relay is cut
    outs, commit = _relay_push(head, parts, 3, addrs, "bad")
    assert not commit.ok
    assert (hb.version, b1.version, b2.version) == (2, 2, 2)
    np.testing.assert_array_equal(b2.weights["a.weight"], w["a.weight"])
    srv1.stop()  # a dead hop
    outs, commit = _relay_push(head, two_senders(slice_weights(4)), 4, addrs, "hop")
    assert commit.ok and hb.version == 4, commit.message
    assert not commit.relayed[addrs[0]].ok and addrs[1] not in commit.relayed
    assert b2.version == 2
