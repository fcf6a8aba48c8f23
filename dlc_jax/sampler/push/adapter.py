"""LoRA adapter pushes (``WeightHeader.kind = "lora_adapter"``): only the factors, in PEFT names
(``base_model.model.M.lora_A.weight`` [rank, in], ``...lora_B.weight`` [out, rank]), staged and
swapped like a full push. The sampler serves ``W + (alpha / rank) * B @ A`` (fp32), ``W`` its
start-up base; an adapter trained on another base is refused before any byte is staged."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
from collections.abc import Callable, Iterable, Iterator

import crc32c
import numpy as np

from ..wire import safetensors_io as st
from ..wire import sampler_pb2 as pb
from .staging import WeightStager
from .weight_checks import PUSH_DTYPES, PushError

ADAPTER_KIND = "lora_adapter"
PEFT_PREFIX = "base_model.model."
FACTORS = ("lora_A", "lora_B")
# never adapted (vLLM drops an lm_head delta from prompt log-probs; embeddings are lookups)
NOT_ADAPTED = ("lm_head", "embed_tokens")


@dataclasses.dataclass(frozen=True)
class AdapterMeta:
    """An adapter push's rank, alpha and the fingerprint of the base it was trained on."""

    rank: int
    alpha: float
    base: str

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_header(cls, h: pb.WeightHeader) -> AdapterMeta:
        return cls(int(h.adapter_rank), float(h.adapter_alpha), h.adapter_base)

    def fill(self, h: pb.WeightHeader) -> None:
        """Mark ``h`` as an adapter push of this adapter."""
        h.kind, h.adapter_base = ADAPTER_KIND, self.base
        h.adapter_rank, h.adapter_alpha = int(self.rank), float(self.alpha)


def base_fingerprint(named_tensors: Iterable[tuple[str, np.ndarray]]) -> str:
    """A short hash of a base model's HF tensors (name, shape, CRC-32C of the float32 values, so
    bf16 and its fp32 load agree), computed by the trainer and the sampler alike."""
    rows = []
    for name, a in named_tensors:
        x = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
        rows.append(
            f"{name}:{tuple(x.shape)}:{crc32c.crc32c(x.reshape(-1).view(np.uint8).data):08x}"
        )
    return hashlib.sha256("".join(sorted(rows)).encode()).hexdigest()[:16]


def peft_name(module: str, factor: str) -> str:
    return f"{PEFT_PREFIX}{module}.{factor}.weight"


def split_name(name: str) -> tuple[str, str]:
    """(HF module name, factor) of a PEFT factor name; ValueError for anything else."""
    if name.startswith(PEFT_PREFIX) and name.endswith(".weight"):
        mod, _, factor = name[len(PEFT_PREFIX) : -len(".weight")].rpartition(".")
        if mod and factor in FACTORS:
            return mod, factor
    raise ValueError(f"{name!r} is not a PEFT LoRA factor name")


def _adaptable(expected: st.Specs) -> Iterator[tuple[str, int, int]]:
    """(module, out, in) of every 2-D ``*.weight`` of ``expected`` but the embeddings and head."""
    for name, (shape, _) in expected.items():
        mod = name[: -len(".weight")]
        if len(shape) == 2 and name.endswith(".weight") and not any(n in mod for n in NOT_ADAPTED):
            yield mod, int(shape[0]), int(shape[1])


def adapter_specs(expected: st.Specs, rank: int) -> st.Specs:
    """{PEFT name: (shape, 'float32')} of every factor an adapter of ``rank`` may carry."""
    out: st.Specs = {}
    for mod, n_out, n_in in _adaptable(expected):
        out[peft_name(mod, "lora_A")] = ((rank, n_in), "float32")
        out[peft_name(mod, "lora_B")] = ((n_out, rank), "float32")
    return out


def validate_adapter_specs(allowed: st.Specs, specs: st.Specs) -> None:
    """An adapter push's names, shapes and dtypes: a non-empty subset of ``allowed`` holding both
    factors of each module it adapts."""
    if not specs:
        raise PushError.invalid("adapter push with no tensors")
    for name, (shape, dtype) in specs.items():
        if name not in allowed:
            raise PushError.invalid(
                f"adapter tensor {name!r} is not a LoRA factor of a projection of the served model"
            )
        want = allowed[name][0]
        if tuple(shape) != tuple(want):
            raise PushError.invalid(
                f"adapter tensor {name!r}: shape {list(shape)} != expected {list(want)} "
                f"(header.adapter_rank and the served model)"
            )
        if dtype not in PUSH_DTYPES:
            raise PushError.invalid(
                f"adapter tensor {name!r}: dtype {dtype!r} not one of {PUSH_DTYPES}"
            )
    for name in specs:
        mod, factor = split_name(name)
        other = peft_name(mod, "lora_B" if factor == "lora_A" else "lora_A")
        if other not in specs:
            raise PushError.invalid(f"adapter push has {name!r} without {other!r}")


