"""Multi-turn episodes (`dlc_jax.env`): token-exact histories, loss masks and per-token weight
versions, limits, prefix breaks, and environments that raise or return garbage (issue 21).

The sampler here is a scripted in-process `Sampler` (`Scripted`): it echoes the prompt it is given
and generates a fixed script per turn, with a weight version the test can change between turns;
the part under test is the episode runner with the real tokenizer and chat template."""

import asyncio

import numpy as np
import pytest

from dlc_jax.env import (
    ChatDelta,
    EnvConfig,
    EnvSampler,
    PrefixBreakError,
    format_tool_call,
    load_env_factory,
    parse_tool_calls,
)
from dlc_jax.env.builtin.calculator import Calculator, calc
from dlc_jax.env.builtin.feedback import Feedback
from dlc_jax.sampler.wire.types import Rollout, SamplingParams
from dlc_jax.trainer.batching import pack_by_tokens, pack_rollouts

K = 2
ROW = {"prompt": "47+38+5=", "answer": "90"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from dlc_jax.data.tokenize import load_tokenizer
    from dlc_jax.model.tiny import generate_corpus, make_tiny

    d = make_tiny(
        tmp_path_factory.mktemp("tok") / "m",
        hidden_size=32,
        intermediate_size=64,
        head_dim=8,
        num_hidden_layers=1,
        vocab_size=512,
        corpus=generate_corpus(n_lines=3000),
    )
    return load_tokenizer(str(d))


class Scripted:
    """Echoes each prompt; turn i of a slot generates ``script(i)`` token ids (log-prob
    -0.1 * (position + 1), head = the token and token + 1); ``version`` is read per call;
    ``echo`` may alter the echoed prompt."""

    def __init__(self, script, echo=None):
        self.script = script
        self.echo = echo or (lambda p: p)
        self.version = 0
        self.calls: list[tuple[list[int], list[int], int]] = []  # (prompt sent, generated, ver)
        self.turn: dict[int, int] = {}
        self.seeds: list[int | None] = []
        self.requests: list[tuple[list[int], int | None]] = []  # (slots, seed) per request

    address = "scripted"

    def generate(self, prompts, params, slot_ids=None, request_id=None):
        self.requests.append((list(slot_ids), params.seed))
        for p, s in zip(prompts, slot_ids):
            i = self.turn.get(s, 0)
            self.turn[s] = i + 1
            gen = list(self.script(i))[: params.max_tokens]
            t = len(gen)
            self.calls.append((list(p), gen, self.version))
            self.seeds.append(params.seed)
            head = np.stack([gen, [g + 1 for g in gen]], 1).astype(np.int32).reshape(t, K)
            yield Rollout(
                prompt_ids=np.asarray(self.echo(list(p)), np.int32),
                response_ids=np.asarray(gen, np.int32),
                logprobs=-0.1 * np.arange(1, t + 1, dtype=np.float32),
                head_ids=head,
                head_logprobs=np.full((t, K), -1.0, np.float32),
                finish_reason="stop",
                version_spans=[(self.version, 0, t)] if t else [],
                slot_id=s,
            )


def _params(max_tokens=200):
    return SamplingParams(n=1, max_tokens=max_tokens, head_k=K)


def _runner(tok, sampler, factory, **cfg):
    c = EnvConfig(fn="x:y", **{"max_turns": 4, "timeout_s": 2.0, **cfg})
    rows = {0: dict(ROW), 1: dict(ROW)}
    delta = ChatDelta(tok, tok.eos_token_id)
    return EnvSampler(
        lambda: sampler, factory, delta, c, row_fn=rows.__getitem__, max_model_len=400
    )


def _expert(tok):
    eos = tok.eos_token_id
    turns = [
        tok.encode(t, add_special_tokens=False) + [eos] for t in Calculator().demonstration(ROW)
    ]
    return lambda i: turns[min(i, len(turns) - 1)]


def test_calculator_episode_is_token_exact_with_mask_and_versions(tok):
    s = Scripted(_expert(tok))
    runner = _runner(tok, s, Calculator)
    # a resync between turns: turn 0 under version 3, the later turns under version 4
    orig = s.generate

    def gen(prompts, params, slot_ids=None, request_id=None):
        yield from orig(prompts, params, slot_ids)
        s.version = 4

    s.version = 3
    s.generate = gen  # type: ignore[method-assign]
    (r,) = list(runner.generate([[1]], _params(), slot_ids=[0]))
    assert r.reward == 1.0 and r.finish_reason == "done" and r.episode["turns"] == 3
    full = r.prompt_ids.tolist() + r.response_ids.tolist()
    # every turn: the sampler saw a prefix of the final sequence and generated the next tokens
    for sent, gen_ids, _ in s.calls:
        assert full[: len(sent)] == sent
        assert full[len(sent) : len(sent) + len(gen_ids)] == gen_ids
    assert r.prompt_ids.tolist() == s.calls[0][0]
    # loss mask: 1 exactly on generated tokens; environment tokens are the template's deltas
    mask = r.loss_mask
    P = len(r.prompt_ids)
    expect = np.zeros(len(r.response_ids), np.float32)
    for sent, gen_ids, _ in s.calls:
        expect[len(sent) - P : len(sent) - P + len(gen_ids)] = 1.0
    np.testing.assert_array_equal(mask, expect)
    env_text = tok.decode(r.response_ids[mask == 0].tolist())
    assert "<|im_start|>tool\n47+38" not in env_text and "85" in env_text and "90" in env_text
    # log-probs / head kept on generated tokens, zero on environment tokens
    assert np.all(r.logprobs[mask == 0] == 0) and np.all(r.logprobs[mask == 1] < 0)
    # one weight version per generated token (two versions across the resync), -1 on env tokens
    ver = r.token_versions()
    assert set(ver[mask == 1].tolist()) == {3, 4} and np.all(ver[mask == 0] == -1)
    first = len(s.calls[0][1])
    assert np.all(ver[:first] == 3) and np.all(ver[mask == 1][first:] == 4)
    # into the trainer's packed batch: mask 0 and version -1 on environment tokens
    b = pack_rollouts([r], seq_len=len(full) + 1, head_k=K)
    sl = slice(P - 1, P - 1 + len(r.response_ids))
    np.testing.assert_array_equal(b.mask[0, sl], mask)
    np.testing.assert_array_equal(b.version[0, sl], ver)
    assert np.all(b.lp_q[0, sl][mask == 0] == 0) and np.all(b.lq_head[0, sl][mask == 0] == 0)
    np.testing.assert_array_equal(b.input_ids[0, : len(full)], full)
    assert runner.totals()["env/silent_mismatches"] == 0


# Qwen3-style: the last assistant turn gets an empty think block, earlier ones do not; tool
# messages go into a user turn as <tool_response>; enable_thinking=false pre-fills the think block
THINK_GATED = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def test_env_delta_is_not_a_retokenized_history(tok):
    """The newline after <|im_end|> belongs to the environment's delta (verl #6921)."""
    d = ChatDelta(tok, tok.eos_token_id)
    text = d.answer_text([{"role": "tool", "content": "85"}])
    assert text == "\n<|im_start|>tool\n85<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("thinking", [True, False])
def test_env_delta_with_a_think_gated_template(tok, thinking):
    import copy

    t = copy.copy(tok)
    t.chat_template = THINK_GATED
    d = ChatDelta(t, tok.eos_token_id, enable_thinking=thinking)
    tail = "" if thinking else "<think>\n\n</think>\n\n"
    got = d.answer_text([{"role": "tool", "content": "85"}])
    assert got == (
        "\n<|im_start|>user\n<tool_response>\n85\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n" + tail
    )
    got = d.answer_text([{"role": "user", "content": "again"}])
    assert got == "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n" + tail


@pytest.mark.parametrize("side", ["left", "right", "error"])
def test_oversized_answer_is_truncated_or_ends_the_episode(tok, side):
    class Verbose:
        def reset(self, row):
            return [{"role": "user", "content": "go"}]

        def step(self, completion):
            return [{"role": "user", "content": "alpha " + "7 " * 200 + "omega"}], 0.5, False

    eos = tok.eos_token_id
    s = Scripted(lambda i: [5, 6, eos])
    runner = _runner(tok, s, Verbose, max_env_tokens_per_turn=30, truncation_side=side)
    (r,) = list(runner.generate([[1]], _params(), slot_ids=[0]))
    if side == "error":
        assert r.finish_reason == "env_oversized" and r.episode["turns"] == 1
        return
    assert r.finish_reason == "max_turns" and r.episode["turns"] == 4
    env = r.response_ids[r.loss_mask == 0]
    assert len(env) <= 3 * 30
    text = tok.decode(env.tolist())
    assert ("omega" in text) == (side == "left") and ("alpha" in text) == (side == "right")
    assert r.reward == pytest.approx(2.0)  # four turns of 0.5 (reward: sum)


def test_max_total_tokens_and_length_end_the_episode(tok):
    class Never:
        def reset(self, row):
            return [{"role": "user", "content": "go"}]

        def step(self, completion):
            return [{"role": "user", "content": "again"}], 1.0, False

    eos = tok.eos_token_id
    runner = _runner(tok, Scripted(lambda i: [5] * 20 + [eos]), Never, max_total_tokens=60)
    (r,) = list(runner.generate([[1]], _params(), slot_ids=[0]))
    assert r.finish_reason == "max_total_tokens"
    assert len(r.prompt_ids) + len(r.response_ids) <= 60
    runner = _runner(tok, Scripted(lambda i: [5] * 20), Never)  # never ends its turn
    (r,) = list(runner.generate([[1]], _params(max_tokens=8), slot_ids=[0]))
    assert r.finish_reason == "length" and r.episode["turns"] == 1 and r.reward == 1.0


class Raising:
    def reset(self, row):
        return [{"role": "user", "content": "go"}]

    def step(self, completion):
        raise RuntimeError("boom")


class RaisingReset:
    def reset(self, row):
        raise KeyError("no such field")

    def step(self, completion):
        return [], 1.0, True


def _garbage(value):
    class Garbage:
        def reset(self, row):
            return [{"role": "user", "content": "go"}]

        def step(self, completion):
            return value

    return Garbage


@pytest.mark.parametrize(
    "factory",
    [
        Raising,
        RaisingReset,
        _garbage(None),
        _garbage(([], float("nan"), True)),
        _garbage(([{"role": "assistant", "content": "x"}], 0.0, False)),
        _garbage(([{"role": "user", "content": 7}], 0.0, False)),
        _garbage("done"),
        lambda: 1 / 0,
    ],
    ids=["step", "reset", "none", "nan", "role", "content", "str", "factory"],
)
def test_broken_environment_ends_its_episode_with_a_counted_reason(tok, factory):
    eos = tok.eos_token_id
    runner = _runner(tok, Scripted(lambda i: [5, eos]), factory)
    out = list(runner.generate([[9, 9], [9, 9]], _params(), slot_ids=[0, 1]))
    assert [r.finish_reason for r in out] == ["env_error"] * 2
    assert all(r.reward == 0.0 and r.episode["errors"] == 1 for r in out)
    t = runner.totals()
    assert t["env/errors"] == 2 and t["env/end_env_error"] == 2
    if factory in (RaisingReset,) or not isinstance(factory, type):
        if factory is RaisingReset or factory.__name__ == "<lambda>":
            # no opening: the trainer still gets a (learn-nothing) row for the cell
            assert all(len(r.response_ids) == 0 and r.prompt_ids.tolist() == [9, 9] for r in out)
            b = pack_rollouts(out, seq_len=8, head_k=K)
            assert b.mask.sum() == 0


def test_prefix_break_errors_or_splits(tok):
    eos = tok.eos_token_id

    def altered(p):  # a sampler that does not see what it was sent at turn 2 (only)
        return p if not 20 < len(p) < 120 else p[:-1] + [p[-1] + 1]

    s = Scripted(_expert(tok), echo=altered)
    with pytest.raises(PrefixBreakError):
        list(_runner(tok, s, Calculator).generate([[1]], _params(), slot_ids=[0]))
    s = Scripted(_expert(tok), echo=altered)
    runner = _runner(tok, s, Calculator, on_prefix_break="split")
    (r,) = list(runner.generate([[1]], _params(), slot_ids=[0]))
    # every break starts a new sequence from the sampler's own tokens; the episode runs to its end
    assert r.finish_reason == "done" and r.episode["turns"] == 3 and r.reward == 1.0
    assert r.episode["splits"] == 1 and len(r.segment_starts) == 1
    assert runner.totals()["env/prefix_breaks"] == 1 and runner.totals()["env/splits"] == 1
    assert runner.totals()["env/silent_mismatches"] == 0 and r.episode["mismatches"] == 0
    P, resp = len(r.prompt_ids), r.response_ids.tolist()
    full = r.prompt_ids.tolist() + resp
    bounds = [0] + [P + j for j in r.segment_starts] + [len(full)]
    # each sequence of the row: what the sampler saw (its own echo at the break) and generated
    (s0, g0, _), (s1, g1, _), (s2, g2, _) = s.calls
    assert full[: len(s0)] == s0 and full[len(s0) : len(s0) + len(g0)] == g0
    b1 = bounds[1]
    assert full[b1 : b1 + len(s1)] == altered(s1) != s1
    assert full[b1 + len(s1) : b1 + len(s1) + len(g1)] == g1
    assert full[b1 : b1 + len(s2)] == s2 and full[b1 + len(s2) :] == g2
    # all three turns are trained (mask 1 on every generated token, 0 on echoes and env answers)
    assert r.loss_mask.sum() == sum(len(g) for _, g, _ in s.calls)
    assert np.all(r.loss_mask[list(r.segment_starts)] == 0)
    assert resp.count(eos) >= 3
    # in the trainer's row: two segments, positions restart, targets never cross a split
    for pack in (pack_rollouts([r], seq_len=len(full) + 2, head_k=K),):
        seg = pack.segment_ids[0, : len(full)]
        assert [int(seg[a]) for a in bounds[:-1]] == [1, 2]
        assert [int(pack.positions[0, a]) for a in bounds[:-1]] == [0, 0]
        assert pack.mask[0, : len(full)].sum() == r.loss_mask.sum()
        assert all(pack.mask[0, a - 1] == 0 for a in bounds[1:-1])
    # packed with another rollout: segment ids keep counting after the split ones
    packed = pack_by_tokens([r, r], row_len=2 * len(full) + 1, head_k=K)
    assert packed.segment_ids[0].max() == 4 and packed.mask.sum() == 2 * r.loss_mask.sum()
    # a split that would not fit in max_total_tokens ends the episode at the break (counted)
    s = Scripted(_expert(tok), echo=altered)
    runner = _runner(tok, s, Calculator, on_prefix_break="split", max_total_tokens=200)
    (r,) = list(runner.generate([[1]], _params(), slot_ids=[0]))
    assert r.finish_reason == "prefix_break" and r.episode["turns"] == 1 and not r.segment_starts
    n0 = len(s.calls[0][1])
    assert r.response_ids[:n0].tolist() == s.calls[0][1] and r.loss_mask.sum() == n0


def test_seeded_turns_get_their_own_seeds(tok):
    """A seeded request draws each prompt's noise from the seed and the prompt's place in the
    request (the JAX backend). The episodes of a request run in lockstep, turn t of all of them
    in one request: each turn's request must get a seed of its own (else every turn would replay
    the first one's noise), and the episodes sit at distinct places in it."""
    s = Scripted(_expert(tok))
    runner = _runner(tok, s, Calculator)
    p = SamplingParams(n=1, max_tokens=200, head_k=K, seed=7)
    out = list(runner.generate([[1], [1]], p, slot_ids=[0, 1]))
    assert [r.episode["turns"] for r in out] == [3, 3]
    assert len(s.requests) == 3 and all(slots == [0, 1] for slots, _ in s.requests)
    assert len({seed for _, seed in s.requests}) == 3 and None not in s.seeds
    s = Scripted(_expert(tok))  # unseeded requests stay unseeded
    list(_runner(tok, s, Calculator).generate([[1]], _params(), slot_ids=[0]))
    assert s.seeds == [None, None, None]


def test_a_slot_twice_in_a_request_goes_to_separate_turn_requests(tok):
    """Lockstep turns are matched back to their episodes by slot id: two episodes with one slot
    id are sampled in separate requests, each gets its own rollout."""
    eos = tok.eos_token_id
    answer = tok.encode("#### 90", add_special_tokens=False) + [eos]
    s = Scripted(lambda i: answer)
    runner = _runner(tok, s, Calculator)
    out = list(runner.generate([[1], [1], [1]], _params(), slot_ids=[0, 0, 1]))
    assert [slots for slots, _ in s.requests] == [[0, 1], [0]]
    assert sorted(r.slot_id for r in out) == [0, 0, 1] and all(r.reward == 1.0 for r in out)


def test_async_environment(tok):
    class AsyncEnv:
        async def reset(self, row):
            await asyncio.sleep(0)
            return [{"role": "user", "content": row["prompt"]}]

        async def step(self, completion):
            return [], 0.25, True

    eos = tok.eos_token_id
    (r,) = list(
        _runner(tok, Scripted(lambda i: [5, eos]), AsyncEnv).generate([[1]], _params(), [0])
    )
    assert r.finish_reason == "done" and r.reward == 0.25


def test_reward_last_and_feedback_env(tok):
    eos = tok.eos_token_id
    wrong = tok.encode("#### 7", add_special_tokens=False) + [eos]
    right = tok.encode("#### 90", add_special_tokens=False) + [eos]
    s = Scripted(lambda i: wrong if i < 2 else right)
    (r,) = list(_runner(tok, s, Feedback).generate([[1]], _params(), slot_ids=[0]))
    assert r.finish_reason == "done" and r.episode["turns"] == 3
    assert r.episode["turn_rewards"] == [0.0, 0.0, 0.25] and r.reward == 0.25
    assert "try again" in tok.decode(r.response_ids[r.loss_mask == 0].tolist())


def test_tool_call_parsing_and_calc():
    text = "x " + format_tool_call("calc", {"expr": "3+5"}) + ' <tool_call>{"name": 1}</tool_call>'
    calls, errors = parse_tool_calls(text + "<tool_call>{not json</tool_call><tool_call>")
    assert [(c.name, c.arguments) for c in calls] == [("calc", {"expr": "3+5"})]
    assert len(errors) == 3  # bad name, not JSON, unclosed
    assert calc("12+7*2") == "26"
    for bad in ("__import__('os')", "2**99", "1/0", "a+b"):
        with pytest.raises(ValueError):
            calc(bad)
    env = Calculator()
    env.reset(ROW)
    msgs, r, done = env.step(format_tool_call("calc", {"expr": "47+38"}))
    assert msgs == [{"role": "tool", "content": "85"}] and not done
    msgs, r, done = env.step(format_tool_call("nope", {}))
    assert "unknown tool" in msgs[0]["content"]
    assert env.step("#### 90") == ([], 1.0, True)
    assert Calculator(demo_direct=1.0).demonstration(ROW) == ["#### 90"]
    assert len(Calculator(demo_direct=0.0).demonstration(ROW)) == 3
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(20) for b in range(20)]
    direct = [len(Calculator(demo_direct=0.5).demonstration(r)) == 1 for r in rows]
    assert 0.4 < np.mean(direct) < 0.6
    assert env.step("#### 91") == ([], 0.0, True)


