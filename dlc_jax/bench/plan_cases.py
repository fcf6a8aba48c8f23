"""The cases of `dlc-jax bench plan` (docs/bench/PLAN.md) and of our side of `dlc-jax bench
plan-peers`: model size, slice, rows x length, micro-batches and overrides per `dlc-jax plan` run,
each keyed by a hash of its arguments (the cached JSON's name)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

PACKAGE = Path(__file__).parents[1]
CONFIGS = {
    "0.6B": "configs/qwen3_0p6b_dlc.yaml",
    "1.7B": "configs/qwen3_1p7b_dlc.yaml",
    "8B": "configs/qwen3_8b_dlc.yaml",
    "30B-A3B": "configs/qwen3_30b_a3b_dlc.yaml",
}


@dataclasses.dataclass(frozen=True)
class PlanCase:
    """One plan: model size, topology, rows x length, micro-batches, extra overrides."""

    model: str
    topology: str
    rows: int
    seq_len: int
    micro_batches: int = 1
    slices: int = 1
    extra: tuple[str, ...] = ()
    before: str = ""  # the measurement of the same case before (issue 14), if any
    shipped: bool = False  # the config file as shipped, on its plan.topology (no overrides)

    @property
    def key(self) -> str:
        text = json.dumps(dataclasses.asdict(self) | {"before": ""}, sort_keys=True)
        return (
            f"{self.model}_{self.topology}_{self.rows}x{self.seq_len}_"
            + hashlib.sha256(text.encode()).hexdigest()[:8]
        )

    def argv(self) -> list[str]:
        if self.shipped:
            return ["--config", CONFIGS[self.model]]
        n = 8 if self.rows % 8 == 0 else 1
        args = ["--config", CONFIGS[self.model], "--topology", self.topology]
        args += [f"train.batch_prompts={self.rows // n}", f"sampler.n={n}"]
        args += [f"sampler.max_model_len={self.seq_len}"]
        args += [f"train.micro_batches={self.micro_batches}", *self.extra]
        return args + (["--slices", str(self.slices)] if self.slices > 1 else [])


# issue 14's setting: head K=20, remat on, fp32 params, bf16 compute, data=1 fsdp=8 tensor=1
TODAY = ("mesh.data=1", "mesh.fsdp=-1", "mesh.tensor=1")
BEFORE = (
    PlanCase("0.6B", "v5p-16", 16, 2048, 2, extra=TODAY, before="7.2 GiB/chip, compile 232 s"),
    PlanCase("1.7B", "v5p-16", 8, 8192, 1, extra=TODAY, before="24.1 GiB/chip, compile 433 s"),
    PlanCase(
        "1.7B", "v5p-16", 8, 32768, 1, extra=TODAY, before="does not fit: 154.65 GB temporaries"
    ),
)
# (model, v5p slice, rows, micro-batches on it), (v5e slice, rows, micro-batches)
MATRIX_SLICES = {
    "0.6B": (("v5p-8", 8, 1), ("v5litepod-16", 16, 1)),
    "1.7B": (("v5p-16", 8, 1), ("v5litepod-32", 32, 1)),
    "8B": (("v5p-64", 64, 2), ("v5litepod-64", 64, 1)),
}
LENGTHS = (4096, 16384, 32768)


def _max_tokens(model: str) -> int:
    """The response budget of the model's shipped config (sampler.max_tokens)."""
    import yaml

    # from the package (configs/ links to dlc_jax/configs), so importing works from any directory
    cfg = yaml.safe_load((PACKAGE / CONFIGS[model]).read_text()) or {}
    return int((cfg.get("sampler") or {}).get("max_tokens") or 0)


def matrix_cases() -> tuple[PlanCase, ...]:
    """Every model at every length on its two slices; where a config's response budget leaves no
    room for a prompt at a length (the 8B's 15,360 tokens at 4,096), the budget is halved to fit."""
    out = []
    for model, slices in MATRIX_SLICES.items():
        budget = _max_tokens(model)
        for topo, rows, micro in slices:
            for length in LENGTHS:
                fit = (f"sampler.max_tokens={length // 2}",) if budget >= length else ()
                out.append(PlanCase(model, topo, rows, length, micro, extra=TODAY + fit))
    return tuple(out)


TWO_SLICE = (PlanCase("1.7B", "v5p-16", 16, 16384, 1, slices=2, extra=TODAY),)
# the shipped configs on their plan.topology; the 8B one is the 64 x 16,384 on v5p-64 target
SHIPPED = (
    PlanCase("8B", "v5p-64", 64, 16384, 2, shipped=True),
    PlanCase("0.6B", "v5litepod-16", 512, 2048, 4, shipped=True),
    PlanCase("1.7B", "v5litepod-32", 1024, 2048, 8, shipped=True),
    # Qwen3-30B-A3B (mixture of experts, routing replay) at 8k-token responses
    PlanCase("30B-A3B", "v5p-64", 64, 8192, 2, shipped=True),
)
TARGETS = (BEFORE[2], SHIPPED[0])  # 1.7B 8 x 32,768 on v5p-16; 8B 64 x 16,384 on v5p-64


def dedupe(cases) -> tuple[PlanCase, ...]:
    """One case per (model, slice, rows x length, micro-batches); the first listed wins (the
    targets and shipped configs come first), keeping a 'before' figure from any duplicate."""
    seen: dict[tuple, PlanCase] = {}
    for c in cases:
        k = (c.model, c.topology, c.rows, c.seq_len, c.micro_batches, c.slices)
        if k not in seen:
            seen[k] = c
        elif c.before and not seen[k].before:
            seen[k] = dataclasses.replace(seen[k], before=c.before)
    return tuple(seen.values())


def our_case(cache_dir: str, model: str, topo: str, rows: int, length: int):
    """The `PlanCase` of our side of a `dlc-jax bench plan-peers` row; "1.7B:2" is the model cut to
    2 layers, its config.json under ``cache_dir``/models (the path is part of the case's key)."""
    extra: tuple[str, ...] = TODAY
    if ":" in model:
        name, layers = model.split(":")
        path = Path(cache_dir) / "models" / f"Qwen3-{name}-{layers}layers"
        model, extra = name, (*TODAY, f"model.path={path}")
    return PlanCase(model, topo, rows, length, 1, extra=extra)


def peer_json(cache_dir: str | Path, model: str, topo: str, rows: int, length: int) -> Path:
    """Where `dlc-jax bench plan-peers` caches tunix's compile of a row ("1.7B:2" -> "1.7B_L2")."""
    tag = model.replace(":", "_L")
    return Path(cache_dir) / f"tunix_grpo_{tag}_{topo}_{rows}x{length}.json"
