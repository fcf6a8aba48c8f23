"""Qwen3 and Qwen3-MoE architecture configs: read/write HF `config.json` dicts, plus presets for
released sizes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

ATTENTION_IMPLS = ("auto", "splash", "cudnn", "xla", "dense")
REMAT_POLICIES = ("none", "full", "save_dots", "save_attn_out", "save_dots_and_attn_out")
SCAN_MIN_LAYERS = 8  # scan_layers=None scans models with at least this many layers
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
_POSITIVE = (*_REQUIRED, "head_dim")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


class UnsupportedModelError(ValueError):
    """config.json describes a model this package does not implement."""


def check_choice(name: str, value: Any, choices: Any) -> None:
    """A ValueError "<name> must be one of <choices>, got <value>" unless ``value`` is one."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A Qwen3 decoder's dimensions (HF `config.json` names; Qwen3-0.6B's by default)."""

    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128


@dataclasses.dataclass(frozen=True)
class Qwen3Config(ModelShape):
    """A Qwen3 decoder: HF `config.json` fields, then how the model runs."""

    tie_word_embeddings: bool = True
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    # ---- how the model runs (not part of HF config.json; see docs/MODEL.md) ----
    attention_impl: str = "auto"  # ATTENTION_IMPLS; auto: splash on TPU, cudnn on GPU (bf16), dense
    scan_layers: bool | None = None  # lax.scan over stacked layers; None: >= SCAN_MIN_LAYERS layers
    remat_policy: str = "none"  # REMAT_POLICIES: what a decoder layer keeps for the backward pass

    def __post_init__(self):
        check_choice("Qwen3Config.attention_impl", self.attention_impl, ATTENTION_IMPLS)
        check_choice("Qwen3Config.remat_policy", self.remat_policy, REMAT_POLICIES)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        for f in _POSITIVE:
            if int(getattr(self, f)) <= 0:
                raise ValueError(f"Qwen3Config.{f} must be positive, got {getattr(self, f)}")

    @property
    def use_scan(self) -> bool:
        """Whether the decoder layers are stacked and scanned (resolves scan_layers=None)."""
        if self.scan_layers is None:
            return self.num_hidden_layers >= SCAN_MIN_LAYERS
        return bool(self.scan_layers)

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` is a mixture-of-experts layer (never, for dense Qwen3)."""
        del layer
        return False

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **options) -> Qwen3Config:
        """From an HF config dict and run `options`; `UnsupportedModelError` names what is not."""
        check_family(d, "Qwen3ForCausalLM", "qwen3")
        options.pop("moe_impl", None)  # a dense model has no experts: the kernel choice is moot
        options.pop("moe_dispatch", None)
        return cls(**hf_common_kwargs(d), **options)

    @classmethod
    def from_pretrained(cls, path, **options) -> Qwen3Config:
        """Read `<path>/config.json` (or a config.json file path); `options` as in from_hf_dict."""
        return cls.from_hf_dict(read_hf_config(path), **options)

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF `config.json` dict that transformers and vLLM load as Qwen3ForCausalLM."""
        d = {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelShape)},
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_hidden_layers,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "initializer_range": 0.02,
            "use_cache": True,
            "dtype": "float32",
        }
        ids = {k: getattr(self, k) for k in _TOKEN_IDS}
        return d | {k: v for k, v in ids.items() if v is not None}

    def replace(self, **kw) -> Qwen3Config:
        return dataclasses.replace(self, **kw)


MOE_IMPLS = ("auto", "ragged", "dense", "megablox")
# how tokens split over the `expert` mesh axis reach their experts (megablox only; moe_a2a.py)
MOE_DISPATCHES = ("allgather", "all_to_all")


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig(Qwen3Config):
    """Qwen3-MoE (HF `model_type: qwen3_moe`): a sparse layer's MLP routes each token to the top
    `num_experts_per_tok` of `num_experts` experts of width `moe_intermediate_size`. Layer i is
    sparse unless in `mlp_only_layers` or (i + 1) % `decoder_sparse_step` != 0."""

    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001  # HF's value, written back on export (we train with 0)
    # ---- how the model runs (not part of HF config.json; see docs/MODEL.md) ----
    # expert matmuls: auto (megablox on TPU, else ragged) | ragged (lax.ragged_dot) | dense (the
    # masked reference) | megablox (Pallas grouped matmul under shard_map; interpreted off TPU)
    moe_impl: str = "auto"
    # megablox, tokens split over `expert`: allgather (+ reduce-scatter) | all_to_all (moe_a2a.py)
    moe_dispatch: str = "allgather"

    def __post_init__(self):
        super().__post_init__()
        check_choice("Qwen3MoeConfig.moe_impl", self.moe_impl, MOE_IMPLS)
        check_choice("Qwen3MoeConfig.moe_dispatch", self.moe_dispatch, MOE_DISPATCHES)
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"Qwen3MoeConfig.num_experts_per_tok={self.num_experts_per_tok} must be in "
                f"[1, num_experts={self.num_experts}]"
            )
        if self.decoder_sparse_step < 1:
            raise ValueError("Qwen3MoeConfig.decoder_sparse_step must be >= 1")
        if self.scan_layers and not self.uniform_layers:
            raise ValueError(
                "Qwen3MoeConfig.scan_layers=True needs every layer of one kind (sparse or dense): "
                f"mlp_only_layers={list(self.mlp_only_layers)}, "
                f"decoder_sparse_step={self.decoder_sparse_step}"
            )

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` has the mixture-of-experts MLP (HF's rule)."""
        return (
            layer not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def uniform_layers(self) -> bool:
        return len({self.is_sparse(i) for i in range(self.num_hidden_layers)}) == 1

    @property
    def use_scan(self) -> bool:
        """As Qwen3Config's, but a model mixing sparse and dense layers is never scanned."""
        return super().use_scan and self.uniform_layers

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **options) -> Qwen3MoeConfig:
        check_family(d, "Qwen3MoeForCausalLM", "qwen3_moe")
        kw = hf_common_kwargs(d)
        kw["num_experts"] = int(d.get("num_experts", d.get("num_local_experts", 0)))
        for name, cast, default in _MOE_FIELDS[1:]:  # KeyError for a required one that is missing
            kw[name] = cast(d[name] if default is None else d.get(name, default))
        return cls(**kw, **options)

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF `config.json` dict that transformers and vLLM load as Qwen3MoeForCausalLM."""
        d = super().to_hf_dict()
        d.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe")
        d.update({name: getattr(self, name) for name, _, _ in _MOE_FIELDS})
        d.update(mlp_only_layers=list(self.mlp_only_layers), output_router_logits=False)
        return d


# The MoE fields of HF config.json: (name, type, default when absent; None: required)
_MOE_FIELDS = (
    ("num_experts", int, 0),
    ("num_experts_per_tok", int, None),
    ("moe_intermediate_size", int, None),
    ("norm_topk_prob", bool, False),
    ("decoder_sparse_step", int, 1),
    ("mlp_only_layers", lambda v: tuple(int(x) for x in v or ()), ()),
    ("router_aux_loss_coef", float, 0.001),
)


def read_hf_config(path) -> dict[str, Any]:
    """`<path>/config.json` (or a config.json file path) as a dict."""
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    if not f.exists():
        raise FileNotFoundError(f"no config.json at {f}")
    return json.loads(f.read_text())


def check_family(d: dict[str, Any], architecture: str, model_type: str) -> None:
    """An `UnsupportedModelError` unless the HF config dict ``d`` lists ``architecture`` (or,
    listing none, is of ``model_type``)."""
    archs = d.get("architectures") or []
    if (architecture not in archs) if archs else (d.get("model_type") != model_type):
        raise UnsupportedModelError(
            f"unsupported architecture {archs} (model_type={d.get('model_type')!r}); "
            f"expected {architecture}"
        )


def hf_common_kwargs(d: dict[str, Any]) -> dict[str, Any]:
    """The fields every Qwen3-family config reads from an HF config dict (attention, RoPE, norms,
    vocabulary); raises `UnsupportedModelError` for what no family implements (RoPE scaling,
    attention bias, sliding window, an activation other than silu)."""
    rope = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if scaling or rope_type not in ("default", None):
        raise UnsupportedModelError(
            f"unsupported rope scaling {scaling or rope!r}; "
            "only plain RoPE (rope_scaling=None) is implemented"
        )
    if d.get("attention_bias"):
        raise UnsupportedModelError("unsupported attention_bias=True (Qwen3 has no attention bias)")
    if d.get("use_sliding_window"):
        raise UnsupportedModelError("unsupported use_sliding_window=True")
    if d.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"unsupported hidden_act {d['hidden_act']!r}; expected 'silu'")
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    return dict(
        **{k: d[k] for k in _REQUIRED},
        num_attention_heads=heads,
        num_key_value_heads=d.get("num_key_value_heads", heads),
        head_dim=d.get("head_dim") or hidden // heads,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        rope_theta=float(theta),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=d.get("max_position_embeddings", 40960),
        **{k: d.get(k) for k in _TOKEN_IDS},
    )


# Named model dimensions (released Qwen3 sizes, `make_tiny`'s defaults, benchmark and soak shapes),
# in `ModelShape`'s field order.
SHAPES: dict[str, ModelShape] = {
    name: ModelShape(*dims)
    for name, dims in {
        "Qwen3-0.6B": (151936, 1024, 3072, 28, 16, 8, 128),
        "Qwen3-1.7B": (151936, 2048, 6144, 28, 16, 8, 128),
        "Qwen3-4B": (151936, 2560, 9728, 36, 32, 8, 128),
        "Qwen3-8B": (151936, 4096, 12288, 36, 32, 8, 128),
        "Qwen3-30B-A3B": (151936, 2048, 6144, 48, 32, 4, 128),
        "tiny": (2048, 128, 256, 2, 4, 2, 32),
        "bench_tiny": (512, 64, 128, 2, 4, 2, 16),
        "bench_small": (32768, 512, 1536, 4, 8, 4, 64),
        "soak": (61, 32, 48, 2, 4, 2, 8),
    }.items()
}


def shape_kwargs(name: str, **changes: Any) -> dict[str, Any]:
    """The fields of `SHAPES` [name] as keyword arguments, with ``changes``."""
    return {**dataclasses.asdict(SHAPES[name]), **changes}


# what the released models share beyond their shapes (the rest are the config defaults)
_COMMON: dict[str, Any] = dict(bos_token_id=151643, eos_token_id=151645, scan_layers=True)

PRESETS: dict[str, Qwen3Config] = {
    name: Qwen3Config(**shape_kwargs(name, tie_word_embeddings=name != "Qwen3-8B"), **_COMMON)
    for name in ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B")
}
PRESETS["Qwen3-30B-A3B"] = Qwen3MoeConfig(
    **shape_kwargs("Qwen3-30B-A3B", tie_word_embeddings=False),
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    **_COMMON,
)
