"""A run's checkpoints evaluated: its KL to the on-policy runs on the reference prefixes and on its
own, and its held-out accuracy (heldout.py), cached under ``out/evals/<name>/``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dlc_jax.data.tokenize import load_tokenizer
from dlc_jax.experiments.checkpoints import load_checkpoint_model
from dlc_jax.experiments.distance import PolicyOnPrefixes, evaluate_policy, prefix_kl
from dlc_jax.experiments.heldout import heldout_score
from dlc_jax.experiments.own_prefixes import own_prefix_set
from dlc_jax.experiments.prefixes import heldout_prompts
from dlc_jax.experiments.presets import ExperimentPreset

KLByRef = dict[str, dict[int, tuple[float, float]]]


class CheckpointEvals:
    """Evaluates runs of ``preset`` under ``out`` at ``steps`` (their checkpoint steps)."""

    def __init__(self, preset: ExperimentPreset, out: Path, steps: list[int]):
        self.preset, self.out, self.steps = preset, out, steps
        self._models: dict[tuple[str, int], object] = {}

    def model(self, name: str, cfg, step: int):
        """theta_t of run ``name`` at ``step`` (on-policy models are kept for every comparison)."""
        key = (name, step)
        model = self._models[key] if key in self._models else load_checkpoint_model(cfg, step)
        if name.startswith("onpolicy__"):
            self._models[key] = model
        return model

    def evaluate(self, model, prefixes):
        """``model`` on ``prefixes`` (`distance.evaluate_policy`)."""
        return evaluate_policy(model, prefixes, batch_size=self.preset.eval_batch_size)

    def reference_evals(self, name: str, cfg, prefixes) -> dict:
        """An on-policy run at each checkpoint evaluated on the prefixes (kept as npz)."""
        edir = self.out / "evals" / name
        edir.mkdir(parents=True, exist_ok=True)
        out = {}
        for step in self.steps:
            p = edir / f"step_{step}.npz"
            if not p.exists():
                self.evaluate(self.model(name, cfg, step), prefixes).save(p)
            out[step] = PolicyOnPrefixes.load(p)
        return out

    def distances(self, name: str, cfg, prefixes, refs: dict) -> KLByRef:
        """{ref: {step: (KL(run_t || ref_t), KL(ref_t || run_t))}} on the reference prefixes."""
        edir = self.out / "evals" / name
        cache = edir / "kl.json"
        if cache.exists():
            return _load_kl(cache)
        edir.mkdir(parents=True, exist_ok=True)
        out: KLByRef = {r: {} for r in refs}
        for step in self.steps:
            p = edir / f"step_{step}.npz"
            if p.exists():
                ev = PolicyOnPrefixes.load(p)
            else:
                ev = self.evaluate(self.model(name, cfg, step), prefixes)
            for r in out:
                out[r][step] = self._kl_pair(ev, refs[r][step])
        _save_kl(cache, out)
        return out

    def own_distances(self, name: str, cfg, prefixes, ref_cfgs: dict) -> KLByRef:
        """Like :meth:`distances`, on prefixes the run samples from theta_t at each checkpoint (the
        first ``own_prefix_prompts`` reference prompts, a fixed seed per step); ``ref_cfgs``: name
        -> run config."""
        edir = self.out / "evals" / name
        cache = edir / "own_kl.json"
        if cache.exists():
            return _load_kl(cache)
        edir.mkdir(parents=True, exist_ok=True)
        tok = load_tokenizer(cfg.model.path)
        k = min(self.preset.own_prefix_prompts, prefixes.tokens.shape[0])
        prompts = [prefixes.tokens[i, : prefixes.prompt_lens[i]] for i in range(k)]
        max_tokens = int(prefixes.meta.get("config", {}).get("max_tokens", cfg.sampler.max_tokens))
        out: KLByRef = {r: {} for r in ref_cfgs}
        lens = {}
        for step in self.steps:
            model = self.model(name, cfg, step)
            own = own_prefix_set(
                model,
                prompts,
                max_tokens=max_tokens,
                temperature=cfg.sampler.temperature,
                seed=10_000 + step,
                eos_id=int(tok.eos_token_id),
                pad_id=prefixes.pad_id,
            )
            lens[step] = float(own.response_lens.mean())
            ev = self.evaluate(model, own)
            for r in out:
                out[r][step] = self._kl_pair(
                    ev, self.evaluate(self.model(r, ref_cfgs[r], step), own)
                )
        _save_kl(cache, out)
        (edir / "own_lens.json").write_text(json.dumps(lens))
        return out

    def _kl_pair(self, ev, ev_ref) -> tuple[float, float]:
        """(forward, reverse) KL between two evaluations on the same prefixes."""
        p = self.preset
        kl = prefix_kl(ev, ev_ref, temperature=p.kl_temperature, chunk_size=p.kl_chunk_size)
        return kl["forward"], kl["reverse"]


class HeldoutEvals:
    """Held-out accuracy at step 0 and at the checkpoints, cached in ``evals/``."""

    def __init__(self, preset: ExperimentPreset, out: Path, steps: list[int], prefix_cfg):
        self.preset, self.out, self.steps, self.prefix_cfg = preset, out, steps, prefix_cfg
        self._prompts: tuple | None = None

    def _inputs(self, model_dir: str):
        if self._prompts is None:
            tok = load_tokenizer(model_dir)
            pcfg = dataclasses.replace(self.prefix_cfg(), num_prompts=self.preset.heldout.prompts)
            recs, ids = heldout_prompts(pcfg, tok)
            self._prompts = (ids, [r["answer"] for r in recs], tok)
        return self._prompts

    def _score(self, model, model_dir: str, step: int) -> dict:
        ids, answers, tok = self._inputs(model_dir)
        score = heldout_score(
            model,
            ids,
            answers,
            lambda t: tok.decode(t, skip_special_tokens=True),
            eos_id=int(tok.eos_token_id),
            cfg=self.preset.heldout,
            step=step,
        )
        return dataclasses.asdict(score)

    def initial(self, model_dir: str) -> dict:
        cache = self.out / "evals" / "initial_heldout.json"
        if cache.exists():
            return json.loads(cache.read_text())
        from dlc_jax.model import load_hf

        score = self._score(load_hf(model_dir), model_dir, 0)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(score))
        return score

    def run(self, name: str, cfg, load_model) -> dict:
        """``RunResult.heldout`` of run ``name``; load_model(name, cfg, step) -> theta_t."""
        cache = self.out / "evals" / name / "heldout.json"
        if cache.exists():
            return json.loads(cache.read_text())
        steps = self.steps if self.preset.heldout.every_checkpoint else self.steps[-1:]
        scores = [self.initial(cfg.model.path)] + [
            self._score(load_model(name, cfg, step), cfg.model.path, step) for step in steps
        ]
        keys = ("greedy", "sampled", "greedy_correct", "sampled_correct")
        out = {"steps": [0, *steps], **{k: [s[k] for s in scores] for k in keys}}
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(out))
        return out


def _load_kl(path: Path) -> KLByRef:
    d = json.loads(path.read_text())
    return {r: {int(k): tuple(v) for k, v in by.items()} for r, by in d.items()}


def _save_kl(path: Path, kl: KLByRef) -> None:
    path.write_text(json.dumps({r: {str(k): v for k, v in by.items()} for r, by in kl.items()}))
