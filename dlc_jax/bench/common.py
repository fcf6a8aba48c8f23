"""Shared plumbing of the benchmarks: timing, machine description, result files, markdown tables.
A result is a JSON-able dict: {"name", "title", "machine", "config", "columns": [str], "rows":
[{column: value}], "targets": [{"name", "value", "target", "op", "met"}], "notes": [str], "wall_s"}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dlc_jax.model.config import SHAPES as MODEL_SHAPES
from dlc_jax.model.config import ModelShape


def machine_info() -> dict:
    """Host facts that matter for reading a timing: CPUs, load, backend, library versions."""
    info: dict[str, Any] = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        info["loadavg_1m_5m_15m"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every OS
        info["loadavg_1m_5m_15m"] = None
    try:
        import jax

        info.update(
            jax=jax.__version__,
            jax_backend=jax.default_backend(),
            device_kind=jax.devices()[0].device_kind,
            device_count=jax.device_count(),
        )
    except Exception as e:  # pragma: no cover - jax is a hard dependency
        info["jax_error"] = repr(e)
    return info


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux /proc), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def load_note(info: dict) -> str:
    """One sentence describing machine load (the CPU is shared with other work)."""
    la = info.get("loadavg_1m_5m_15m")
    if not la:
        return "load average unknown"
    end = info.get("loadavg_at_end")
    end_s = f", {end[0]}/{end[1]}/{end[2]} at the end" if end else ""
    return (
        f"load average {la[0]}/{la[1]}/{la[2]} (1/5/15 min) at the start{end_s} on "
        f"{info.get('cpu_count')} CPUs; "
        f"ratios are measured interleaved in the same process, absolute times are load-sensitive"
    )


def block(x):
    """Wait for every jax array in the pytree ``x`` (no-op for other leaves)."""
    import jax

    for leaf in jax.tree.leaves(x):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return x


def time_interleaved(
    fns: dict[str, Callable[[], Any]], *, warmup: int = 1, repeats: int = 3
) -> dict[str, list[float]]:
    """Time several callables round-robin (A B A B ...) so background load hits them alike, each
    after ``warmup`` untimed calls -> {name: [seconds per repeat]}."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for fn in fns.values():
        for _ in range(warmup):
            block(fn())
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            block(fn())
            out[k].append(time.perf_counter() - t0)
    return out


def token_batch(rng, vocab: int, batch: int, length: int):
    """Random token ids [batch, length] (int32) and their next-token targets (shifted by one, a
    random last column), drawn from ``rng`` in that order."""
    import numpy as np

    ids = rng.integers(0, vocab, (batch, length), dtype=np.int32)
    nxt = rng.integers(0, vocab, (batch, 1), dtype=np.int32)
    return ids, np.concatenate([ids[:, 1:], nxt], axis=1)


def median(xs: Iterable[float]) -> float:
    return float(statistics.median(list(xs)))


def best(xs: Iterable[float]) -> float:
    """The reported estimator: the fastest repeat (load only adds time; as ``timeit`` advises)."""
    return float(min(xs))


def best_times(result: dict, times: dict[str, list[float]]) -> dict[str, float]:
    """{name: `best` of its repeats}; ``result`` keeps the medians and every repeat."""
    result["median_s"] = {k: median(v) for k, v in times.items()}
    result["times_s"] = times
    return {k: best(v) for k, v in times.items()}


def target(name: str, value: float | None, bound: float, op: str) -> dict:
    """A target check; ``op`` is '>=' or '<='. ``met`` is None when the value is missing."""
    if op not in (">=", "<="):
        raise ValueError(f"target op must be '>=' or '<=', got {op!r}")
    met = None if value is None else bool(value >= bound if op == ">=" else value <= bound)
    return {"name": name, "value": value, "target": bound, "op": op, "met": met}


