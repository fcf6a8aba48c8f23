"""``lora.push: adapter`` payload: PEFT names and shapes the sampler accepts, per-tensor CRC-32C
over the bytes sent, staged through the real `WeightStager` checks (corrupt bytes, a foreign base,
a wrong rank and a lone factor are refused), the sampler-side merge equal to the trainer's merged
model, and the bytes of an adapter push vs a full push."""

import jax
import numpy as np
import pytest
from flax import nnx
from model_helpers import LORA_DIMS

from dlc_jax.lora import LoraConfig, LoraParam, apply_lora, merged_model
from dlc_jax.lora.push import adapter_messages, adapter_tensors, hf_base_fingerprint
from dlc_jax.model.config import Qwen3Config
from dlc_jax.model.hf_io import hf_param_shapes, iter_hf_tensors
from dlc_jax.model.qwen3 import Qwen3ForCausalLM
from dlc_jax.sampler.push.adapter import (
    AdapterMeta,
    AdapterStager,
    adapter_specs,
    base_fingerprint,
    merged_tensors,
    read_adapter,
    write_peft_dir,
)
from dlc_jax.sampler.push.weight_checks import PushError
from dlc_jax.sampler.push.weight_stream import weight_messages
from dlc_jax.sampler.wire import chunk_wire
from dlc_jax.sampler.wire import safetensors_io as st
from dlc_jax.trainer.lora_push import adapter_pusher

DIMS = LORA_DIMS
RANK, ALPHA = 4, 8.0


def _adapted(scan=False, dims=DIMS, rank=RANK, seed=0):
    m = Qwen3ForCausalLM(Qwen3Config(**dims, scan_layers=scan), rngs=nnx.Rngs(seed))
    apply_lora(m, LoraConfig(rank=rank, alpha=ALPHA))
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(m, LoraParam))):
        x = v.get_value()  # a trained adapter: B non-zero
        v.set_value(0.3 * jax.random.normal(jax.random.key(i), x.shape, x.dtype))
    return m


def _expected(model):
    return {n: (tuple(s), "float32") for n, s in hf_param_shapes(model.config).items()}


def _stage(model, tmp_path, messages, *, base=None):
    """Feed a push stream into a real AdapterStager (as the server does); -> committed dir."""
    fp = hf_base_fingerprint(model) if base is None else base
    stager = AdapterStager(_expected(model), 0, str(tmp_path), check_base=lambda rank: fp)
    try:
        for m in messages:
            if isinstance(m, (bytes, bytearray, memoryview)):
                m = chunk_wire.decode_weight_message(bytes(m))
            if isinstance(m, chunk_wire.RawChunk):
                stager.chunk(m)
                continue
            kind = m.WhichOneof("kind")
            if kind == "header":
                stager.header(m.header)
            elif kind == "done":
                stager.done(m.done)
            elif kind == "commit":
                return stager, stager.commit()
    except PushError:
        stager.discard()
        raise
    raise AssertionError("no commit")


@pytest.mark.parametrize("scan", [False, True])
def test_adapter_payload_names_shapes_checksums_and_merge(scan, tmp_path):
    m = _adapted(scan)
    tensors = adapter_tensors(m)
    allowed = adapter_specs(_expected(m), RANK)
    assert len(tensors) == 2 * 7 * DIMS["num_hidden_layers"]
    for name, a in tensors:
        assert name in allowed and tuple(a.shape) == allowed[name][0], name
    assert not any("lm_head" in n or "embed_tokens" in n for n, _ in tensors)

    meta = AdapterMeta(RANK, ALPHA, hf_base_fingerprint(m))
    msgs = list(adapter_messages(tensors, 3, meta))
    h = msgs[0].header
    assert (h.kind, h.adapter_rank, h.adapter_alpha, h.adapter_base) == (
        "lora_adapter",
        RANK,
        ALPHA,
        meta.base,
    )
    assert [s.name for s in h.tensors] == [n for n, _ in tensors]

    stager, d = _stage(m, tmp_path, msgs)
    assert stager.meta == meta and stager.bytes_received == sum(a.nbytes for _, a in tensors)
    got = read_adapter(d)
    for name, a in tensors:
        np.testing.assert_array_equal(got[name], a)
    # the sampler-side merge (base file + scale * B @ A) is the trainer's merged model
    base = list(iter_hf_tensors(m))
    want = dict(iter_hf_tensors(merged_model(m)))
    merged = dict(merged_tensors(base, got, meta.scale))
    assert len(merged) == 7 * DIMS["num_hidden_layers"]
    for name, w in merged.items():
        np.testing.assert_allclose(w, want[name], atol=1e-6)
    # vLLM's loader reads a PEFT directory: the staged file renamed + adapter_config.json
    write_peft_dir(d, meta)
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in d.iterdir()}
    assert set(st.read_specs(d)) == {n for n, _ in tensors}
    stager.discard()


