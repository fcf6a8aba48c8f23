"""Fast sampler unit tests (no engine): proto round trips, request validation, weight staging
(every rejection path + the staged file read back), safetensors I/O, JAX-backend numerics knobs."""

from __future__ import annotations

import hashlib
import os

import grpc
import ml_dtypes
import numpy as np
import pytest

from dlc_jax.sampler.push.staging import PushError, WeightStager
from dlc_jax.sampler.service.request_checks import RequestError, validate_generate
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire import sampler_pb2 as pb
from dlc_jax.sampler.wire.types import Rollout, SamplingParams, spans_from_versions


def test_sampling_params_and_rollout_roundtrip():
    p = SamplingParams(
        n=3,
        max_tokens=7,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        head_k=2,
        stop_token_ids=(4, 9),
        seed=0,
    )
    assert SamplingParams.from_proto(p.to_proto()) == p  # seed=0 survives (has_seed)
    assert SamplingParams.from_proto(SamplingParams(seed=None).to_proto()).seed is None
    assert (
        SamplingParams.from_proto(pb.SamplingParams(n=1, max_tokens=1, temperature=1)).top_p == 1.0
    )
    r = Rollout(
        prompt_ids=np.array([1, 2], np.int32),
        response_ids=np.array([5, 6, 7], np.int32),
        logprobs=np.array([-0.1, -2.0, -np.inf], np.float32),
        head_ids=np.arange(6, dtype=np.int32).reshape(3, 2),
        head_logprobs=np.array([[-0.1, -3], [-1, -2], [-0.5, -np.inf]], np.float32),
        finish_reason="stop",
        version_spans=[(3, 0, 1), (4, 1, 3)],
        slot_id=17,
        sample_index=2,
        request_id="q",
    )
    back = Rollout.from_proto(pb.Rollout.FromString(r.to_proto().SerializeToString()))
    for f in ("prompt_ids", "response_ids", "logprobs", "head_ids", "head_logprobs"):
        np.testing.assert_array_equal(getattr(back, f), getattr(r, f))
        assert getattr(back, f).dtype == getattr(r, f).dtype
    assert (back.finish_reason, back.version_spans, back.slot_id, back.sample_index) == (
        "stop",
        [(3, 0, 1), (4, 1, 3)],
        17,
        2,
    )
    bad = r.to_proto()
    del bad.head_ids[-1]
    with pytest.raises(ValueError, match="head has 5 ids"):
        Rollout.from_proto(bad)


def test_spans_from_versions():
    assert spans_from_versions([]) == []
    assert spans_from_versions([0, 0, 1, 1, 1]) == [(0, 0, 2), (1, 2, 5)]
    assert spans_from_versions([2]) == [(2, 0, 1)]


def _req(prompts, **kw):
    return pb.GenerateRequest(
        request_id="r",
        prompts=[pb.Prompt(slot_id=i, token_ids=p) for i, p in enumerate(prompts)],
        params=SamplingParams(**kw).to_proto(),
    )


LIMITS = dict(vocab_size=100, max_model_len=32, max_n=4, max_head_k=5, max_prompts=3)


def test_validate_generate_accepts_and_rejects():
    prompts, p = validate_generate(_req([[1, 2], [99]], n=4, max_tokens=30, head_k=5), **LIMITS)
    assert prompts == [(0, [1, 2]), (1, [99])] and p.n == 4
    cases = [
        (_req([[1, 100]]), "token id 100 outside"),
        (_req([[1, 2]] * 4), "4 prompts"),
        (_req([[1] * 20], max_tokens=13), "exceeds max_model_len 32"),
        (_req([[1]], n=5), "params.n = 5"),
        (_req([[1]], head_k=6), "head_k = 6"),
        (_req([[1]], temperature=float("nan")), "temperature"),
        (_req([[1]], top_p=-0.1), "top_p"),
        (pb.GenerateRequest(prompts=[pb.Prompt(token_ids=[1])]), "params: missing"),
    ]
    for req, needle in cases:
        with pytest.raises(RequestError, match=needle):
            validate_generate(req, **LIMITS)


EXPECTED = {"a.weight": ((3, 4), "float32"), "b.weight": ((5,), "float32")}


def _tensors(dtype=np.float32):
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.standard_normal((3, 4)).astype(dtype),
        "b.weight": rng.standard_normal(5).astype(dtype),
    }


