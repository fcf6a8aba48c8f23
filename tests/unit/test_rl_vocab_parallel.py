"""The trainer's log-prob layout on 8 fake CPU devices (its FSDP mesh): the vocabulary split over
the devices (``dlc_jax.rl.vocab_parallel``), so no [positions, V] logits array crosses a device
boundary inside the chunk loops, and values and gradients equal the naive reference on ragged
shapes.

Before (issue 30): ``token_logprobs`` flattened the B*T positions into contiguous chunks, so a chunk
was one row on one device; against the FSDP unembedding (split along D) XLA split each chunk's
matmul along D and all-reduced the chunk's whole [c, V] f32 logits in every loop body (the 8 x 4,096
peer row: 155,582,464 B = 256 x 151,936 x 4 per body), every device then transforming all c
positions (docs/bench/PLAN.md). ``test_detector_finds_todays_all_reduce`` keeps that layout's
signature in view, so the checks below are known to fail on it."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from rl_reference import reference_token_logprobs

from dlc_jax.model.sharding import MeshConfig, logprob_axes, logprob_shards, make_mesh
from dlc_jax.rl.logprobs import token_logprobs
from dlc_jax.rl.vocab_parallel import local_chunk_positions, vocab_parallel_token_logprobs

COLLECTIVE = r"(?:all-to-all|collective-permute|all-gather|all-reduce|reduce-scatter)(?:-start)?"
D, V = 16, 64


@pytest.fixture(scope="module")
def mesh():
    if len(jax.devices()) < 8:
        pytest.fail(f"need 8 fake CPU devices (XLA_FLAGS from conftest), got {len(jax.devices())}")
    return make_mesh(MeshConfig(fsdp=-1), jax.devices()[:8])  # (data 1, fsdp 8, tensor 1)


def _computations(hlo: str) -> dict[str, str]:
    out = {}
    for block in re.split(r"\n(?=\S.*\{\n)", hlo):
        m = re.match(r"(?:ENTRY )?%?([\w.\-]+)", block.strip())
        if m:
            out[m.group(1)] = block
    return out


def loop_bodies(hlo: str) -> dict[str, str]:
    """Each while loop's body with every computation it calls, as one text."""
    comps = _computations(hlo)
    calls = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)")

    def closure(name: str, seen: set[str]) -> None:
        if name not in seen:
            seen.add(name)
            for sub in calls.findall(comps.get(name, "")):
                closure(sub, seen)

    bodies = {}
    for body in sorted(set(re.findall(r"body=%?([\w.\-]+)", hlo))):
        seen: set[str] = set()
        closure(body, seen)
        bodies[body] = "\n".join(comps.get(n, "") for n in sorted(seen))
    return bodies


def vocab_collectives(text: str, vocab: int) -> list[str]:
    """Collectives in ``text`` whose result's last dimension is the vocabulary or its 8th: a
    block of logits moving between devices."""
    found = []
    for shape, op in re.findall(rf"= \(?(\w+\[[\d,]*\])\S* ({COLLECTIVE})\(", text):
        dims = [int(x) for x in re.findall(r"\d+", shape.split("[", 1)[1])]
        if dims and dims[-1] in (vocab, vocab // 8):
            found.append(f"{op} {shape}")
    return found


def logits_shapes(text: str) -> set[str]:
    """The shapes of the f32 matmuls in ``text`` with a vocabulary-sized (or shard-sized) output."""
    return set(re.findall(r"= (f32\[\d+,\d+\])\S* dot\(", text)) - {f"f32[{V},{D}]"}


def _abstract(mesh, b, t, dtype=jnp.bfloat16):
    sds, rows = jax.ShapeDtypeStruct, NamedSharding(mesh, P("fsdp"))
    return [
        sds((b, t, D), dtype, sharding=rows),
        sds((V, D), jnp.float32, sharding=NamedSharding(mesh, P(None, "fsdp"))),  # FSDP: D split
        sds((b, t), jnp.int32, sharding=rows),
    ]


def _train_hlo(fn, mesh) -> str:
    def loss(h, w, y):
        o = fn(h, w, y)
        return o.lp.sum() + o.entropy.sum()

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*_abstract(mesh, 8, 256))