def test_base_fingerprint_is_the_base_files(tmp_path):
    from dlc_jax.model import save_hf

    m = _adapted()
    d = save_hf(m, tmp_path / "base")  # an adapted model saves its base (adapters are not HF)
    fp = hf_base_fingerprint(m)
    assert fp == base_fingerprint(st.iter_tensors(d))
    merged = save_hf(merged_model(m), tmp_path / "merged")
    assert fp != base_fingerprint(st.iter_tensors(merged))  # another base
    assert fp != hf_base_fingerprint(_adapted(seed=1))


def _corrupt_first_chunk(msgs):
    out, done = [], False
    for m in msgs:
        if not done and isinstance(m, (bytes, bytearray, memoryview)):
            c = chunk_wire.decode_weight_message(bytes(m))
            data = bytearray(bytes(c.data))
            data[5] ^= 0x40
            m = chunk_wire.encode_chunk(c.tensor_index, c.offset, memoryview(bytes(data)))
            done = True
        out.append(m)
    return out


def test_refused_corrupt_foreign_base_wrong_rank_lone_factor(tmp_path):
    m = _adapted()
    tensors = adapter_tensors(m)
    meta = AdapterMeta(RANK, ALPHA, hf_base_fingerprint(m))

    with pytest.raises(PushError, match="crc32c mismatch"):  # bytes corrupted on the way
        _stage(m, tmp_path, _corrupt_first_chunk(adapter_messages(tensors, 1, meta)))
    foreign = AdapterMeta(RANK, ALPHA, "0123456789abcdef")
    with pytest.raises(PushError, match=r"trained on base 0123456789abcdef.*base is [0-9a-f]{16}"):
        _stage(m, tmp_path, adapter_messages(tensors, 1, foreign))
    with pytest.raises(PushError, match="shape"):  # the header's rank does not fit the factors
        _stage(m, tmp_path, adapter_messages(tensors, 1, AdapterMeta(RANK + 1, ALPHA, meta.base)))
    with pytest.raises(PushError, match="without"):  # an A without its B
        _stage(m, tmp_path, adapter_messages(tensors[:1], 1, meta))
    full = _expected(m)
    with pytest.raises(PushError, match="not a LoRA factor"):  # a full tensor is not a factor
        name = next(iter(full))
        bad = [(name, np.zeros(full[name][0], np.float32))]
        _stage(m, tmp_path, adapter_messages(bad, 1, meta))
    assert not list(tmp_path.iterdir())  # every refused push left nothing staged


def test_adapter_push_is_under_one_percent_of_a_full_push():
    """Bytes each push's stream carries (header nbytes; the adapter stream's chunks counted too),
    fp32, rank 8, on a one-layer model of hidden size 1024 (the 128-wide test model's
    vocabulary-sized embedding and head alone make its adapters 4% of it)."""
    dims = dict(DIMS, vocab_size=2048, hidden_size=1024, intermediate_size=3072)
    dims.update(num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=4, head_dim=128)
    m = _adapted(dims=dims, rank=8)
    tensors = adapter_tensors(m)
    meta = AdapterMeta(8, ALPHA, "x")
    msgs = list(adapter_messages(tensors, 1, meta))
    adapter = sum(s.nbytes for s in msgs[0].header.tensors)
    chunks = [chunk_wire.decode_weight_message(bytes(c)) for c in msgs if isinstance(c, bytes)]
    sent = sum(len(c.data) for c in chunks)
    assert sent == adapter == 4 * sum(a.size for _, a in tensors)
    shapes = list(hf_param_shapes(m.config).items())
    full_header = next(
        weight_messages(iter([]), shapes, 1, "float32", 1 << 20, "crc32c", prefetch=0)
    )
    full = sum(s.nbytes for s in full_header.header.tensors)
    assert full == 4 * sum(int(np.prod(s)) for _, s in shapes)
    print(f"adapter push {adapter:,} B vs full push {full:,} B: {adapter / full:.3%}")
    assert adapter <= 0.01 * full


def test_adapter_pusher_refuses_what_it_cannot_push_to():
    from dlc_jax.errors import UserError

    cfg = LoraConfig(rank=2, push="adapter")
    multi = adapter_pusher(cfg, multi=True, backend="jax")  # collective (tests/e2e/...multihost)
    assert type(multi).__name__ == "MultiHostAdapterPusher"
    with pytest.raises(UserError, match="multi-host run pushes adapters to sampler servers"):
        multi.push(object(), None, 1)  # refused before any collective (or model access)
    with pytest.raises(UserError, match="full weights only"):
        adapter_pusher(cfg, multi=False, backend="jax").push(object(), _adapted(), 1)
    with pytest.raises(ValueError, match="LoraConfig.push"):
        LoraConfig(rank=2, push="delta")


