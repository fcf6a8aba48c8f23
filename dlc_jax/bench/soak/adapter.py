"""The adapter soak: hostile LoRA adapter pushes through the staged stream (`AdapterStager`) and the
in-process sampler (whose served weights must not change), and damaged checkpoints read by fresh
``dlc-jax export`` processes (`damaged_restore`); counts acceptances, crashes, files and exports.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dlc_jax.model.config import shape_kwargs

from .. import common
from ..lora_bench import random_adapters

DIMS = shape_kwargs("soak", tie_word_embeddings=False)
RANK, ALPHA = 4, 8.0


def _model():
    """The base model and a function adding random rank-``RANK`` adapters to it."""
    from flax import nnx

    from dlc_jax.lora import LoraConfig
    from dlc_jax.model.config import Qwen3Config
    from dlc_jax.model.qwen3 import Qwen3ForCausalLM

    m = Qwen3ForCausalLM(Qwen3Config(**DIMS), rngs=nnx.Rngs(0))
    return m, lambda: random_adapters(m, LoraConfig(rank=RANK, alpha=ALPHA), 0.3)


def hostile_cases(tensors: list, base: str) -> dict:
    """name -> (tensors, AdapterMeta) of each hostile push (the stream cut is staged apart)."""
    from dlc_jax.sampler.push.adapter import AdapterMeta

    meta = AdapterMeta(RANK, ALPHA, base)
    nan = [(n, a.copy()) for n, a in tensors]
    nan[0][1].flat[0] = np.nan
    (a_name, a), (b_name, b) = tensors[0], tensors[1]
    ghost = a_name.replace("layers.0.", "layers.99.")
    return {
        "nan_factors": (nan, meta),
        "inf_factors": ([(n, np.full_like(x, np.inf)) for n, x in tensors], meta),
        "wrong_rank": (tensors, AdapterMeta(RANK + 1, ALPHA, base)),
        "rank_0": (tensors, AdapterMeta(0, ALPHA, base)),
        "huge_rank": (tensors, AdapterMeta(2**30, ALPHA, base)),
        "missing_target": ([(ghost, a), (ghost.replace("lora_A", "lora_B"), b)], meta),
        "lone_factor": (tensors[:1], meta),
        "mismatched_pair": ([(a_name, a), (b_name, b[:, :-1])], meta),
        "other_base": (tensors, AdapterMeta(RANK, ALPHA, "fedcba9876543210")),
        "alpha_nan": (tensors, AdapterMeta(RANK, float("nan"), base)),
    }


def _staged(expected, messages, staging: Path, base: str) -> str:
    """The row column counting one push stream through a real AdapterStager: 'ok' (refused),
    'accepted' or 'crashes'."""
    from dlc_jax.sampler.push.adapter import AdapterStager
    from dlc_jax.sampler.push.weight_checks import PushError
    from dlc_jax.sampler.wire import chunk_wire

    stager = AdapterStager(expected, 0, str(staging), check_base=lambda rank: base)
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
                stager.commit()
                return "accepted"
        return "ok"  # refused: the stream ended without a commit
    except PushError:
        return "ok"
    except Exception:  # noqa: BLE001 - counted
        return "crashes"
    finally:
        stager.discard()  # as the server does after every stream


def run(out_dir, repeats: int = 10) -> dict:
    """Run the adapter soak; write ``<out_dir>/adapter_soak.{json,md}``; return the result."""
    from dlc_jax.lora import LoraConfig
    from dlc_jax.lora.push import adapter_messages, adapter_tensors, hf_base_fingerprint
    from dlc_jax.model.hf_io import hf_param_shapes, save_hf
    from dlc_jax.sampler.backends.base import BackendConfig
    from dlc_jax.sampler.client.inprocess import InProcessSampler
    from dlc_jax.trainer.lora_push import adapter_pusher

    cols = ["scenario", "cases", "ok", "crashes", "accepted", "bad_weights_served", "seconds"]
    res = common.new_result("adapter_soak", "Hostile adapter pushes and damaged exports", cols)
    rows = []
    counts = {"files_left": 0, "exports_written": 0}
    with tempfile.TemporaryDirectory(prefix="dlc_adapter_soak_") as tmp:
        work = Path(tmp)
        base_model, adapt = _model()
        base_dir = save_hf(base_model, work / "base")
        m = adapt()
        expected = {n: (tuple(s), "float32") for n, s in hf_param_shapes(m.config).items()}
        tensors = adapter_tensors(m)
        base = hf_base_fingerprint(m)
        sampler = InProcessSampler(BackendConfig(model_dir=str(base_dir), max_model_len=32))
        b = sampler.backend
        good = adapter_pusher(
            LoraConfig(rank=RANK, alpha=ALPHA, push="adapter"), multi=False, backend="inprocess"
        ).push(sampler, m, 1)
        assert good.ok, good
        staging = work / "staging"
        staging.mkdir()
        cases = hostile_cases(tensors, base)
        msgs = list(adapter_messages(tensors, 1, cases["nan_factors"][1]))
        raw = [i for i, x in enumerate(msgs) if isinstance(x, (bytes, bytearray, memoryview))]
        for name, (ts, meta) in [*cases.items(), ("cut_mid_stream", (None, None))]:
            t0 = time.monotonic()
            row = {"scenario": name, "cases": 2, **dict.fromkeys(cols[2:6], 0)}
            cut = msgs[: raw[len(raw) // 2]] + msgs[-1:]
            stream = cut if ts is None else adapter_messages(ts, 2, meta)
            row[_staged(expected, stream, staging, base)] += 1
            if ts is None:  # the in-process path has no stream to cut: the whole refusal again
                ts, meta = cases["lone_factor"]
            before, version = b._state, sampler.info()["version"]
            try:
                row["accepted" if sampler.push_adapter(ts, 2, meta).ok else "ok"] += 1
            except Exception:  # noqa: BLE001 - counted
                row["crashes"] += 1
            changed = b._state is not before or sampler.info()["version"] != version
            row["bad_weights_served"] += changed
            row["seconds"] = round(time.monotonic() - t0, 2)
            rows.append(row)
        counts["files_left"] = len(list(staging.iterdir()))
        sampler.close()
        rows.append(_exports(work, base_dir, repeats, counts))
    res["rows"] = [{k: r.get(k, 0) for k in cols} for r in rows]
    s = res["summary"] = common.case_totals(rows, "crashes", "accepted", "bad_weights_served")
    s.update(counts)
    keys = ("crashes", "accepted", "bad_weights_served", "files_left", "exports_written")
    res["targets"] = common.zero_targets(s, {k.replace("_", " "): k for k in keys})
    res["targets"].append(common.target("failed cases", s["failed_cases"], 0, "<="))
    return common.finish_soak(res, out_dir)


def _exports(work: Path, base_dir: Path, repeats: int, counts: dict) -> dict:
    """``repeats`` fresh ``dlc-jax export`` processes of a damaged checkpoint (patterns in turn)."""
    from .damaged_restore import export_args, repeat
    from .hostile_cases import _make_checkpoint

    t0 = time.monotonic()
    good = _make_checkpoint(base_dir, work / "exp" / "good")
    runs = repeat(good, work / "exp", export_args(work / "exp" / "out"), repeats, 600)
    counts["exports_written"] = sum(r["written"] for r in runs)
    return {
        "scenario": f"export_damaged_x{repeats}",
        "cases": len(runs),
        "ok": sum(r["verdict"] is None for r in runs),
        "crashes": sum(r["verdict"] == "traceback" for r in runs),
        "seconds": round(time.monotonic() - t0, 2),
    }


if __name__ == "__main__":  # python -m dlc_jax.bench.soak.adapter OUT_DIR [REPEATS]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "soak_out", reps)["summary"]))
