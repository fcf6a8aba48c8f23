"""Where metrics go besides metrics.jsonl: grouped TensorBoard tags, a wandb run, sample
completions (samples.jsonl, TensorBoard text) and the plain progress line.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from dlc_jax.errors import UserError, one_line

logger = logging.getLogger(__name__)

_MISMATCH_PREFIXES = ("delta_", "ell_", "total_", "kl_", "head_mass_", "entropy_")
_MISMATCH_KEYS = ("version_lag",)
_LOSS_KEYS = ("grad_norm", "lr", "lr_scale")
_GROUPS = ("reward/", "mismatch/", "ess/", "loss/", "system/", "eval/", "pool/")


def tb_tag(key: str, row: dict) -> str | None:
    """The grouped TensorBoard tag of ``key``; None: not written (a duplicate)."""
    if key == "step":
        return None
    if key.startswith(_GROUPS):
        return key
    if "/" not in key and f"loss/{key}" in row:
        return None
    if key.startswith("reward_"):
        return "reward/" + key[len("reward_") :]
    if key.startswith("ess_"):
        return "ess/" + key[len("ess_") :]
    if key.startswith(_MISMATCH_PREFIXES) or key in _MISMATCH_KEYS:
        return "mismatch/" + key
    if key in _LOSS_KEYS:
        return "loss/" + key
    if key == "response_len":
        return "reward/response_len"
    return "system/" + key.replace("/", "_")


def flat_keys(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_keys(v, key + "."))
        else:
            out[key] = v
    return out


def flatten(d: dict) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (scalars and strings; lists/dicts as JSON text)."""
    return {
        k: ("" if v is None else v)
        if isinstance(v, (bool, int, float, str, type(None)))
        else json.dumps(v)
        for k, v in flat_keys(d).items()
    }


WANDB_INIT_TIMEOUT_S = 30.0  # wandb's own default is 90 s, retried: 100-115 s without a network