def test_detector_finds_todays_all_reduce(mesh):
    """token_logprobs on the FSDP layout (the fallback path): the chunk loop all-reduces the
    chunk's f32 [32, V] logits; the check the vocab-parallel path must pass finds it."""
    hlo = _train_hlo(lambda h, w, y: token_logprobs(h, w, y, chunk_size=32), mesh)
    found = [
        f
        for body in loop_bodies(hlo.compile().as_text()).values()
        for f in vocab_collectives(body, V)
    ]
    assert f"all-reduce f32[32,{V}]" in found, found


def test_train_step_loops_move_no_logits_between_devices(mesh):
    """value_and_grad of the vocab-parallel path: the forward map and its transpose hold only
    per-position collectives (the chunk's hidden rows, ids, max and sums); each device's logits
    are the whole chunk (32 positions) by its V/8 vocabulary rows."""

    def fn(h, w, y):
        return vocab_parallel_token_logprobs(h, w, y, mesh=mesh, rows="fsdp", chunk_size=32)

    hlo = _train_hlo(fn, mesh).compile().as_text()
    bodies = loop_bodies(hlo)
    assert len(bodies) == 2, list(bodies)  # the forward map and its transpose
    for name, body in bodies.items():
        assert not vocab_collectives(body, V), (name, vocab_collectives(body, V))
        assert re.search(COLLECTIVE, body), name  # the chunk's rows are gathered per chunk
        assert logits_shapes(body) <= {f"f32[32,{V // 8}]", f"f32[{V // 8},{D}]", f"f32[32,{D}]"}
        assert f"f32[32,{V // 8}]" in logits_shapes(body), (name, logits_shapes(body))


def _data(b, t, k, vocab, seed):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(b, t, D)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(vocab, D)) * 0.7, jnp.float32)
    y = jnp.asarray(rng.integers(0, vocab, (b, t)), jnp.int32)
    head = jnp.asarray(rng.integers(0, vocab, (b, t, k)), jnp.int32)
    return h, w, y, head