def test_inprocess_sampler_serves_pushed_adapter_as_the_merged_model(tmp_path):
    """sampler.backend=inprocess: the adapters go to the JAX backend in this process with the
    server's checks; it then serves the trainer's merged model; a foreign base or a non-finite
    factor is refused and changes nothing."""
    from dlc_jax.model.hf_io import save_hf
    from dlc_jax.sampler.backends.base import BackendConfig
    from dlc_jax.sampler.client.inprocess import InProcessSampler

    m = Qwen3ForCausalLM(Qwen3Config(**DIMS), rngs=nnx.Rngs(0))
    base_dir = save_hf(m, tmp_path / "base")
    apply_lora(m, LoraConfig(rank=RANK, alpha=ALPHA))
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(m, LoraParam))):
        x = v.get_value()
        v.set_value(0.3 * jax.random.normal(jax.random.key(i), x.shape, x.dtype))
    sampler = InProcessSampler(BackendConfig(model_dir=str(base_dir), max_model_len=32))
    b = sampler.backend
    pusher = adapter_pusher(
        LoraConfig(rank=RANK, alpha=ALPHA, push="adapter"), multi=False, backend="inprocess"
    )
    res = pusher.push(sampler, m, 1)
    assert res.ok and res.version == 1 and sampler.info()["version"] == 1, res
    assert res.bytes == sum(a.nbytes for _, a in adapter_tensors(m))
    served = dict(iter_hf_tensors(nnx.merge(b._graphdef, b._state)))
    want = dict(iter_hf_tensors(merged_model(m)))
    assert served.keys() == want.keys()
    for name, w in want.items():
        np.testing.assert_allclose(served[name], w, atol=1e-6, err_msg=name)
    assert max(np.abs(served[n] - w).max() for n, w in iter_hf_tensors(m)) > 1e-2  # not the base

    before = b._state
    pusher._base = "0123456789abcdef"  # adapters trained on another base
    res = pusher.push(sampler, m, 2)
    assert not res.ok and res.code == "FAILED_PRECONDITION" and "0123456789abcdef" in res.message
    pusher._base = None
    v = next(v for _, v in nnx.to_flat_state(nnx.state(m, LoraParam)))
    v.set_value(v.get_value().at[0, 0].set(np.nan))
    res = pusher.push(sampler, m, 2)
    assert not res.ok and res.code == "INVALID_ARGUMENT" and "non-finite" in res.message, res
    assert b._state is before and sampler.info()["version"] == 1
    assert sampler.counters["rejected_pushes"] == 2


def test_hostile_adapter_pushes_are_refused_with_nothing_staged(tmp_path):
    """Issue 33 item 5: rank 0, a huge rank, a target the base lacks, NaN factors, mismatched
    A/B pairs, another model's base and a payload cut mid-stream are each refused (PushError
    before any commit) and leave nothing staged; the in-memory path refuses the same."""
    from dlc_jax.sampler.push.adapter import check_adapter

    m = _adapted()
    tensors = adapter_tensors(m)
    base = hf_base_fingerprint(m)
    meta = AdapterMeta(RANK, ALPHA, base)
    nan = [(n, a.copy()) for n, a in tensors]
    nan[0][1].flat[0] = np.nan
    (a_name, a), (b_name, b) = tensors[0], tensors[1]
    ghost = a_name.replace("layers.0.", "layers.99.")  # a projection the base does not have
    cases = {
        "rank_0": (tensors, AdapterMeta(0, ALPHA, base), "must be >= 1"),
        "huge_rank": (tensors, AdapterMeta(2**30, ALPHA, base), "largest rank"),
        "missing_target": ([(ghost, a), (ghost.replace("lora_A", "lora_B"), b)], meta, "not a"),
        "nan_factors": (nan, meta, "non-finite|NaN"),
        "mismatched_pair": ([(a_name, a), (b_name, b[:, :-1])], meta, "shape"),
        "other_base": (tensors, AdapterMeta(RANK, ALPHA, "fedcba9876543210"), "trained on base"),
    }
    for name, (ts, mt, match) in cases.items():
        with pytest.raises(PushError, match=match):
            _stage(m, tmp_path, adapter_messages(ts, 1, mt))
        with pytest.raises(PushError, match=match):
            check_adapter(_expected(m), dict(ts), mt, lambda rank: base)
        assert not list(tmp_path.iterdir()), name
    msgs = list(adapter_messages(tensors, 1, meta))
    raw = [i for i, x in enumerate(msgs) if isinstance(x, (bytes, bytearray, memoryview))]
    cut = msgs[: raw[len(raw) // 2]] + msgs[-1:]  # the stream breaks off, then a commit
    with pytest.raises(PushError):
        _stage(m, tmp_path, cut)
    assert not list(tmp_path.iterdir())