def wandb_api_key_known() -> bool:
    """Whether wandb has an API key: ``WANDB_API_KEY`` or a readable netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbWriter:
    """A wandb run (``log.wandb``): metrics, the config, sample tables. No API key and no
    ``WANDB_MODE``: offline; an online start that fails within ``WANDB_INIT_TIMEOUT_S`` falls back
    to offline; only a failed offline start stops the run."""

    def __init__(self, directory: Path, project: str, run_name: str, config: dict | None):
        try:
            import wandb
        except ImportError as e:
            raise ValueError(
                "log.wandb: the wandb package is not installed (pip install wandb)"
            ) from e
        self._wandb = wandb
        mode = os.environ.get("WANDB_MODE") or None
        if mode is None and not wandb_api_key_known():
            mode = "offline"
            logger.warning(
                "log.wandb: no wandb API key (WANDB_API_KEY or `wandb login`) and no WANDB_MODE: "
                "logging offline under %s/wandb (upload later with `wandb sync`)",
                directory,
            )
        try:
            self.run = self._init(directory, project, run_name, config, mode)
        except Exception as e:  # noqa: BLE001 - wandb raises many types (network, auth, usage)
            if mode in ("offline", "dryrun", "disabled"):
                why = _first(e)
                raise UserError(f"log.wandb: cannot start an offline wandb run ({why})") from e
            logger.warning(
                "log.wandb: the online wandb run did not start within %g s (%s); logging offline "
                "under %s/wandb instead (upload later with `wandb sync`)",
                WANDB_INIT_TIMEOUT_S,
                _first(e),
                directory,
            )
            try:
                self.run = self._init(directory, project, run_name, config, "offline")
            except Exception as e2:  # noqa: BLE001
                raise UserError(
                    f"log.wandb: cannot start a wandb run, online ({_first(e)}) or offline "
                    f"({_first(e2)})"
                ) from e2
        offline = self.run.settings.mode in ("offline", "dryrun")
        logger.info(
            "wandb: run %s in %s%s",
            self.run.name,
            self.run.dir.rsplit("/files", 1)[0],
            " (offline; upload later with `wandb sync` on that directory)" if offline else "",
        )

    def _init(self, directory: Path, project: str, run_name: str, config, mode: str | None):
        wandb = self._wandb
        # wandb's banner and run-history printout stay in its debug log
        quiet = not logger.isEnabledFor(logging.DEBUG)
        return wandb.init(
            project=project,
            name=run_name or None,
            dir=str(directory),
            config=config or {},
            reinit="finish_previous",
            mode=mode,
            settings=wandb.Settings(
                silent=quiet,
                show_info=not quiet,
                console="off",
                init_timeout=WANDB_INIT_TIMEOUT_S,
            ),
        )

    def log(self, step: int, tags: dict[str, float]) -> None:
        self.run.log(tags, step=step)

    def log_samples(self, step: int, records: list[dict]) -> None:
        cols = ["step", "prompt", "response", "reward", "delta_mean", "ell_mean"]
        table = self._wandb.Table(columns=cols)
        for r in records:
            table.add_data(*(r.get(c) for c in cols))
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


def samples_markdown(records: list[dict]) -> str:
    """TensorBoard text of sample completions (one markdown block per sample)."""
    parts = []
    for r in records:
        stats = ", ".join(
            f"{k} {r[k]:.4g}"
            for k in ("reward", "delta_mean", "delta_abs_max", "ell_mean", "ell_abs_max")
            if isinstance(r.get(k), (int, float))
        )
        parts.append(
            f"**prompt** {r.get('prompt', '')!s}\n\n**response** {r.get('response', '')!s}\n\n"
            f"{stats}, tokens {r.get('tokens')}"
        )
    return "\n\n---\n\n".join(parts)


class ProgressLine:
    """One progress line on stdout every ``every`` steps (and at the last)."""

    KEYS = (("reward", "reward_mean"), ("ess", "ess_lag"), ("resyncs", "resync_count"))

    def __init__(self, every: int, total_steps: int | None):
        self.every, self.total = max(1, every), total_steps

    def update(self, row: dict) -> None:
        step = row["step"]
        if step % self.every and step != self.total:
            return
        parts = [f"step {step}" + (f"/{self.total}" if self.total else "")]
        for name, k in self.KEYS:
            if (v := row.get(k)) is not None:
                parts.append(f"{name} {v:.3f}" if isinstance(v, float) else f"{name} {v}")
        for k in ("eval/accuracy", "step_s"):
            if isinstance(row.get(k), (int, float)):
                parts.append(f"{k} {row[k]:.3f}")
        print(" | ".join(parts), flush=True)


def _first(e: BaseException) -> str:
    """``e`` as one short line (wandb's messages run over several)."""
    text = str(e).strip()
    return one_line(f"{type(e).__name__}: {text.splitlines()[0] if text else ''}", 200)


def token_summary(lp, lp_s, lp_q, mask) -> dict[str, float]:
    """delta/ell mean and largest magnitude over one response's tokens (host arrays [T])."""
    m = np.asarray(mask) > 0
    if not m.any():
        return {}
    delta = (np.asarray(lp_s) - np.asarray(lp_q))[m]
    ell = (np.asarray(lp) - np.asarray(lp_s))[m]
    return {
        "delta_mean": float(delta.mean()),
        "delta_abs_max": float(np.abs(delta).max()),
        "ell_mean": float(ell.mean()),
        "ell_abs_max": float(np.abs(ell).max()),
        "logprob_q_mean": float(np.asarray(lp_q)[m].mean()),
    }


def sample_records(
    rollouts: list, prompts: dict, texts: list[str], rewards: np.ndarray, per_token: dict | None
) -> list[dict]:
    """Records of ``rollouts``. per_token: host arrays ``lp``, ``lp_s``, ``lp_q``, ``mask``
    [rows, L], row i = rollout i (None: no delta/ell summary)."""
    out = []
    for i, r in enumerate(rollouts):
        rec = {
            "slot": int(r.slot_id),
            "sample": int(r.sample_index),
            "prompt": prompts[r.slot_id].prompt,
            "answer": prompts[r.slot_id].answer,
            "response": texts[i],
            "reward": float(rewards[i]),
            "tokens": int(len(r.response_ids)),
            "versions": sorted({int(v) for v, _, _ in r.version_spans}),
        }
        if per_token is not None:
            rec.update(token_summary(*(per_token[k][i] for k in ("lp", "lp_s", "lp_q", "mask"))))
        out.append(rec)
    return out
