"""Warm staging buffers (`warm_staging.WarmStaging`): a memory-mode push is received into the
mapped staging file of a superseded push of the same size; what it stages and loads is exactly the
new push (nothing of the old bytes survives), a failed push leaves nothing loaded and gives its
buffer back, and buffers of another size or beyond `keep` are deleted."""

from __future__ import annotations

import crc32c
import grpc
import numpy as np
import pytest

from dlc_jax.sampler.push.staging import WeightStager
from dlc_jax.sampler.push.warm_staging import WarmStaging
from dlc_jax.sampler.push.weight_checks import PushError
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire import sampler_pb2 as pb

SHAPES = {"a.weight": (64, 33), "b.weight": (1000,)}
EXPECTED = {n: (s, "float32") for n, s in SHAPES.items()}


class Load:
    def __init__(self):
        self.got: dict[str, np.ndarray] = {}

    def add(self, name, array):
        self.got[name] = np.array(array)


def _weights(seed, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def _push(tmp_path, warm, w, version, flip=False, expected=EXPECTED):
    """One gRPC-chunk push into a memory stager on `warm`; -> (stager, load, dir or PushError)."""
    load = Load()
    s = WeightStager(expected, version - 1, str(tmp_path), memory=True, load=load, warm=warm)
    h = pb.WeightHeader(version=version, dtype="float32", checksum="crc32c")
    for n, a in w.items():
        h.tensors.append(
            pb.TensorSpec(name=n, shape=list(a.shape), dtype="float32", nbytes=a.nbytes)
        )
    s.header(h)
    try:
        for i, a in enumerate(w.values()):
            raw = bytearray(a.tobytes())
            if flip and i == 1:
                raw[3] ^= 1
            s.chunk(pb.WeightChunk(tensor_index=i, offset=0, data=bytes(raw)))
            s.done(pb.TensorDone(tensor_index=i, crc32c=crc32c.crc32c(a.tobytes())))
        return s, load, s.commit()
    except PushError as e:
        s.discard()
        return s, load, e


def _check(d, load, w):
    on_disk = dict(st.iter_tensors(d))
    for n, a in w.items():
        np.testing.assert_array_equal(on_disk[n], a)
        np.testing.assert_array_equal(load.got[n], a)


def test_next_push_reuses_the_superseded_buffer_and_stages_only_its_own_bytes(tmp_path):
    warm = WarmStaging()
    w1, w2, w3 = _weights(1), _weights(2), _weights(3)
    _, load1, d1 = _push(tmp_path, warm, w1, 1)
    _check(d1, load1, w1)
    _, load2, d2 = _push(tmp_path, warm, w2, 2)  # d1 still served: a new buffer
    assert d2 != d1 and warm.reused == 0
    assert warm.give_back(d1)  # v2 swapped in: v1's buffer is free
    _, load3, d3 = _push(tmp_path, warm, w3, 3)
    assert warm.reused == 1 and not d1.exists()  # received into v1's mapped file, renamed
    assert d3.name.startswith(d1.name.split("_v")[0] + "_v3_")
    _check(d3, load3, w3)  # every byte is v3's
    _check(d2, load2, w2)  # the served v2 untouched
    warm.close()
    assert not list(tmp_path.iterdir())


def test_failed_push_gives_its_buffer_back_and_loads_nothing_past_the_bad_tensor(tmp_path):
    warm = WarmStaging()
    _, _, d1 = _push(tmp_path, warm, _weights(1), 1)
    warm.give_back(d1)
    _, load, err = _push(tmp_path, warm, _weights(2), 2, flip=True)
    assert isinstance(err, PushError) and err.code == grpc.StatusCode.DATA_LOSS
    assert "b.weight" not in load.got
    w3 = _weights(3)
    _, load3, d3 = _push(tmp_path, warm, w3, 3)
    assert warm.reused == 2 and sorted(tmp_path.iterdir()) == [d3]  # the failed push's buffer
    _check(d3, load3, w3)
    warm.close()


def test_a_second_discard_leaves_the_given_back_buffer_alone(tmp_path):
    warm = WarmStaging()
    _, _, d1 = _push(tmp_path, warm, _weights(1), 1)
    warm.give_back(d1)
    s, _, err = _push(tmp_path, warm, _weights(2), 2, flip=True)  # discarded: buffer given back
    assert isinstance(err, PushError)
    s.discard()  # e.g. a group failing after the service discarded it
    w3 = _weights(3)
    _, load3, d3 = _push(tmp_path, warm, w3, 3)
    assert warm.reused == 2  # the buffer survived the second discard and was reused
    _check(d3, load3, w3)
    warm.close()


def test_other_sizes_and_buffers_beyond_keep_are_deleted(tmp_path):
    warm = WarmStaging(keep=1)
    _, _, d1 = _push(tmp_path, warm, _weights(1), 1)
    _, _, d2 = _push(tmp_path, warm, _weights(2), 2)
    assert warm.give_back(d1) and warm.give_back(d2)  # one kept free, one deleted
    assert sorted(p for p in tmp_path.iterdir()) == [d1]
    assert not warm.give_back(tmp_path / "not-a-buffer")
    small = {"a.weight": (8, 3), "b.weight": (10,)}
    exp = {n: (s, "float32") for n, s in small.items()}
    w = _weights(4, small)
    _, load, d3 = _push(tmp_path, warm, w, 3, expected=exp)  # another size: d1 deleted
    assert not d1.exists() and sorted(tmp_path.iterdir()) == [d3] and warm.reused == 0
    _check(d3, load, w)
    warm.close()
    assert not list(tmp_path.iterdir())


def test_warm_buffers_need_memory_staging(tmp_path):
    with pytest.raises(ValueError, match="memory=True"):
        WeightStager(EXPECTED, 0, str(tmp_path), warm=WarmStaging())


def test_staged_tensors_are_64_byte_aligned_and_valid_safetensors(tmp_path):
    """The layout pads the header so 64-byte multiples stay aligned (XLA reads them in place);
    the padded file still reads back with the safetensors library."""
    from safetensors.numpy import load_file

    w = {"x": np.arange(7, dtype=np.float32), "y": np.ones((16, 4), np.float32)}
    prefix, offsets = st.layout([(n, a.shape, "float32", a.nbytes) for n, a in w.items()])
    assert len(prefix) % 64 == 0 and offsets[0] == len(prefix)
    st.write_file(tmp_path / "m.safetensors", w)
    back = load_file(str(tmp_path / "m.safetensors"))
    for n, a in w.items():
        np.testing.assert_array_equal(back[n], a)


def test_stage_cpu_profile_reports_every_stage():
    """`dlc-jax bench weight_sync`'s per-stage CPU profile (no engine load here)."""
    from dlc_jax.bench.weight_sync_stages import stage_cpu

    rng = np.random.default_rng(0)
    cpu = stage_cpu({"w": rng.standard_normal((1024, 1024)).astype(np.float32)}, repeats=1)
    assert set(cpu) == {
        "send: CRC-32C",
        "send: socket",
        "recv: fresh staging map",
        "recv: warm staging map",
        "CRC-32C",
        "finite check",
    }
    assert all(np.isfinite(v) and v >= 0 for v in cpu.values())


def test_relay_forwards_the_verified_checksum_without_recomputing_it():
    """A tensor a relaying sampler verified carries its checksum to the onward push
    (`weight_stream.VerifiedTensor`); a dtype conversion or another algorithm recomputes it."""
    from dlc_jax.sampler.push.weight_stream import prepared_tensors, with_checksum

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    marked = with_checksum(a, "crc32c", 12345)  # not a's CRC: shows it was not recomputed
    specs = [("w", (3, 4))]
    (t,) = prepared_tensors(iter([("w", marked)]), specs, "float32", "crc32c")
    assert t.checksum == 12345 and np.shares_memory(t.array, a)
    (t,) = prepared_tensors(iter([("w", marked)]), specs, "bfloat16", "crc32c")
    assert t.checksum == crc32c.crc32c(t.buf)  # converted: its own CRC
    (t,) = prepared_tensors(iter([("w", marked)]), specs, "float32", "sha256")
    assert t.checksum != 12345 and len(str(t.checksum)) == 64