def _header(t, version=1, dtype="float32"):
    return pb.WeightHeader(
        version=version,
        dtype=dtype,
        tensors=[
            pb.TensorSpec(name=n, shape=list(a.shape), dtype=dtype, nbytes=a.nbytes)
            for n, a in t.items()
        ],
    )


def _feed(stager, t, chunk=7, corrupt=None, trailer=True):
    for i, a in enumerate(t.values()):
        b = a.tobytes()
        for off in range(0, len(b), chunk):
            data = b[off : off + chunk]
            if corrupt == (i, off):
                data = bytes([data[0] ^ 1]) + data[1:]
            stager.chunk(pb.WeightChunk(tensor_index=i, offset=off, data=data))
        if trailer:
            stager.done(pb.TensorDone(tensor_index=i, sha256=hashlib.sha256(b).hexdigest()))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stager_happy_path_writes_readable_safetensors(tmp_path, dtype):
    t = _tensors(st.NP_DTYPES[dtype])
    s = WeightStager(EXPECTED, current_version=0, staging_root=str(tmp_path))
    s.header(_header(t, dtype=dtype))
    _feed(s, t)
    d = s.commit()
    got = dict(st.iter_tensors(d))
    assert st.read_specs(d) == {n: (a.shape, dtype) for n, a in t.items()}
    for n, a in t.items():
        np.testing.assert_array_equal(got[n].astype(np.float32), a.astype(np.float32))
    assert s.bytes_received == sum(a.nbytes for a in t.values())
    # transformers/safetensors can read the staged file too (independent reader)
    from safetensors.numpy import load_file

    if dtype == "float32":
        ref = load_file(str(d / "model.safetensors"))
        np.testing.assert_array_equal(ref["a.weight"], t["a.weight"])
    s.discard()
    assert not d.exists()


def _expect(code, needle, fn):
    with pytest.raises(PushError) as ei:
        fn()
    assert ei.value.code == code and needle in ei.value.message, ei.value.message


def test_stager_rejections(tmp_path):
    t = _tensors()
    mk = lambda v=0: WeightStager(EXPECTED, current_version=v, staging_root=str(tmp_path))  # noqa: E731
    _expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "stale version",
        lambda: mk(v=1).header(_header(t, version=1)),
    )
    h = _header(t)
    h.tensors[0].name = "c.weight"
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT, "unknown tensor name 'c.weight'", lambda: mk().header(h)
    )
    h = _header(t)
    h.tensors[0].shape[:] = [4, 3]
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT, "shape [4, 3] != expected [3, 4]", lambda: mk().header(h)
    )
    h = _header(t)
    h.tensors[1].dtype = "int8"
    h.tensors[1].nbytes = 5
    _expect(grpc.StatusCode.INVALID_ARGUMENT, "dtype 'int8' not allowed", lambda: mk().header(h))
    h = _header(t)
    h.tensors[1].nbytes += 4
    _expect(grpc.StatusCode.INVALID_ARGUMENT, "nbytes", lambda: mk().header(h))
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "missing 1 tensor",
        lambda: mk().header(_header({"a.weight": t["a.weight"]})),
    )
    _expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "data before header",
        lambda: mk().chunk(pb.WeightChunk(tensor_index=0, offset=0, data=b"x")),
    )

    s = mk()
    s.header(_header(t))
    _expect(grpc.StatusCode.DATA_LOSS, "sha256 mismatch", lambda: _feed(s, t, corrupt=(0, 14)))
    staged = s.dir
    s.discard()
    assert not staged.exists()

    s = mk()
    s.header(_header(t))
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "expected 0",
        lambda: s.chunk(pb.WeightChunk(tensor_index=0, offset=8, data=b"x")),
    )
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "tensor_index 2 out of range",
        lambda: s.chunk(pb.WeightChunk(tensor_index=2, offset=0, data=b"x")),
    )
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "exceed",
        lambda: s.chunk(pb.WeightChunk(tensor_index=1, offset=0, data=b"x" * 21)),
    )
    s.discard()

    s = mk()  # truncated tensor: commit refuses
    s.header(_header(t))
    s.chunk(pb.WeightChunk(tensor_index=0, offset=0, data=t["a.weight"].tobytes()[:10]))
    _expect(grpc.StatusCode.DATA_LOSS, "received 10 of 48 bytes", s.commit)
    s.discard()

    s = mk()  # checksum only in the header works; no checksum at all is refused
    h = _header(t)
    h.tensors[0].sha256 = hashlib.sha256(t["a.weight"].tobytes()).hexdigest()
    s.header(h)
    _feed(s, {"a.weight": t["a.weight"]}, trailer=False)
    b = t["b.weight"].tobytes()
    s.chunk(pb.WeightChunk(tensor_index=1, offset=0, data=b))
    _expect(grpc.StatusCode.INVALID_ARGUMENT, "no sha256", s.commit)
    s.discard()
    assert os.listdir(tmp_path) == []  # nothing left behind