def fmt(v: Any) -> str:
    """Compact cell text: floats to 4 significant digits, None as 'n/a'."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == 0:
            return "0"
        if abs(v) >= 1e5 or abs(v) < 1e-3:
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v)


def markdown_table(columns: list[str], rows: list[dict]) -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "| " + " | ".join("---" for _ in columns) + " |"
    body = [
        "| " + " | ".join(fmt(r.get(c)).replace("|", "\\|") for c in columns) + " |" for r in rows
    ]
    return "\n".join([head, sep, *body])


def target_row(t: dict) -> dict:
    """A `target` as a row of a targets table."""
    met = "n/a" if t["met"] is None else ("yes" if t["met"] else "NO")
    bound = f"{t['op']} {fmt(t['target'])}"
    return {"target": t["name"], "measured": t["value"], "bound": bound, "met": met}


def to_markdown(result: dict) -> str:
    """The result as a markdown section: title, table, targets, notes, machine line."""
    parts = [f"## {result.get('title', result['name'])}", ""]
    if result.get("rows"):
        parts += [markdown_table(result["columns"], result["rows"]), ""]
    if result.get("targets"):
        rows = list(map(target_row, result["targets"]))
        parts += ["Targets:", "", markdown_table(["target", "measured", "bound", "met"], rows), ""]
    parts += [f"- {n}" for n in result.get("notes", [])]
    m = result.get("machine", {})
    parts.append(
        f"- machine: {m.get('device_kind', '?')} x{m.get('device_count', '?')} "
        f"({m.get('jax_backend', '?')}), {load_note(m)}; bench wall time "
        f"{fmt(result.get('wall_s'))} s"
    )
    if result.get("sections"):  # extra markdown (e.g. per-case details) after the notes
        parts += ["", *result["sections"]]
    return "\n".join(parts) + "\n"


def write_result(result: dict, out_dir) -> str:
    """Write ``<out>/<name>.json`` and ``<out>/<name>.md``; return the markdown."""
    for key in ("name", "columns", "rows", "machine"):
        if key not in result:
            raise KeyError(f"benchmark result is missing field {key!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = to_markdown(result)
    (out / f"{result['name']}.json").write_text(
        json.dumps(result, indent=2, allow_nan=True, default=lambda x: x.tolist()) + "\n"
    )
    (out / f"{result['name']}.md").write_text(md)
    return md


def new_result(name: str, title: str, columns: list[str], config=None) -> dict:
    """An empty result (see the module doc); ``config``: the benchmark's config dataclass."""
    return {
        "name": name,
        "title": title,
        "machine": machine_info(),
        "config": {} if config is None else dataclasses.asdict(config),
        "columns": columns,
        "rows": [],
        "targets": [],
        "notes": [],
        "wall_s": None,
        "_t0": time.perf_counter(),
    }


def finish(result: dict, out_dir=None) -> dict:
    """Stamp the wall time and the load at the end; with ``out_dir``, also `write_result`."""
    t0 = result.pop("_t0", None)
    if t0 is not None:
        result["wall_s"] = time.perf_counter() - t0
    result["machine"]["loadavg_at_end"] = machine_info().get("loadavg_1m_5m_15m")
    if out_dir is not None:
        write_result(result, out_dir)
    return result


def zero_targets(values: dict, names: dict[str, str]) -> list[dict]:
    """A `target` ``<= 0`` per ``names`` item (label: the key of its value in ``values``)."""
    return [target(label, values[key], 0, "<=") for label, key in names.items()]


def finish_soak(res: dict, out_dir=None, examples=()) -> dict:
    """A soak part's `finish`: its ``examples`` and the load note appended to the notes."""
    res["notes"] += list(examples)
    res["notes"].append(load_note(res["machine"]))
    return finish(res, out_dir)


def totals(rows: Iterable[dict], *keys: str) -> dict[str, Any]:
    """{key: its sum over ``rows``} (a missing or None value counts 0)."""
    rows = list(rows)
    return {k: sum(r.get(k) or 0 for r in rows) for k in keys}


def case_totals(rows: list[dict], *keys: str) -> dict[str, Any]:
    """`totals` of case rows: ``cases``, ``failed_cases`` (cases - ok) and each key's sum."""
    t = totals(rows, "cases", "ok", *keys)
    return {"cases": t["cases"], "failed_cases": t["cases"] - t.pop("ok"), **t}


