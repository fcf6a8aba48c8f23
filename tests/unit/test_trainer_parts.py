"""The trainer's parts on their own: hooks at their intervals, and the batch collector against the
in-process sampler (slot order, refusals dropped with filler rows, no reconnect) -- no process, no
server, no reward workers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlc_jax.trainer.hooks import Hook, Hooks, StepInfo


def test_hooks_run_at_their_interval_in_order_and_merge_their_metrics():
    seen = []

    def ev(info):
        seen.append(("eval", info.step))
        return {"eval/accuracy": 0.5}

    def log(info):
        seen.append(("log", info.step, dict(info.row)))

    hooks = Hooks([Hook("eval", 2, ev)])
    hooks.add("log", 1, log)
    hooks.add("never", 0, lambda info: pytest.fail("every=0 never runs"))
    for step in (1, 2, 3, 4):
        hooks.run(StepInfo(step, {"loss": float(step)}))
    assert hooks.names() == ["eval", "log", "never"]
    assert seen == [
        ("log", 1, {"loss": 1.0}),
        ("eval", 2),
        ("log", 2, {"loss": 2.0, "eval/accuracy": 0.5}),  # eval's metrics land in the row
        ("log", 3, {"loss": 3.0}),
        ("eval", 4),
        ("log", 4, {"loss": 4.0, "eval/accuracy": 0.5}),
    ]
    with pytest.raises(ValueError, match="every must be >= 0"):
        hooks.add("bad", -1, log)


def _collector(tiny_dir, tiny_tokenizer, tmp_path, rows, *, max_model_len):
    from flax import nnx  # noqa: F401  (the model below is an NNX module)

    from dlc_jax.data.prompts import PromptPipeline
    from dlc_jax.model import load_hf
    from dlc_jax.sampler.backends import BackendConfig
    from dlc_jax.sampler.client.inprocess import InProcessSampler
    from dlc_jax.trainer.batch_requests import BatchCollector
    from dlc_jax.trainer.config import default_config_path, load_config
    from dlc_jax.trainer.sampler_link import SamplerLink
    from dlc_jax.trainer.state import TrainState, make_optimizer

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in rows))
    cfg = load_config(
        default_config_path(),
        [
            f"model.path={tiny_dir}",
            "sampler.backend=inprocess",
            "sampler.n=2",
            "sampler.max_tokens=3",
            "sampler.head_k=2",
            f"train.batch_prompts={len(rows)}",
            f"data.source={data}",
            "data.shuffle=false",
        ],
    )
    prompts = PromptPipeline(cfg.data, tiny_tokenizer, len(rows), process_index=0, process_count=1)
    sampler = InProcessSampler(
        BackendConfig(model_dir=str(tiny_dir), max_model_len=max_model_len, max_n=2, max_head_k=2)
    )
    link = SamplerLink(
        cfg.sampler, model_dir=tiny_dir, log_dir=str(tmp_path), multi=False, sampler=sampler
    )
    link.connect()
    state = TrainState.create(load_hf(str(tiny_dir)), make_optimizer(cfg.optim, 1))
    counters = {"dropped_invalid": 0}

    def recover(err):
        pytest.fail(f"a refusal must not recover the sampler: {err}")

    collector = BatchCollector(
        cfg,
        data=prompts,
        link=link,
        state=state,
        recover=recover,
        counters=counters,
        eos_id=int(tiny_tokenizer.eos_token_id),
    )
    return collector, counters, sampler


def test_collector_fills_every_cell_in_slot_order(tiny_dir, tiny_tokenizer, tmp_path):
    rows = ["What is 1 + 1?", "What is 2 + 2?", "What is 3 + 3?"]
    bc, counters, sampler = _collector(tiny_dir, tiny_tokenizer, tmp_path, rows, max_model_len=64)
    b = bc.open(0)
    assert bc.open(0) is b and b.index == 0 and len(b.prompts) == 3
    bc.request(0)
    out = bc.collect(0)
    assert [(r.slot_id, r.sample_index) for r in out] == [
        (s, g) for s in b.local_slots for g in range(2)
    ]
    assert all(r.version_spans == [(0, 0, len(r.response_ids))] for r in out)
    assert counters["dropped_invalid"] == 0 and sampler.info()["requests"] == 2  # one per g
    assert bc.metrics() == {
        "dropped_stale": 0,
        "dropped_old_version": 0,
        "rejected_unknown_version": 0,
    }
    assert bc.data_state_before(0) == b.data_state
    bc.close(0)
    assert 0 not in bc.batches


def test_a_prompt_the_sampler_refuses_is_dropped_with_filler_rows(
    tiny_dir, tiny_tokenizer, tmp_path, caplog
):
    """A prompt too long for the sampler (it passes the trainer's load checks) is refused: its
    request is asked again one slot per request, the slot refused on its own is dropped (counted,
    its data row named) and its rows are fillers that teach nothing; the batch keeps its size."""
    long = "What is " + " + ".join(str(i) for i in range(40)) + "?"
    rows = ["What is 1 + 1?", long, "What is 3 + 3?"]
    bc, counters, _ = _collector(tiny_dir, tiny_tokenizer, tmp_path, rows, max_model_len=24)
    b = bc.open(0)
    bc.request(0)
    out = bc.collect(0)
    long_slot = b.local_slots[1]
    assert b.dropped == {long_slot} and counters["dropped_invalid"] == 1
    assert len(out) == 3 * 2 and [r.slot_id for r in out[2:4]] == [long_slot] * 2
    assert [r.slot_id for r in out[:2] + out[4:]] == [b.local_slots[0]] * 2 + [b.local_slots[2]] * 2
    for r in out[2:4]:  # filler rows: nothing to learn from
        assert np.all(r.logprobs == 0) and len(r.response_ids) <= 1
    assert any("data row 1" in m for m in caplog.messages)


def test_sigint_latch_silences_only_a_recorded_interrupt_python_could_not_raise():
    import gc
    import sys

    from dlc_jax.trainer.guards import SigintLatch

    seen = []
    before = sys.unraisablehook
    sys.unraisablehook = recording = lambda u: seen.append(type(u.exc_value).__name__)

    class RaisesOnDel:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            raise self.exc

    try:
        latch = SigintLatch().install()
        RaisesOnDel(KeyboardInterrupt())  # not recorded: not the latch's, so still reported
        latch.caught = True  # a Ctrl-C the handler recorded, then swallowed in a callback
        RaisesOnDel(KeyboardInterrupt())
        RaisesOnDel(ValueError("other"))  # any other exception is still reported
        gc.collect()
        latch.restore()
        assert sys.unraisablehook is recording  # restore puts back the hook it found
        RaisesOnDel(KeyboardInterrupt())
        gc.collect()
    finally:
        sys.unraisablehook = before
    assert seen == ["KeyboardInterrupt", "ValueError", "KeyboardInterrupt"]
