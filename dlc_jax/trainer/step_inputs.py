"""From a completed batch of rollouts to the device inputs of the train step: rewards, advantages
and packing (statistics agreed over processes), then the theta_s log-probs of every token from the
snapshot of the version that sampled it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.env.runner import episode_stats
from dlc_jax.model.routing import routed_batch
from dlc_jax.rl import group_advantages
from dlc_jax.sampler.wire.types import Rollout
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.batching import step_arrays
from dlc_jax.trainer.state import TrainState
from dlc_jax.trainer.step import STEP_KEYS


def bucket(n: int, mode: str = "pow2", max_len: int = 0, mult: int = 16) -> int:
    """The padded row length for a longest row of ``n`` tokens (``train.length_buckets``): 'pow2'
    the next power of two, 'fine' the next multiple of ``mult``, 'max' ``max_len``; capped at
    ``max_len`` rounded up to ``mult`` unless ``n`` exceeds it (``max_len`` 0: no cap)."""
    fine = -(-n // mult) * mult
    if mode == "fine":
        return fine
    cap = -(-max_len // mult) * mult if max_len > 0 else 0
    if mode == "max":
        return max(fine, cap)
    if mode != "pow2":
        raise ValueError(f"length bucket mode must be 'pow2', 'fine' or 'max', got {mode!r}")
    p = max(mult, 1 << max(n - 1, 0).bit_length())
    return max(fine, min(p, cap)) if cap else p


def decode(tokenizer, rollout) -> str:
    """The response text of ``rollout`` (special tokens skipped)."""
    return tokenizer.decode(rollout.response_ids.tolist(), skip_special_tokens=True)


def score_texts(rewards: RewardRunner, recs: list, texts: list[str], ids: list[str]):
    """(rewards float32 [N], reward metrics) of ``texts`` answering prompt records ``recs``."""
    keys = set.intersection(*(set(p.metadata) for p in recs)) if recs else set()
    return rewards.score(
        [p.prompt for p in recs],
        texts,
        [p.answer for p in recs],
        ids,
        metadata={k: [p.metadata[k] for p in recs] for k in sorted(keys)},
    )


@jax.jit
def _select_version(ver, v, lp, lp_head, lp_s, lps_head):
    """Tokens of weight version ``v`` take theta_s log-probs ``lp`` [B,L] / ``lp_head`` [B,L,K]."""
    sel = ver == v
    return jnp.where(sel, lp, lp_s), jnp.where(sel[..., None], lp_head, lps_head)


FILLER = "dropped_invalid"  # finish_reason of a filler rollout


def filler_rollouts(slot: int, group_size: int, pad_id: int, head_k: int) -> list[Rollout]:
    """The cells of a dropped prompt: prompt [pad_id], no response, nothing learned."""
    k = int(head_k)
    return [
        Rollout(
            prompt_ids=np.asarray([pad_id], np.int32),
            response_ids=np.zeros((0,), np.int32),
            logprobs=np.zeros((0,), np.float32),
            head_ids=np.zeros((0, k), np.int32),
            head_logprobs=np.zeros((0, k), np.float32),
            finish_reason=FILLER,
            version_spans=[],
            slot_id=slot,
            sample_index=g,
        )
        for g in range(group_size)
    ]


@dataclasses.dataclass(eq=False)
class StepInputs:
    """rows: the row sharding (None on one device); snapshot_lp: the theta_s forward."""

    cfg: Any
    tokenizer: Any
    eos_id: int
    mesh: Any
    rows: Any
    snapshot_lp: Any
    rewards: RewardRunner

    def __post_init__(self) -> None:
        self.multi = jax.process_count() > 1
        if self.multi and self.cfg.train.pack:
            raise ValueError(
                "train.pack: packed rows are single-process for now (multi-host batches "
                "have a fixed global row count); use train.pack=false"
            )

    def score_and_pack(self, rollouts: list, prompts: dict, version: int) -> tuple[dict, dict]:
        """(global batch statistics, packed host arrays with ``adv``)."""
        cfg = self.cfg
        real = np.asarray([r.finish_reason != FILLER for r in rollouts])
        scored, reward_metrics = self._score([r for r, k in zip(rollouts, real) if k], prompts)
        rewards = np.zeros(len(rollouts), np.float32)
        rewards[real] = scored
        grouped = group_advantages(
            jnp.asarray(rewards.reshape(-1, cfg.sampler.n)), cfg.train.advantage
        )
        adv = np.where(real, np.asarray(grouped).reshape(-1), 0.0)  # fillers: advantage 0
        rewards = rewards[real]
        resp = np.asarray([len(r.response_ids) for r in rollouts], np.float64)
        lag_tok = sum((version - v) * (e - s) for r in rollouts for v, s, e in r.version_spans)
        max_len = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
        # [sum r, sum r^2, rows, max len, sum response len, sum token lag] from every process
        local = [rewards.sum(), np.square(rewards).sum(), len(rewards), max_len]
        local += [resp.sum(), lag_tok]
        # per-reward sums and failure counts (same names, same order on every process)
        r_names = sorted(k for k in reward_metrics if k != "reward/seconds")
        counts = ("reward/errors", "reward/timeouts")
        local += [reward_metrics[k] * (1 if k in counts else len(rewards)) for k in r_names]
        tot = dist.allgather(np.asarray(local, np.float64))
        r_sum, r_sq, rows_n, _, resp_sum, lag_sum = tot.sum(axis=0)[:6]
        r_tot = tot.sum(axis=0)[6:]
        r_mean = r_sum / rows_n
        seq_len = bucket(int(tot[:, 3].max()), cfg.train.length_buckets, cfg.sampler.max_model_len)
        # packed: as many rows as needed, a multiple of micro-batches x row-sharding devices
        row_devices = 1 if self.mesh is None else self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        arrays = step_arrays(
            rollouts,
            np.asarray(adv),
            seq_len=cfg.sampler.max_model_len if cfg.train.pack else seq_len,
            head_k=cfg.sampler.head_k,
            pad_id=self.eos_id,
            pack=cfg.train.pack,
            row_multiple=cfg.train.micro_batches * row_devices,
        )
        if cfg.moe.router_replay == "sampler":  # replay the sampler's routing (model/routing.py)
            arrays["routed_experts"] = routed_batch(
                rollouts, arrays["seq_index"], arrays["positions"]
            )
        stats = {
            "reward_mean": float(r_mean),
            "reward_std": float(np.sqrt(max(r_sq / rows_n - r_mean**2, 0.0))),
            "version_lag": float(lag_sum / resp_sum) if resp_sum > 0 else 0.0,
            "response_len": float(resp_sum / rows_n),
            "reward/seconds": reward_metrics.get("reward/seconds", 0.0),
        }
        stats.update({k: float(v if k in counts else v / rows_n) for k, v in zip(r_names, r_tot)})
        stats.update(episode_stats(rollouts))  # env/*: this process's episodes (env.fn)
        return stats, arrays

    def _score(self, rollouts: list, prompts: dict) -> tuple[np.ndarray, dict]:
        """(rewards float32 [N], metrics) of rollouts: their own (env episodes) or the workers'."""
        if rollouts and all(r.reward is not None for r in rollouts):
            return np.asarray([r.reward for r in rollouts], np.float32), {}
        recs = [prompts[r.slot_id] for r in rollouts]
        texts = [decode(self.tokenizer, r) for r in rollouts]
        ids = [f"{r.slot_id}/{r.sample_index}" for r in rollouts]
        return score_texts(self.rewards, recs, texts, ids)

    def device_batch(self, arrays: dict) -> dict:
        """Global device arrays from this process's rows (all rows in a single process)."""
        if self.multi:
            rows = self.cfg.train.batch_prompts * self.cfg.sampler.n
            return dist.global_batch(arrays, self.rows, rows)
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in arrays.items()}
        return {k: jax.device_put(v, self.rows) for k, v in arrays.items()}

    def device_inputs(self, arrays: dict, state: TrainState) -> tuple[dict, int]:
        """(device batch with ``lp_s`` / ``lps_head`` / ``self_mask``, snapshot forwards run)."""
        mask = arrays["mask"] > 0
        ver = arrays["version"].astype(np.int32)
        held = set(state.snapshots) | {state.version}
        versions = dist.global_versions(set(np.unique(ver[mask]).tolist()), held)
        versions = [v for v in versions if v != state.version]
        local = {k: arrays[k] for k in STEP_KEYS if k in arrays}
        local.update(
            lp_s=np.zeros_like(arrays["lp_q"]),
            lps_head=np.zeros_like(arrays["lq_head"]),
            self_mask=(ver == state.version) | ~mask,
        )
        dev = self.device_batch(local)
        if versions:
            dv = self.device_batch({"version": ver})["version"]
            for v in versions:
                a, h = self.snapshot_lp(state.snapshot_params(v), dev)
                dev["lp_s"], dev["lps_head"] = _select_version(
                    dv, v, a, h, dev["lp_s"], dev["lps_head"]
                )
        return dev, len(versions)
