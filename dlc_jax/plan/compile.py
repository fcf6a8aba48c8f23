"""Ahead-of-time compilation of the run's programs for the plan's devices, and what XLA reports.
A compile that runs out of HBM (``RESOURCE_EXHAUSTED: ... exceeds available HBM``) becomes a
:class:`ProgramReport` with ``oom`` set instead of an exception."""

from __future__ import annotations

import dataclasses
import logging
import re
import time

import jax

from dlc_jax.plan.hlo_bytes import ARRAY_RE, loop_weighted_bytes, shape_bytes

log = logging.getLogger(__name__)

_OOM_RE = re.compile(r"\(([\d.]+)([KMGT])\)\s*exceeds available HBM\s*\(([\d.]+)([KMGT])\)")
_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclasses.dataclass
class ProgramReport:
    """Per-device memory (bytes) and cost of one compiled program. ``peak`` = arguments + outputs +
    temporaries - aliased. ``xla_flops``: XLA's cost analysis (loop bodies once, Pallas kernels 0).
    ``oom``: the compiler's message when it ran out of HBM (sizes then are the compiler's)."""

    name: str
    compile_s: float
    compile_cpu_s: float = 0.0  # CPU seconds of this process (all threads): less load-sensitive
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    code_bytes: int = 0
    xla_flops: float = 0.0
    xla_bytes_accessed: float = 0.0  # XLA's cost analysis: HBM bytes read + written (bodies once)
    collective_bytes: dict = dataclasses.field(default_factory=dict)  # per kind, from the HLO
    windowed_einsum_loops: int = 0  # collective matmuls in the optimized HLO
    # the HLO's HBM bytes with each loop body once / times its trip count (`plan.hlo_bytes`)
    hlo_bytes_once: float = 0.0
    hlo_bytes_weighted: float = 0.0
    oom: str = ""
    oom_required_bytes: int = 0
    oom_available_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        if self.oom:
            return self.oom_required_bytes
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["peak_bytes"] = self.peak_bytes
        return d


def _oom_report(name: str, seconds: float, cpu_s: float, msg: str) -> ProgramReport:
    m = _OOM_RE.search(msg)
    req, avail = (int(float(m[i]) * _UNIT[m[i + 1]]) for i in (1, 3)) if m else (0, 0)
    line = next(
        (ln.strip() for ln in msg.splitlines() if "RESOURCE_EXHAUSTED" in ln), msg.splitlines()[0]
    )
    return ProgramReport(
        name=name,
        compile_s=seconds,
        compile_cpu_s=cpu_s,
        oom=line[:300],
        oom_required_bytes=req,
        oom_available_bytes=avail,
    )


def compile_program(name: str, jitted, *args) -> ProgramReport:
    """Lower and compile ``jitted(*args)`` (sharded ShapeDtypeStructs); read its analyses."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        compiled = jitted.lower(*args).compile()
    except Exception as e:  # noqa: BLE001 - the TPU compiler raises XlaRuntimeError / ValueError
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        log.info("%s: compiler ran out of HBM", name)
        return _oom_report(name, time.perf_counter() - t0, time.process_time() - c0, str(e))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    hlo = compiled.as_text() or ""
    log.info("%s: compiled in %.1f s", name, seconds)
    loop_bytes = loop_weighted_bytes(hlo)
    return ProgramReport(
        name=name,
        compile_s=seconds,
        compile_cpu_s=cpu,
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes),
        temp_bytes=int(mem.temp_size_in_bytes),
        code_bytes=int(mem.generated_code_size_in_bytes),
        xla_flops=float((cost or {}).get("flops", 0.0)),
        xla_bytes_accessed=float((cost or {}).get("bytes accessed", 0.0)),
        collective_bytes=collective_bytes(hlo),
        windowed_einsum_loops=windowed_loops(hlo),
        hlo_bytes_once=loop_bytes["once"],
        hlo_bytes_weighted=loop_bytes["weighted"],
    )


_COLLECTIVE_RE = re.compile(
    r"= ((?:\([^=]*?\))|(?:[a-z0-9]+\[[\d,]*\][^ ]*)) "
    r"(all-gather|reduce-scatter|all-reduce|ragged-all-to-all|all-to-all|collective-permute)"
    r"(?:-start)?\("
)


def collective_bytes(hlo: str) -> dict[str, int]:
    """Result bytes per collective kind on one device (async pairs once, loop bodies once)."""
    out: dict[str, int] = {}
    for shape, kind in _COLLECTIVE_RE.findall(hlo):
        b = shape_bytes(shape)
        if shape.startswith("("):  # async start: (operand, result[, scratch]): the result
            parts = [shape_bytes(m.group(0)) for m in ARRAY_RE.finditer(shape)]
            b = parts[1] if len(parts) > 1 else b
        out[kind] = out.get(kind, 0) + b
    return out


def windowed_loops(hlo: str) -> int:
    """Distinct HLO names marking a collective matmul (``windowed_dot_general`` loops, bodies)."""
    return len(set(re.findall(r"%([\w.]*windowed[\w.]*)", hlo)))


def compile_run(run, step_cfg) -> dict[str, ProgramReport]:
    """Compile the real jitted train step and the theta_s forward of ``run`` (an AbstractRun)."""
    from dlc_jax.trainer.step import make_snapshot_logprobs, make_train_step

    step = make_train_step(
        run.graphdef,
        run.tx,
        step_cfg,
        mesh=run.mesh,
        param_shardings=jax.tree.map(lambda x: x.sharding, run.params),
        opt_shardings=jax.tree.map(lambda x: x.sharding, run.opt_state),
        trainable=run.trainable,
    )
    snap = make_snapshot_logprobs(run.graphdef, step_cfg)
    return {
        "train_step": compile_program("train_step", step, run.params, run.opt_state, run.batch),
        "snapshot_forward": compile_program("snapshot_forward", snap, run.params, run.batch),
    }
