"""The runs a preset asks for and the overrides that define each: an arm sets ``loss.*`` and its
resync, a scenario the sync schedule and the sampler perturbation, a seed ``train.seed``."""

from __future__ import annotations

import dataclasses

from dlc_jax.experiments.presets import ARMS, ExperimentPreset, Scenario


@dataclasses.dataclass
class RunSpec:
    """One training run and the config overrides that define it."""

    name: str
    arm: str
    scenario: str
    overrides: tuple[str, ...]
    seed: int = 0


def onpolicy_name(seed: int) -> str:
    return f"onpolicy__s{seed}"


def run_specs(preset: ExperimentPreset, arms=None, scenarios=None, seeds=None) -> list[RunSpec]:
    """The on-policy runs, then seed-major scenario x arm (so a cut-off matrix has every arm)."""
    arms = list(preset.arms if arms is None else arms)  # [] = the on-policy runs only
    scs = [preset.scenario(s) for s in scenarios] if scenarios else list(preset.scenarios)
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise ValueError(f"--arms: unknown arms {bad} (known: {sorted(ARMS)})")
    more = () if seeds is not None else preset.more_seeds
    seeds = list(seeds if seeds is not None else preset.seeds) + list(more)
    onpolicy = ("loss.name=naive", "resync.policy=onpolicy")
    return [
        RunSpec(onpolicy_name(s), "onpolicy", "reference", (*onpolicy, f"train.seed={s}"), seed=s)
        for s in preset.onpolicy_seeds
    ] + [
        RunSpec(
            f"{sc.name}__{a}__s{s}",
            a,
            sc.name,
            (*arm_overrides(ARMS[a], sc), f"train.seed={s}"),
            seed=s,
        )
        for s in seeds
        for sc in scs
        for a in arms
        if s not in more or a in preset.more_seed_arms
    ]


def arm_overrides(arm, sc: Scenario) -> tuple[str, ...]:
    out = [f"loss.name={arm.loss}"] + [f"loss.{k}={v}" for k, v in arm.options]
    # a sampler synced before every batch has no lag to trigger on: every arm follows it
    policy = sc.sync if sc.sync == "onpolicy" else (arm.own_resync or sc.sync)
    out += [f"resync.policy={policy}", f"resync.k={sc.sync_k}"]
    if policy == "ess" and sc.sync == "every_k":  # DLC's trigger syncs sooner, never later
        out.append(f"resync.max_interval={sc.sync_k}")
    out += [f"sampler.quantization={sc.quantization}", f"sampler.weight_noise={sc.weight_noise}"]
    if sc.dtype:
        out.append(f"sampler.dtype={sc.dtype}")
    return tuple(out) + tuple(arm.extra)
