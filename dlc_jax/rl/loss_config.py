"""Loss configuration and per-loss metadata (``LOSS_SPECS``), importable without JAX; config
parsing uses this module alone, ``dlc_jax.rl.losses`` binds each spec to its function.
Formulas, defaults and sources: docs/CORRECTIONS.md."""

from __future__ import annotations

import dataclasses

WEIGHT_MODES = ("none", "tis", "mask")
VCPO_RULES = ("sqrt", "linear")
BEHAVE_MODES = ("clamp", "mask")


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """What one loss needs. requires: ``LossInputs`` fields that must be given; together: optional
    fields that are all-or-none (DLC's head); options: the ``LossConfig`` fields the loss reads."""

    name: str
    requires: tuple[str, ...] = ()
    together: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


_CLIP = "log_ratio_clip"
_PPO = ("clip_low", "clip_high", "dual_clip", _CLIP)
_HEAD = ("lp_head", "lq_head")

LOSS_SPECS: dict[str, LossSpec] = {
    s.name: s
    for s in (
        LossSpec("naive"),
        LossSpec("tis", options=("tis_cap", _CLIP)),
        LossSpec("tis_seq", options=("seq_tis_cap", _CLIP)),
        LossSpec("mis", options=("mis_low", "mis_high", _CLIP)),
        LossSpec("mis_seq", options=("mis_low", "mis_high", _CLIP)),
        LossSpec("mis_geo", options=("geo_low", "geo_high", _CLIP)),
        LossSpec(
            "score_centering",
            requires=_HEAD,
            options=("centering_weight", "tis_cap", "mis_low", "mis_high", "tail_floor", _CLIP),
        ),
        LossSpec("score_centering_tis", requires=_HEAD, options=("tis_cap", "tail_floor", _CLIP)),
        LossSpec(
            "score_centering_mask",
            requires=_HEAD,
            options=("mis_low", "mis_high", "tail_floor", _CLIP),
        ),
        LossSpec("ppo_clip", options=_PPO),
        LossSpec("decoupled_ppo", options=(*_PPO, "behave_cap", "behave_mode")),
        LossSpec("m2po", options=("m2_threshold", _CLIP)),
        LossSpec("vcpo", options=("seq_tis_cap", "vcpo_base_ess", "vcpo_rule", _CLIP)),
        LossSpec(
            "dlc",
            requires=("lp_s",),
            together=("lp_head", "lq_head", "lps_head"),
            options=(*_PPO, "tail_floor"),
        ),
    )
}
LOSS_NAMES: tuple[str, ...] = tuple(sorted(LOSS_SPECS))


def loss_spec(name: str) -> LossSpec:
    """The spec of loss ``name``; ValueError naming the choices for an unknown name."""
    if name not in LOSS_SPECS:
        raise ValueError(f"LossConfig.name {name!r} is not a loss; choose from {list(LOSS_NAMES)}")
    return LOSS_SPECS[name]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Hyper-parameters of every loss (each reads the fields in its ``LossSpec.options``).
    clip_low/clip_high: PPO eps (r kept in [1-low, 1+high]). dual_clip: c > 1 bounds the PPO loss
    for A < 0 by c*|A| (None = off). tis_cap / seq_tis_cap: token / sequence TIS cap.
    mis_low/mis_high, geo_low/geo_high: MIS and geometric-mean bands. behave_cap/behave_mode:
    decoupled-PPO behaviour weight cap (clamp or mask). m2_threshold: M2PO tau. tail_floor:
    score-centering tail-mass floor. centering_weight: f of ``score_centering`` (none|tis|mask).
    vcpo_base_ess / vcpo_rule: lr_scale = min(1, ESS/base)^(1/2 or 1). log_ratio_clip: |log ratio|
    bound before exp. Defaults and why: docs/CORRECTIONS.md."""

    name: str = "dlc"
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    tis_cap: float = 2.0
    seq_tis_cap: float = 8.0
    mis_low: float = 0.5
    mis_high: float = 5.0
    geo_low: float = 0.999
    geo_high: float = 1.001
    behave_cap: float = 5.0
    behave_mode: str = "clamp"
    m2_threshold: float = 0.04
    tail_floor: float = 1e-6
    centering_weight: str = "none"
    vcpo_base_ess: float = 1.0
    vcpo_rule: str = "sqrt"
    log_ratio_clip: float = 20.0

    def __post_init__(self) -> None:
        loss_spec(self.name)
        checks = [
            ("clip_low", 0.0 <= self.clip_low < 1.0),
            ("clip_high", self.clip_high >= 0.0),
            ("dual_clip", self.dual_clip is None or self.dual_clip > 1.0),
            ("tis_cap", self.tis_cap > 0),
            ("seq_tis_cap", self.seq_tis_cap > 0),
            ("mis_low", 0.0 <= self.mis_low <= self.mis_high),
            ("geo_low", 0.0 <= self.geo_low <= self.geo_high),
            ("behave_cap", self.behave_cap > 0),
            ("behave_mode", self.behave_mode in BEHAVE_MODES),
            ("m2_threshold", self.m2_threshold > 0),
            ("tail_floor", 0 < self.tail_floor < 1),
            ("centering_weight", self.centering_weight in WEIGHT_MODES),
            ("vcpo_base_ess", self.vcpo_base_ess > 0),
            ("vcpo_rule", self.vcpo_rule in VCPO_RULES),
            ("log_ratio_clip", self.log_ratio_clip > 0),
        ]
        for key, ok in checks:
            if not ok:
                raise ValueError(f"LossConfig.{key} has an invalid value: {getattr(self, key)!r}")

    @property
    def spec(self) -> LossSpec:
        return LOSS_SPECS[self.name]