def check_meta(meta: AdapterMeta, check_base: Callable[[int], str]) -> None:
    """PushError unless ``meta`` is a valid adapter trained on the base ``check_base(rank)``
    fingerprints (`SamplerBackend.adapter_base`; its ValueError is FAILED_PRECONDITION too)."""
    if meta.rank < 1 or not (math.isfinite(meta.alpha) and meta.alpha > 0):
        raise PushError.invalid(
            f"adapter push: adapter_rank {meta.rank} must be >= 1 and adapter_alpha "
            f"{meta.alpha} finite and > 0"
        )
    try:
        ours = check_base(meta.rank)
    except ValueError as e:
        raise PushError.precondition(str(e)) from None
    if meta.base != ours:
        raise PushError.precondition(
            f"adapter push refused: its adapter was trained on base {meta.base or '(none)'}, "
            f"this sampler's base is {ours}; the current weights keep serving"
        )


def check_rank(expected: st.Specs, rank: int) -> None:
    """PushError when ``rank`` exceeds every adaptable projection's min(out, in)."""
    most = max((min(n_out, n_in) for _, n_out, n_in in _adaptable(expected)), default=0)
    if rank > most:
        raise PushError.invalid(
            f"adapter push: adapter_rank {rank} > {most}, the largest rank a projection of the "
            "served model can hold"
        )


def check_adapter(
    expected: st.Specs,
    adapter: dict[str, np.ndarray],
    meta: AdapterMeta,
    check_base: Callable[[int], str],
) -> None:
    """Every check `AdapterStager` makes, for an adapter in memory (the in-process sampler)."""
    check_meta(meta, check_base)
    check_rank(expected, meta.rank)
    validate_adapter_specs(
        adapter_specs(expected, meta.rank),
        {n: (tuple(a.shape), str(a.dtype)) for n, a in adapter.items()},
    )
    for n, a in adapter.items():
        if not np.isfinite(a).all():
            raise PushError.invalid(f"adapter tensor {n!r} has non-finite values")


class AdapterStager(WeightStager):
    """`WeightStager` for an adapter push; ``check_base``: as in `check_meta`."""

    def __init__(self, expected, *args, check_base: Callable[[int], str], **kwargs):
        super().__init__(expected, *args, **kwargs)
        self._full = expected
        self._check_base = check_base
        self.meta: AdapterMeta | None = None

    def header(self, h: pb.WeightHeader) -> None:
        if h.kind != ADAPTER_KIND:
            raise PushError.invalid(
                f"header.kind {h.kind!r} is not '' (a full push) or {ADAPTER_KIND!r}"
            )
        meta = AdapterMeta.from_header(h)
        if h.relay_to:
            raise PushError.invalid("adapter pushes are not relayed (push each)")
        check_meta(meta, self._check_base)
        check_rank(self._full, meta.rank)
        self.expected = adapter_specs(self._full, meta.rank)
        super().header(h)
        self.meta = meta

    def validate(self, seen: st.Specs) -> None:
        validate_adapter_specs(self.expected, seen)


def read_adapter(adapter_dir: str | pathlib.Path) -> dict[str, np.ndarray]:
    """The staged adapter's factors (float32)."""
    return {n: np.asarray(a, np.float32) for n, a in st.iter_tensors(adapter_dir)}


def merged_tensors(
    base: Iterable[tuple[str, np.ndarray]], adapter: dict[str, np.ndarray], scale: float
) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, ``W + scale * B @ A`` in float32) of every module ``adapter`` adapts, ``W`` from
    the (HF name, array) pairs ``base``."""
    mods = {split_name(n)[0] for n in adapter}
    for name, w in base:
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        if mod not in mods:
            continue
        a, b = adapter[peft_name(mod, "lora_A")], adapter[peft_name(mod, "lora_B")]
        yield name, np.asarray(w, np.float32) + np.float32(scale) * (b @ a)


def write_peft_dir(adapter_dir: str | pathlib.Path, meta: AdapterMeta) -> pathlib.Path:
    """Make the staged adapter directory a PEFT adapter directory (as vLLM's LoRA loader reads)."""
    d = pathlib.Path(adapter_dir)
    names = sorted({split_name(n)[0].rsplit(".", 1)[-1] for n in st.read_specs(d)})
    target = d / "adapter_model.safetensors"
    if not target.exists():
        (f,) = st.safetensors_files(d)
        os.replace(f, target)
    cfg = peft_adapter_config(meta.rank, meta.alpha, names)
    (d / "adapter_config.json").write_text(json.dumps(cfg) + "\n")
    return d


def peft_adapter_config(
    rank: int, alpha: float, target_modules: list[str], base: str | None = None
) -> dict:
    """PEFT's ``adapter_config.json`` for LoRA factors on ``target_modules`` (e.g. ``q_proj``);
    ``base``: the base model's name or path, when known."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        **({} if base is None else {"base_model_name_or_path": base}),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": target_modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
    }
