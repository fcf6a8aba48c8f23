"""Qwen3 architecture config: read/write HF `config.json` dicts, plus presets for released sizes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)
ATTENTION_IMPLS = ("auto", "splash", "cudnn", "xla", "dense")
REMAT_POLICIES = ("none", "full", "save_dots", "save_attn_out", "save_dots_and_attn_out")
SCAN_MIN_LAYERS = 8  # scan_layers=None scans models with at least this many layers


class UnsupportedModelError(ValueError):
    """config.json describes a model this package does not implement."""


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Dimensions of a Qwen3 decoder (names as in HF `config.json`)."""

    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    tie_word_embeddings: bool = True
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    # ---- how the model runs (not part of HF config.json; see docs/MODEL.md) ----
    # attention kernel: auto (by the mesh's platform: splash on TPU, cudnn on GPU for bf16, dense on
    # CPU) | splash | cudnn | xla | dense (the [B,KV,G,T,S] reference)
    attention_impl: str = "auto"
    # stack the decoder layers on the `layers` axis and run them with lax.scan (one compiled layer);
    # None = scan when num_hidden_layers >= SCAN_MIN_LAYERS
    scan_layers: bool | None = None
    # what a decoder layer keeps for the backward pass: none (no remat) | full (recompute all) |
    # save_dots (matmuls without batch dims) | save_attn_out | save_dots_and_attn_out
    remat_policy: str = "none"

    def __post_init__(self):
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"Qwen3Config.attention_impl must be one of {ATTENTION_IMPLS}, "
                f"got {self.attention_impl!r}"
            )
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"Qwen3Config.remat_policy must be one of {REMAT_POLICIES}, "
                f"got {self.remat_policy!r}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        for f in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "head_dim",
        ):
            if int(getattr(self, f)) <= 0:
                raise ValueError(f"Qwen3Config.{f} must be positive, got {getattr(self, f)}")

    @property
    def use_scan(self) -> bool:
        """Whether the decoder layers are stacked and scanned (resolves scan_layers=None)."""
        if self.scan_layers is None:
            return self.num_hidden_layers >= SCAN_MIN_LAYERS
        return bool(self.scan_layers)

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **options) -> Qwen3Config:
        """Build from an HF config dict (`options`: attention_impl / scan_layers / remat_policy);
        raises `UnsupportedModelError` naming what is unsupported."""
        archs = d.get("architectures") or []
        model_type = d.get("model_type")
        if archs and not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise UnsupportedModelError(
                f"unsupported architecture {archs} (model_type={model_type!r}); "
                "dlc_jax.model supports "
                f"{list(SUPPORTED_ARCHITECTURES)}"
            )
        if not archs and model_type != "qwen3":
            raise UnsupportedModelError(f"unsupported model_type {model_type!r}; expected 'qwen3'")
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if scaling or rope_type not in ("default", None):
            raise UnsupportedModelError(
                f"unsupported rope scaling {scaling or rope!r}; "
                "only plain RoPE (rope_scaling=None) is implemented"
            )
        if d.get("attention_bias"):
            raise UnsupportedModelError(
                "unsupported attention_bias=True (Qwen3 has no attention bias)"
            )
        if d.get("use_sliding_window"):
            raise UnsupportedModelError("unsupported use_sliding_window=True")
        if d.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"unsupported hidden_act {d['hidden_act']!r}; expected 'silu'"
            )
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        hidden, heads = d["hidden_size"], d["num_attention_heads"]
        kw = dict(
            vocab_size=d["vocab_size"],
            hidden_size=hidden,
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads", heads),
            head_dim=d.get("head_dim") or hidden // heads,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            rope_theta=float(theta),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=d.get("max_position_embeddings", 40960),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
        )
        return cls(**kw, **options)

    @classmethod
    def from_pretrained(cls, path, **options) -> Qwen3Config:
        """Read `<path>/config.json` (or a config.json file path); `options` as in from_hf_dict."""
        p = Path(path)
        f = p / "config.json" if p.is_dir() else p
        if not f.exists():
            raise FileNotFoundError(f"no config.json at {f}")
        return cls.from_hf_dict(json.loads(f.read_text()), **options)

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF `config.json` dict that transformers and vLLM load as Qwen3ForCausalLM."""
        d = {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
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
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    def replace(self, **kw) -> Qwen3Config:
        return dataclasses.replace(self, **kw)


_COMMON: dict[str, Any] = dict(
    vocab_size=151936,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=40960,
    head_dim=128,
    num_key_value_heads=8,
    bos_token_id=151643,
    eos_token_id=151645,
    scan_layers=True,
)

PRESETS: dict[str, Qwen3Config] = {
    "Qwen3-0.6B": Qwen3Config(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        tie_word_embeddings=True,
        **_COMMON,
    ),
    "Qwen3-1.7B": Qwen3Config(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        tie_word_embeddings=True,
        **_COMMON,
    ),
    "Qwen3-4B": Qwen3Config(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        tie_word_embeddings=True,
        **_COMMON,
    ),
    "Qwen3-8B": Qwen3Config(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        tie_word_embeddings=False,
        **_COMMON,
    ),
}
