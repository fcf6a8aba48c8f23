"""The sampler service under hostile clients: real servers on loopback (the JAX backend on a tiny
model, the CLI as a subprocess), each test an attack that used to stall, bloat, poison or leak.

Covers: silent/stalled/slow pushes (idle timeout, maximum duration, push lock taken only after a
header), staged size vs free space, idle data-plane connections (auth deadline, cap, no thread per
connection), new sampling-parameter values (no new compiled programs), tiny temperatures, NaN/Inf
and wrong-dtype weights on both push paths, LoadWeights confinement and bounded reads, stale staging
of dead samplers, `sampler info` to a dead address, over-long prompts, and the vLLM feature check.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.sampler.wire import sampler_pb2 as pb
from dlc_jax.sampler.wire.types import SamplingParams

IDLE_S = 1.0
MAX_PUSH_S = 4.0


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_dir):
    return str(
        make_tiny_dir(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
        )
    )


@pytest.fixture(scope="module")
def base_weights(tiny_dir):
    return dict(st.iter_tensors(tiny_dir))


@pytest.fixture(scope="module")
def served(tiny_dir, tmp_path_factory):
    """(ServerThread, SamplerClient, load_root, staging_root): JAX backend, short push limits."""
    from dlc_jax.sampler.backends import BackendConfig, make_backend
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread

    load_root = tmp_path_factory.mktemp("load_root")
    staging = tmp_path_factory.mktemp("staging")
    backend = make_backend(
        "jax", BackendConfig(model_dir=tiny_dir, max_model_len=96, max_head_k=8, max_n=4)
    )
    cfg = ServerConfig(
        load_root=str(load_root),
        staging_root=str(staging),
        push_idle_timeout_s=IDLE_S,
        push_max_s=MAX_PUSH_S,
        data_port=0,
        data_auth_timeout_s=0.5,
        data_max_pending=16,
    )
    srv = ServerThread(backend, cfg).start()
    client = SamplerClient(srv.address, timeout=60, max_retries=0)
    yield srv, client, load_root, staging
    client.close()
    srv.stop()


def _version(client) -> int:
    return client.info()["version"]


def _probe(client):
    (r,) = list(
        client.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, temperature=1.0, seed=11))
    )
    return r


def _perturbed(weights, seed):
    rng = np.random.default_rng(seed)
    return {
        k: (v + 0.3 * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
        for k, v in weights.items()
    }


def _header_msg(weights, version):
    specs = [
        pb.TensorSpec(name=n, shape=list(a.shape), dtype="float32", nbytes=int(a.nbytes))
        for n, a in weights.items()
    ]
    return pb.WeightMessage(header=pb.WeightHeader(version=version, tensors=specs, dtype="float32"))


# memory staging keeps the superseded push's buffer mapped for the next push (warm_staging)
KEPT = 1


def _staging_dirs(staging) -> list[str]:
    return sorted(p.name for p in staging.iterdir())


# -- pushes that stall ---------------------------------------------------------------------------
def test_silent_and_stalled_pushes_never_block_later_pushes(served, base_weights):
    srv, client, _, staging = served
    v0 = _version(client)
    release = threading.Event()
    results: dict[str, object] = {}

    def silent():  # opens PushWeights and sends nothing
        release.wait(30)
        return
        yield  # noqa: B901 - a generator that yields nothing

    def stalled_after_header():  # a header, then silence: holds the lock until the idle timeout
        yield _header_msg(base_weights, v0 + 5)
        release.wait(30)

    threads = [
        threading.Thread(target=lambda k=k, g=g: results.__setitem__(k, client.push_messages(g())))
        for k, g in (("silent", silent), ("stalled", stalled_after_header))
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    ok = client.push_weights(
        _perturbed(base_weights, 1), v0 + 1
    )  # waits at most for the stalled header
    took = time.monotonic() - t0
    for t in threads:
        t.join(10)
    release.set()
    assert ok.ok and ok.version == v0 + 1, ok
    assert took < IDLE_S + 3.0, f"a later push waited {took:.1f}s behind a silent stream"
    assert results["silent"].code == "ABORTED" and "idle timeout" in results["silent"].message, (
        results["silent"]
    )
    st_ = results["stalled"]
    assert st_.code in ("ABORTED", "FAILED_PRECONDITION") and not st_.ok, (
        st_
    )  # idle timeout, or stale after ok
    assert _version(client) == v0 + 1
    assert len(_staging_dirs(staging)) == 1  # only the directory now serving


def test_trickling_push_is_cut_at_the_maximum_duration(served, base_weights):
    srv, client, _, staging = served
    v0 = _version(client)
    before = _probe(client)
    w = _perturbed(base_weights, 2)
    name0 = next(iter(w))
    data = np.ascontiguousarray(w[name0]).tobytes()

    def trickle():  # one small chunk every IDLE_S / 2: never idle, never done
        yield _header_msg(w, v0 + 1)
        for off in range(0, len(data), 64):
            time.sleep(IDLE_S / 2)
            yield pb.WeightMessage(
                chunk=pb.WeightChunk(tensor_index=0, offset=off, data=data[off : off + 64])
            )

    t0 = time.monotonic()
    res = client.push_messages(trickle())
    took = time.monotonic() - t0
    assert not res.ok and res.code == "ABORTED" and "maximum duration" in res.message, res
    assert MAX_PUSH_S - 0.5 < took < MAX_PUSH_S + 3.0, took
    assert res.version == v0
    np.testing.assert_array_equal(_probe(client).logprobs, before.logprobs)
    assert len(_staging_dirs(staging)) <= 1 + KEPT  # the served push + the warm buffer


def test_push_that_does_not_start_with_a_header_is_refused(served, base_weights):
    _, client, _, _ = served
    res = client.push_messages([pb.WeightMessage(commit=pb.Commit())])
    assert (
        not res.ok
        and res.code == "INVALID_ARGUMENT"
        and "must start with a WeightHeader" in res.message
    ), res


def test_staged_size_checked_against_free_space_before_writing(served, base_weights):
    srv, client, _, staging = served
    v0 = _version(client)
    warm = srv.server.service.warm_staging
    if warm is not None:  # a kept buffer of the exact size needs no new space: stage a new file
        warm.release_free()
    before = _staging_dirs(staging)
    cfg = srv.server.cfg
    old = cfg.staging_reserve_bytes
    cfg.staging_reserve_bytes = 1 << 60  # no filesystem has this much left over
    try:
        res = client.push_weights(_perturbed(base_weights, 3), v0 + 1)
    finally:
        cfg.staging_reserve_bytes = old
    assert (
        not res.ok
        and res.code == "FAILED_PRECONDITION"
        and "not enough space to stage" in res.message
    ), res
    assert _staging_dirs(staging) == before  # nothing was written
    from dlc_jax.sampler.push.weight_checks import max_push_bytes

    exp = srv.server.backend.expected_tensors()
    assert max_push_bytes(exp) == sum(4 * int(np.prod(s)) for s, _ in exp.values())


# -- the socket data plane -----------------------------------------------------------------------
def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:  # closed with our bytes unread
        return True


def test_idle_data_connections_are_capped_and_timed_out_without_threads(served, base_weights):
    srv, client, _, _ = served
    listener = srv.server.service.data_listener
    port = client.info()["data_port"]
    threads_before = threading.active_count()
    socks = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", port))
        socks.append(s)
    time.sleep(0.2)
    assert threading.active_count() <= threads_before + 2
    assert listener.held <= 16
    # garbage on the wire is dropped at once
    g = socket.create_connection(("127.0.0.1", port))
    g.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 64)
    g.settimeout(5)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and listener.held:
        time.sleep(0.1)
    assert listener.held == 0  # the auth deadline (0.5 s) closed every idle connection
    assert _closed_by_server(g)
    for s in socks + [g]:
        s.close()
    # and a real socket-plane push still goes through
    v0 = _version(client)
    res = client.push_weights(_perturbed(base_weights, 4), v0 + 1, transport="socket")
    assert res.ok and res.version == v0 + 1, res


def test_wrong_token_on_the_data_plane_is_dropped(served):
    srv, client, _, _ = served
    listener = srv.server.service.data_listener
    port = client.info()["data_port"]
    refused0 = listener.refused
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"DLCPUSH2" + b"0" * 32 + struct.pack(">H", 0))  # wrong magic
    assert _closed_by_server(s)
    s.close()
    assert listener.refused == refused0 + 1


# -- sampling parameters -------------------------------------------------------------------------
def test_new_sampling_values_compile_no_new_programs(served):
    from dlc_jax.sampler.backends.jax_sampling import sample_step

    _, client, _, _ = served
    base = SamplingParams(max_tokens=3, temperature=0.9, top_p=0.95, top_k=20, head_k=3, seed=1)
    list(client.generate([[1, 2, 3]], base))  # warm: compiles the (top-k, top-p, head) variant
    n0 = sample_step._cache_size()
    rng = np.random.default_rng(0)
    t0 = time.monotonic()
    for i in range(24):
        p = SamplingParams(
            max_tokens=3,
            temperature=float(rng.uniform(0.2, 1.8)),
            top_p=float(rng.uniform(0.5, 0.99)),
            top_k=int(rng.integers(2, 200)),
            head_k=int(rng.integers(1, 9)),
            seed=i,
        )
        (r,) = list(client.generate([[1, 2, 3]], p))
        assert np.isfinite(r.logprobs).all() and r.head_ids.shape == (3, p.head_k)
    assert sample_step._cache_size() == n0, "distinct sampling values compiled new programs"
    took = time.monotonic() - t0
    assert took < 60, took


def test_tiny_temperature_refused_zero_is_greedy(served):
    _, client, _, _ = served
    for t in (1e-40, 1e-6, 0.009):
        with pytest.raises(grpc.RpcError) as ei:
            list(client.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=t)))
        assert (
            ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "below the floor" in ei.value.details()
        )
    for t in (0.0, 0.01):
        (r,) = list(
            client.generate(
                [[1, 2, 3]], SamplingParams(max_tokens=4, temperature=t, head_k=2, seed=3)
            )
        )
        assert np.isfinite(r.logprobs).all() and (r.logprobs <= 0).all()
    (g1,) = list(
        client.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0, seed=1))
    )
    (g2,) = list(
        client.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0, seed=2))
    )
    np.testing.assert_array_equal(g1.response_ids, g2.response_ids)  # greedy ignores the seed


def test_prompt_longer_than_max_model_len_is_invalid_argument(served):
    _, client, _, _ = served
    with pytest.raises(grpc.RpcError) as ei:
        list(client.generate([list(range(1, 95))], SamplingParams(max_tokens=8)))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt length 94 + max_tokens 8 exceeds max_model_len 96" in ei.value.details()


# -- poisoned weights ----------------------------------------------------------------------------
def test_nan_inf_and_wrong_dtype_weights_refused_on_both_paths(served, base_weights):
    srv, client, load_root, staging = served
    v0 = _version(client)
    before = _probe(client)
    nan = {k: np.full(v.shape, np.nan, np.float32) for k, v in base_weights.items()}
    one_inf = _perturbed(base_weights, 5)
    last = list(one_inf)[-1]
    one_inf[last].reshape(-1)[-1] = np.inf
    for what, w, dtype in (
        ("all NaN", nan, "float32"),
        ("one Inf (bf16)", one_inf, "bfloat16"),
        ("one Inf (crc, sha)", one_inf, "float16"),
    ):
        res = client.push_weights(
            w, v0 + 1, dtype=dtype, checksum="sha256" if "sha" in what else "crc32c"
        )
        assert not res.ok and res.code == "INVALID_ARGUMENT" and "NaN or Inf" in res.message, (
            what,
            res,
        )
    res = client.push_weights(nan, v0 + 1, transport="socket")
    assert not res.ok and "NaN or Inf" in res.message, res
    # LoadWeights: NaN values, int32 zeros with the right names
    d_nan = load_root / "nan"
    d_nan.mkdir()
    st.write_file(d_nan / "model.safetensors", nan)
    res = client.load_weights(str(d_nan), v0 + 1)
    assert not res.ok and "NaN or Inf" in res.message, res
    d_int = load_root / "int32"
    d_int.mkdir()
    st.write_file(
        d_int / "model.safetensors",
        {k: np.zeros(v.shape, np.int32) for k, v in base_weights.items()},
    )
    res = client.load_weights(str(d_int), v0 + 1)
    assert not res.ok and "dtype 'int32' not allowed" in res.message, res
    assert _version(client) == v0
    after = _probe(client)
    np.testing.assert_array_equal(after.logprobs, before.logprobs)
    assert np.isfinite(after.logprobs).all()
    assert len(_staging_dirs(staging)) <= 1 + KEPT  # the served push + the warm buffer


def test_load_weights_confined_bounded_and_never_the_served_dir(served, base_weights, tmp_path):
    srv, client, load_root, _ = served
    v0 = _version(client)
    good = load_root / "good"
    good.mkdir()
    st.write_file(good / "model.safetensors", _perturbed(base_weights, 6))
    outside = tmp_path / "outside"
    outside.mkdir()
    st.write_file(outside / "model.safetensors", _perturbed(base_weights, 6))
    res = client.load_weights(str(outside), v0 + 1)
    assert not res.ok and "outside the load root" in res.message, res
    (load_root / "escape").symlink_to(outside)
    res = client.load_weights(str(load_root / "escape"), v0 + 1)
    assert not res.ok and "outside the load root" in res.message, res
    # a safetensors header declaring 1 TB
    huge = load_root / "huge"
    huge.mkdir()
    (huge / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    res = client.load_weights(str(huge), v0 + 1)
    assert (
        not res.ok and res.code == "INVALID_ARGUMENT" and "declared header length" in res.message
    ), res
    # disabled without a load root
    cfg = srv.server.cfg
    cfg.load_root = None
    try:
        res = client.load_weights(str(good), v0 + 1)
    finally:
        cfg.load_root = str(load_root)
    assert not res.ok and "LoadWeights is disabled" in res.message, res
    res = client.load_weights(str(good), v0 + 1)
    assert res.ok and res.version == v0 + 1, res
    res = client.load_weights(str(good), v0 + 2)  # loading the served directory again
    assert not res.ok and "being served" in res.message, res
    assert (good / "model.safetensors").exists()
    res = client.push_weights(
        _perturbed(base_weights, 7), v0 + 2
    )  # a push after a load keeps `good`
    assert res.ok, res
    assert (good / "model.safetensors").exists()


def test_safetensors_reads_are_bounded(tmp_path, base_weights):
    f = tmp_path / "x.safetensors"
    f.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="declared header length"):
        st.read_header(f)
    f.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="too short"):
        st.read_header(f)
    name, arr = next(iter(base_weights.items()))
    st.write_file(f, {name: arr})
    raw = bytearray(f.read_bytes())
    f.write_bytes(bytes(raw[:-8]))  # truncated data section
    with pytest.raises(ValueError, match="data range"):
        st.read_header(f)


def test_finite_check_across_piece_boundaries():
    from dlc_jax.sampler.push.weight_checks import FiniteCheck

    for dtype, np_dt in (
        ("float32", np.float32),
        ("float16", np.float16),
        ("bfloat16", st.NP_DTYPES["bfloat16"]),
    ):
        a = np.linspace(-3, 3, 101).astype(np_dt)
        b = a.copy()
        b[50] = np.nan
        for arr, ok in ((a, True), (b, False)):
            raw = arr.tobytes()
            c = FiniteCheck(dtype)
            for off in range(0, len(raw), 7):  # pieces that split elements
                c.update(raw[off : off + 7])
            assert c.ok is ok, (dtype, ok)
    assert FiniteCheck("int32").update(np.array([-1], np.int32).tobytes())


# -- leaks ---------------------------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_staging_of_dead_samplers_removed_at_start(tiny_dir, tmp_path):
    from dlc_jax.bench.sampler_bench import TransportOnlyBackend
    from dlc_jax.sampler.push.staging_dirs import STAGING_PREFIX
    from dlc_jax.sampler.service.server import SamplerServer, ServerConfig

    root = tmp_path / "staging"
    root.mkdir()
    dead = root / f"{STAGING_PREFIX}{_dead_pid()}_v3_abc"
    alive = root / f"{STAGING_PREFIX}{os.getppid()}_v4_def"
    other = root / "not_ours"
    foreign = root / f"{STAGING_PREFIX}{_dead_pid()}_v5_ghi"  # same pid number, another container
    for d in (dead, alive, other, foreign):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 100)
    (foreign / ".owner").write_text("pid:[1] 7\n")
    specs = st.read_specs(tiny_dir)
    import asyncio

    async def start_stop():
        s = SamplerServer(TransportOnlyBackend(specs, 512), ServerConfig(staging_root=str(root)))
        await s.start()
        await s.stop()

    asyncio.run(start_stop())
    assert not dead.exists() and alive.exists() and other.exists() and foreign.exists()


def test_killed_sampler_process_leaves_no_staging(tiny_dir, base_weights, tmp_path):
    from dlc_jax.sampler.service.process import SamplerProcess

    root = tmp_path / "staging"
    proc = SamplerProcess(
        "jax",
        tiny_dir,
        extra_args=["--max-model-len", "64", "--staging-root", str(root)],
        log_file=str(tmp_path / "s.log"),
        die_with_parent=False,
    ).start()
    try:
        with proc.client(timeout=60) as c:
            assert c.push_weights(_perturbed(base_weights, 8), 1).ok
        assert len(list(root.iterdir())) == 1  # the pushed weights now serving
    finally:
        proc.kill()  # what the trainer does to a sampler it respawns
    assert list(root.iterdir()) == []


# -- user errors ---------------------------------------------------------------------------------
def test_info_to_a_dead_address_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlc_jax.sampler.service.cli",
            "info",
            "--address",
            f"127.0.0.1:{port}",
            "--timeout",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr and "UNAVAILABLE" in lines[0], r.stderr


def test_vllm_feature_check_names_what_is_missing():
    import dataclasses

    from dlc_jax.sampler.backends.vllm_backend import missing_vllm_features

    class OldLLM:
        async def pause_generation(self, *, wait_for_inflight_requests=False): ...

    @dataclasses.dataclass
    class OldOutput:
        index: int = 0

    class NewLLM:
        async def pause_generation(self, *, mode="abort", clear_cache=True): ...

        async def update_weight_version(self, v): ...

    @dataclasses.dataclass
    class NewOutput:
        weight_versions: list | None = None

    assert missing_vllm_features(OldLLM, OldOutput) == [
        "AsyncLLM.pause_generation(mode=...)",
        "AsyncLLM.update_weight_version",
        "CompletionOutput.weight_versions",
    ]
    assert missing_vllm_features(NewLLM, NewOutput) == []