def test_int8_and_noise_knobs():
    from dlc_jax.sampler.backends.base import BackendConfig
    from dlc_jax.sampler.backends.jax_backend import transform_weights

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 64)).astype(np.float32) * np.linspace(0.1, 3, 16)[:, None].astype(
        np.float32
    )
    q = transform_weights("x.weight", w, BackendConfig(model_dir=".", quantization="int8"))
    scale = np.abs(w).max(1, keepdims=True) / 127
    err = np.abs(q - w)
    assert np.all(err <= scale / 2 + 1e-6) and err.max() > 0  # round-to-nearest, per row
    assert len(np.unique(np.round(q[3] / scale[3]))) <= 255
    n1 = transform_weights(
        "x.weight", w, BackendConfig(model_dir=".", weight_noise=0.1, weight_noise_seed=4)
    )
    n2 = transform_weights(
        "x.weight", w, BackendConfig(model_dir=".", weight_noise=0.1, weight_noise_seed=4)
    )
    np.testing.assert_array_equal(n1, n2)  # fixed seed
    rel = np.sqrt(np.mean((n1 - w) ** 2)) / np.sqrt(np.mean(w**2))
    assert 0.09 < rel < 0.11, rel
    norm = rng.standard_normal(8).astype(np.float32)
    np.testing.assert_array_equal(
        transform_weights("n.weight", norm, BackendConfig(model_dir=".", weight_noise=1.0)), norm
    )


def test_safetensors_writer_matches_library(tmp_path):
    from safetensors.numpy import load_file

    t = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "y": np.ones((2,), np.float16)}
    st.write_file(tmp_path / "m.safetensors", t)
    ref = load_file(str(tmp_path / "m.safetensors"))
    for k in t:
        np.testing.assert_array_equal(ref[k], t[k])
    bf = {"z": np.linspace(-1, 1, 6).astype(ml_dtypes.bfloat16)}
    st.write_file(tmp_path / "b.safetensors", bf)
    got = dict(st.iter_tensors(tmp_path))
    assert got["z"].dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got["z"], bf["z"])


def test_prefetched_keeps_order_reraises_and_stops_early():
    import threading

    from dlc_jax.sampler.client.client import prefetched

    assert list(prefetched(iter(range(50)), depth=2)) == list(range(50))

    def boom():
        yield 1
        raise RuntimeError("export failed at tensor 2")

    it = prefetched(boom())
    assert next(it) == 1
    with pytest.raises(RuntimeError, match="tensor 2"):
        next(it)

    produced = []

    def counting():
        for i in range(1000):
            produced.append(i)
            yield i

    g = prefetched(counting(), depth=1)
    assert next(g) == 0
    g.close()  # consumer stops: the producer must stop too, not run through all 1000
    for t in threading.enumerate():
        if t.name == "push-prefetch":
            t.join(timeout=2)
    assert len(produced) < 10


def test_staging_root_auto_prefers_ram_when_it_has_room(tmp_path):
    import shutil

    from dlc_jax.sampler.push.staging_dirs import resolve_staging_root

    free = shutil.disk_usage(tmp_path).free
    assert (
        resolve_staging_root("/data/stage", 10**15, shm_dir=str(tmp_path)) == "/data/stage"
    )  # explicit wins
    assert resolve_staging_root("auto", 1024, shm_dir=str(tmp_path)) == str(tmp_path)
    assert (
        resolve_staging_root(None, free, shm_dir=str(tmp_path)) is None
    )  # no room for 2x: system temp
    assert resolve_staging_root(None, 1024, shm_dir=str(tmp_path / "missing")) is None