def test_load_env_factory_and_config_errors():
    from dlc_jax.trainer.config import ConfigError, load_config

    f = load_env_factory("dlc_jax.env.builtin.calculator:Calculator", {"correct": 2.0})
    assert f().correct == 2.0
    with pytest.raises(ValueError, match="env.fn"):
        load_env_factory("no_such_module_xyz:Env")
    with pytest.raises(ValueError, match="env.fn"):
        load_env_factory("dlc_jax.env.builtin.calculator:Nope")
    for override, key in [
        ("env.max_turns=0", "env.max_turns"),
        ("env.fn=nocolon", "env.fn"),
        ("env.truncation_side=middle", "env.truncation_side"),
        ("env.on_prefix_break=ignore", "env.on_prefix_break"),
        ("env.max_total_tokens=100000", "env.max_total_tokens"),
        ("env.nope=1", "env.nope"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(None, [override])
        assert str(e.value).startswith(key), str(e.value)
    assert load_config("tiny_tool_cpu", ["eval.every=5"]).eval.every == 5  # env episodes
    with pytest.raises(ConfigError, match="^moe.router_replay"):
        load_config("tiny_tool_cpu", ["moe.router_replay=sampler"])
    cfg = load_config("tiny_tool_cpu")
    assert cfg.env.enabled and cfg.env.max_total_tokens <= cfg.sampler.max_model_len


def test_the_environments_page_example_runs(tok):
    """docs/ENVIRONMENTS.md's GuessNumber, as printed, through the episode runner."""
    import pathlib
    import re

    page = pathlib.Path(__file__).parents[2] / "docs" / "ENVIRONMENTS.md"
    code = re.search(r"```python\n(.*?)```", page.read_text(), re.S).group(1)
    ns: dict = {}
    exec(compile(code, str(page), "exec"), ns)
    eos = tok.eos_token_id
    guesses = ["50", "90"]  # the row's answer is 90: "higher" after 50
    s = Scripted(lambda i: tok.encode(guesses[i], add_special_tokens=False) + [eos])
    (r,) = list(_runner(tok, s, ns["GuessNumber"]).generate([[1]], _params(), slot_ids=[0]))
    assert r.finish_reason == "done" and r.episode["turns"] == 2 and r.reward == 1.0
    assert "higher" in tok.decode(r.response_ids[r.loss_mask == 0].tolist())


def test_env_eval_runs_episodes_and_scores_their_reward(tok):
    """eval.every with env.fn: one episode per eval row through the sampler, scored by the
    episode's reward; its counters stay apart from the training EnvSampler's."""
    from dlc_jax.env.evaluate import EnvEvaluator

    s = Scripted(_expert(tok))  # the expert's turns for ROW (47+38+5 = 90)
    rows = [dict(ROW, row=0), dict(ROW, answer="91", row=1), dict(ROW, row=2)]
    cfg = EnvConfig(fn="dlc_jax.env.builtin.calculator:Calculator", max_turns=4)
    ev = EnvEvaluator(cfg, tok, rows, max_model_len=400, correct_min=1.0)
    s.version = 7
    m = ev.run(s, SamplingParams(n=1, max_tokens=200, temperature=0.0, head_k=0), "eval-3")
    assert m["eval/accuracy"] == pytest.approx(2 / 3) == m["eval/reward_mean"]
    assert m["eval/turns"] == 3 and m["eval/env_errors"] == 0 and m["eval/version"] == 7
    assert m["eval/response_len"] == sum(len(_expert(tok)(i)) for i in range(3))
    # three turns, all rows of a turn in one request
    assert [sorted(slots) for slots, _ in s.requests] == [[0, 1, 2]] * 3
    # the first turn's prompt is the environment's opening (the row's prompt), not a given one
    assert "47+38+5=" in tok.decode(s.calls[0][0])