def cached_run(out: Path, cmd: list[str], what: str, annotate, *, force, timeout_s, env=None):
    """The JSON file ``out`` (reused unless ``force``), else what ``cmd`` + [a temporary path]
    writes, passed through ``annotate(result, completed process, {"wall_s", "loadavg_start",
    "loadavg_end"})`` and saved as ``out``; a RuntimeError naming ``what`` if it writes nothing."""
    if out.exists() and not force:
        return json.loads(out.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.json")
    load0, t0 = os.getloadavg(), time.perf_counter()
    proc = subprocess.run(
        [*cmd, str(tmp)], env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if not tmp.exists():
        raise RuntimeError(f"{what} failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
    run = {
        "wall_s": time.perf_counter() - t0,
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    r = annotate(json.loads(tmp.read_text()), proc, run)
    out.write_text(json.dumps(r, indent=1, sort_keys=True))
    tmp.unlink()
    return r


def raw_receiver(total: int, out_path: Path, chunk: int):
    """A loopback TCP receiver thread writing ``total`` bytes to ``out_path``, then acking (b"k").
    -> (listening socket, thread, errors): the thread's exception, if any, lands in ``errors``."""
    srv = socket.create_server(("127.0.0.1", 0))
    errors: list[BaseException] = []

    def receive():
        try:
            conn, _ = srv.accept()
            view = memoryview(bytearray(chunk))
            got = 0
            with conn, open(out_path, "wb") as f:
                while got < total:
                    n = conn.recv_into(view, min(chunk, total - got))
                    if n == 0:
                        raise ConnectionError(f"sender closed after {got} of {total} bytes")
                    f.write(view[:n])
                    got += n
                f.flush()
                conn.sendall(b"k")
        except BaseException as e:  # noqa: BLE001 - surfaced to the caller
            errors.append(e)
        finally:
            srv.close()

    th = threading.Thread(target=receive, daemon=True)
    th.start()
    return srv, th, errors


def raw_send(address, arrays: Iterable) -> float:
    """Send the arrays' bytes over one TCP connection to a `raw_receiver` at ``address`` (host,
    port); -> seconds from connect until its ack."""
    import numpy as np

    t0 = time.perf_counter()
    with socket.create_connection(address) as s:
        for a in arrays:
            s.sendall(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
        if s.recv(1) != b"k":
            raise ConnectionError("no ack from the raw receiver")
    return time.perf_counter() - t0


def measure(fn: Callable[[], Any], pids: Iterable[int] = ()) -> tuple[Any, float, float, Any]:
    """Call ``fn`` once -> (its result, wall seconds, CPU seconds of this process, CPU seconds of
    the processes ``pids``: None when none of them can be read)."""
    pids = list(pids)

    def others() -> float | None:
        known = [c for c in map(proc_cpu_s, pids) if c is not None]
        return sum(known) if known or not pids else None

    c0, o0, t0 = time.process_time(), others(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    me, o1 = time.process_time() - c0, others()
    return out, wall, me, None if o0 is None or o1 is None else o1 - o0


def accepted(push_result, who: str = "the bench sampler"):
    """``push_result`` (a `PushResult`) if the sampler took the push, else a RuntimeError."""
    if not push_result.ok:
        raise RuntimeError(f"weight push rejected by {who}: {push_result.message}")
    return push_result


def call_in_child(module: str, fn: str, *args, env: dict | None = None, timeout=None):
    """``module.fn(*args)`` run in a fresh Python process (environment ``env``; arguments and
    result as JSON, the result on the last stdout line) -> its result."""
    code = (
        f"import json, sys; from {module} import {fn}; "
        f"print(json.dumps({fn}(*json.loads(sys.stdin.read()))), flush=True)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(list(args)),
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


class Options:
    """A benchmark's `add_args` / `from_args` over its named configs (`SIZES`). Each option is
    ``(flag, config field, argparse keywords or an on/off flag's help[, convert])``; an unset one
    (None, "", False) keeps the size's value, a given one sets the field (to ``convert(value)``)."""

    def __init__(self, bench: str, sizes: dict, *options: tuple):
        self.bench, self.sizes, self.options = bench, sizes, options

    def add_args(self, p) -> None:
        for flag, _, kw, *_ in self.options:
            kw = {"action": "store_true", "help": kw} if isinstance(kw, str) else kw
            p.add_argument(flag, **{"default": None, **kw})

    def from_args(self, size: str, args):
        """The `size` config with ``args`` applied (a KeyError names an unknown size)."""
        if size not in self.sizes:
            raise KeyError(
                f"unknown {self.bench} bench size {size!r}; choose from {sorted(self.sizes)}"
            )
        kw = {}
        for flag, field, _, *convert in self.options:
            v = getattr(args, flag.lstrip("-").replace("-", "_"), None)
            if not (v is None or v is False or v == ""):
                kw[field] = convert[0](v) if convert else v
        return dataclasses.replace(self.sizes[size], **kw)


QWEN3_DIMS = tuple(f.name for f in dataclasses.fields(ModelShape))


@dataclasses.dataclass(frozen=True)
class BenchShape(ModelShape):
    """A benchmark's config: the dims of the Qwen3 it builds (random weights, tied embeddings)."""

    def model_config(self, **extra):
        """A tied-embedding `Qwen3Config` of these dims (``extra``: more of its fields)."""
        from dlc_jax.model import Qwen3Config

        dims = {k: getattr(self, k) for k in QWEN3_DIMS}
        return Qwen3Config(**dims, tie_word_embeddings=True, **extra)


# The model shapes of the benchmarks' size presets (`shape`), by bench name.
SHAPES: dict[str, ModelShape] = {
    "tiny": MODEL_SHAPES["bench_tiny"],
    "small": MODEL_SHAPES["bench_small"],
    "qwen3_0p6b": MODEL_SHAPES["Qwen3-0.6B"],
}


def shape(name: str, **changes: int) -> dict[str, Any]:
    """The fields of `SHAPES` [name] (with ``changes``), to build a benchmark config from."""
    return dataclasses.asdict(dataclasses.replace(SHAPES[name], **changes))