@pytest.mark.parametrize(
    "b,t,vocab,chunk,kw",
    [
        (8, 13, 61, 20, dict(temperature=0.8)),  # rows split; V % 8 != 0 (padded shard); ragged
        (4, 16, 64, 7, dict()),  # 4 rows do not split 8 ways: the positions split instead
        (8, 5, 50, 1000, dict(compute_entropy=False)),  # one chunk larger than the batch
    ],
)
def test_values_and_gradients_equal_reference(mesh, b, t, vocab, chunk, kw):
    h, w, y, head = _data(b, t, 3, vocab, seed=b + t)
    rows, positions = logprob_axes(b, t, mesh.shape)
    # a different cotangent per position and id (the backward pass forms them in one pass)
    rng = np.random.default_rng(b * t)
    lp_w, head_w, ent_w = (
        jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(b, t), (b, t, 3), (b, t)]
    )
    ent_w = ent_w if kw.get("compute_entropy", True) else 0.0 * ent_w

    def f(fn, h, w, **extra):
        o = fn(h, w, y, head_ids=head, **extra)
        loss = jnp.sum(o.lp * lp_w) + jnp.sum(o.lp_head * head_w) + jnp.sum(o.entropy * ent_w)
        return loss, o

    def ours(h, w):
        extra = dict(mesh=mesh, rows=rows, positions=positions, chunk_size=chunk, **kw)
        return f(vocab_parallel_token_logprobs, h, w, **extra)

    def ref(h, w):
        return f(reference_token_logprobs, h, w, temperature=kw.get("temperature", 1.0))

    (l8, o8), g8 = jax.jit(jax.value_and_grad(ours, argnums=(0, 1), has_aux=True))(h, w)
    (l1, o1), g1 = jax.jit(jax.value_and_grad(ref, (0, 1), has_aux=True))(h, w)
    if not kw.get("compute_entropy", True):
        assert not np.any(np.asarray(o8.entropy))
        o1 = o1._replace(entropy=o8.entropy)
    for a, r in zip([*o8, *g8], [*o1, *g1]):
        np.testing.assert_allclose(a, r, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(l8, l1, rtol=1e-5)


def test_two_axis_mesh_and_bf16_hidden():
    """Rows over (data 2, fsdp 4): the vocabulary splits over both axes in the spec's order."""
    mesh = make_mesh(MeshConfig(data=2, fsdp=4, tensor=1), jax.devices()[:8])
    h, w, y, head = _data(8, 9, 2, 72, seed=3)
    h = h.astype(jnp.bfloat16)
    rows, positions = logprob_axes(8, 9, mesh.shape)
    assert rows == ("data", "fsdp") and positions is None
    o8 = vocab_parallel_token_logprobs(
        h, w, y, head_ids=head, mesh=mesh, rows=rows, positions=positions, chunk_size=16
    )
    o1 = reference_token_logprobs(h, w, y, head_ids=head)
    for a, r in zip(o8, o1):
        np.testing.assert_allclose(a, r, atol=2e-5, rtol=1e-4)


def _entropy64(h, w, temperature=1.0):
    z = np.einsum("btd,vd->btv", np.asarray(h, np.float64), np.asarray(w, np.float64))
    z = z / temperature
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    return -(p * np.log(p)).sum(-1)


def test_entropy_without_f32_cancellation(mesh):
    """Logits near 3,000 (a constant hidden component times a constant unembedding column; the
    rest on a grid of 1/4, so every logit is exact in f32): the form lse - sum(p * z) loses
    ~ulp(3000) = 2.4e-4 to cancellation, far past rtol 1e-5 on entropies of 0.5-3.5; every path
    computes log S - E[z - m] instead and meets rtol 1e-5 against float64. (The tolerance is the
    one test_rl_sharded.py holds the sharded entropy to.)"""
    h, w, y, _ = _data(8, 6, 0, 64, seed=7)
    h, w = jnp.round(h * 4) / 4, jnp.round(w * 4) / 4
    h = h.at[..., 0].set(100.0)
    w = w.at[:, 0].set(30.0)
    want = _entropy64(h, w)
    lse = jax.nn.logsumexp(jnp.einsum("btd,vd->btv", h, w), axis=-1)
    naive = lse - jnp.sum(
        jax.nn.softmax(jnp.einsum("btd,vd->btv", h, w)) * jnp.einsum("btd,vd->btv", h, w), -1
    )
    assert np.max(np.abs(np.asarray(naive) / want - 1)) > 1e-5  # the cancellation is real here
    got = {
        "vocab_parallel": vocab_parallel_token_logprobs(
            h, w, y, mesh=mesh, rows="fsdp", chunk_size=8
        ),
        "chunked": token_logprobs(h, w, y, chunk_size=8),
        "vocab_scan": token_logprobs(h, w, y, chunk_size=8, vocab_chunk=24),
    }
    for name, o in got.items():
        np.testing.assert_allclose(o.entropy, want, rtol=1e-5, err_msg=name)


def test_out_of_range_ids_get_the_floor(mesh):
    h, w, y, head = _data(8, 5, 2, 61, seed=4)
    head = head.at[0, 0, 0].set(-1).at[-1, -1, -1].set(61).at[3, 2, 1].set(64)  # 64: a pad row
    ours = vocab_parallel_token_logprobs(h, w, y, head_ids=head, mesh=mesh, rows="fsdp")
    assert ours.lp_head[0, 0, 0] == ours.lp_head[-1, -1, -1] == ours.lp_head[3, 2, 1] == -1.0e4
    for a, r in zip(ours, token_logprobs(h, w, y, head_ids=head)):
        np.testing.assert_allclose(a, r, atol=2e-5, rtol=1e-4)


def test_truncating_falls_back_to_token_logprobs(mesh):
    h, w, y, head = _data(8, 5, 2, 64, seed=5)
    kw = dict(head_ids=head, top_p=0.9, chunk_size=8)
    ours = vocab_parallel_token_logprobs(h, w, y, mesh=mesh, rows="fsdp", **kw)
    for a, r in zip(ours, token_logprobs(h, w, y, **kw)):
        np.testing.assert_array_equal(a, r)


def test_logprob_axes_split_rows_then_positions():
    fsdp8 = {"data": 1, "fsdp": 8, "tensor": 1}
    assert logprob_axes(8, 13, fsdp8) == ("fsdp", None)
    assert logprob_axes(4, 16, fsdp8) == (None, "fsdp")  # 4 rows do not split 8 ways
    assert logprob_axes(4, 13, fsdp8) == (None, None)  # nor do 13 positions: replicated
    tp = {"data": 2, "fsdp": 4, "tensor": 2}
    assert logprob_axes(16, 2048, tp) == (("data", "fsdp"), "tensor")
    assert logprob_shards(16, 2048, tp) == (8, 2)
    assert logprob_shards(2, 2048, tp) == (2, 8)  # rows over data; positions over fsdp x tensor


def test_local_chunk_positions():
    assert local_chunk_positions(256, 8) == 32
    assert local_chunk_positions(256, 3) == 86  # rounded up: a chunk is at least chunk_size
    assert local_chunk_positions(4, 8) == 1


def test_trainer_policy_logprobs_loops_move_no_logits(mesh):
    """The trainer's own path (trainer.step.policy_logprobs on a sharded model, value_and_grad):
    no loop body of the compiled program moves a vocabulary-sized block between devices. On the
    flattened layout (rl.token_logprobs) its chunk loops all-reduced [256, V] f32 logits."""
    from dlc_jax.model.abstract import abstract_model, abstract_params
    from dlc_jax.model.config import Qwen3Config
    from dlc_jax.trainer.step import StepConfig, policy_logprobs

    vocab = 96  # its 8th, 12, is no other dimension of the model
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=D,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    model = abstract_model(cfg, mesh=mesh, compute_dtype=jnp.bfloat16)
    graphdef, params = abstract_params(model, mesh)
    rows = NamedSharding(mesh, P("fsdp"))
    ids = jax.ShapeDtypeStruct((8, 64), jnp.int32, sharding=rows)
    batch = {"input_ids": ids, "targets": ids, "positions": ids, "attention_mask": ids}

    def loss(p, b):
        o = policy_logprobs(graphdef, p, b, StepConfig(loss=None))
        return o.lp.sum() + o.entropy.sum()

    hlo = jax.jit(jax.grad(loss)).lower(params, batch).compile().as_text()
    found = [f for body in loop_bodies(hlo).values() for f in vocab_collectives(body, vocab)]
    assert not found, found
    # one chunk: the 8 devices' 64 positions each (fewer than chunk_size) by V/8 on each device
    assert f"f32[512,{vocab // 8}]" in hlo


def test_vocab_split_over_a_subset_of_the_row_axes():
    """Across slices the trainer splits the vocabulary over fsdp only (the data axis is DCN):
    each data group of 4 devices combines its own rows; values and gradients are the reference's."""
    mesh = make_mesh(MeshConfig(data=2, fsdp=4, tensor=1), jax.devices()[:8])
    h, w, y, head = _data(8, 7, 2, 70, seed=11)

    def loss(fn, h, w, **kw):
        o = fn(h, w, y, head_ids=head, **kw)
        return jnp.sum(o.lp) + jnp.sum(o.lp_head * 0.5) + jnp.sum(o.entropy * 0.3), o

    kw = dict(mesh=mesh, rows=("data", "fsdp"), vocab_axes=("fsdp",), chunk_size=12)
    ours = jax.value_and_grad(
        lambda h, w: loss(vocab_parallel_token_logprobs, h, w, **kw), (0, 1), has_aux=True
    )
    ref = jax.value_and_grad(
        lambda h, w: loss(reference_token_logprobs, h, w), (0, 1), has_aux=True
    )
    (_, o8), g8 = jax.jit(ours)(h, w)
    (_, o1), g1 = jax.jit(ref)(h, w)
    for a, r in zip([*o8, *g8], [*o1, *g1]):
        np.testing.assert_allclose(a, r, atol=2e-5, rtol=1e-4)
    hlo = jax.jit(ours).lower(h, w).compile().as_text()
    groups = re.findall(
        r"all-gather\(.*?replica_groups=(\{\{[\d,]+\}[^ ]*\}|\[[\d,]+\]<=\[[\d,]+\][^ ,]*)", hlo
    )
    assert groups and all("0,1,2,3,4,5,6,7}" not in g for g in groups), groups


def test_logprob_vocab_axes_leave_out_data_across_slices(mesh):
    from dlc_jax.model.sharding import logprob_vocab_axes

    assert logprob_vocab_axes(mesh, "fsdp", None) == ("fsdp",)
    two = make_mesh(MeshConfig(data=2, fsdp=4, tensor=1), jax.devices()[:8])
    assert logprob_vocab_axes(two, ("data", "fsdp"), None) == ("data", "fsdp")  # one slice
