"""The experiment matrix: reference prefixes, two on-policy runs, each arm under each scenario, KL, report.

Directory layout (``out``)::

    model/                 -> the initial policy every run starts from (resolved once)
    prefixes/              reference prefix set (created once, shared by all runs)
    runs/<name>/config.yaml, train.log, ckpt/, logs/metrics.jsonl, DONE
    evals/<name>/step_<t>.npz   the run's policy at checkpoint t evaluated on the prefixes
    results/<name>.json    normalized metrics + D_t (see results.py);  noise.json: N_t
    report.md, plots/

Every stage is skipped when its output exists, so an interrupted experiment resumes and the report
can be regenerated from finished runs. All runs share the base config (model, data order, optimizer,
batch, steps, checkpoint steps); an arm sets ``loss.*`` (and DLC its ESS resync), a scenario sets the
sync schedule and the sampler perturbation. Runs whose resolved configs are identical (e.g. DLC with
its own ESS trigger under "stale every K" and "stale never") are trained once and shared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dlc_jax.experiments.presets import ARMS, ExperimentPreset, Scenario
from dlc_jax.experiments.results import NoiseThreshold, RunResult

REPO_ROOT = Path(__file__).resolve().parents[2]
ONPOLICY = ("onpolicy_seed1", "onpolicy_seed2")

# canonical series name -> trainer metric keys to try, in order
METRIC_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward_mean", "reward/mean", "reward"),
    "entropy": ("entropy_mean", "entropy"),
    "ess_lag": ("ess_lag", "lag/ess"),
    "ess_gaussian": ("ess_lag_gaussian", "lag/ess_gaussian"),
    "ell_mean": ("ell_mean", "lag/mean"),
    "ell_std": ("ell_std", "lag/std"),
    "delta_mean": ("delta_mean", "discrepancy/mean"),
    "delta_std": ("delta_std", "discrepancy/std"),
    "mismatch_k3": ("kl_k3", "mismatch/kl_k3"),
    "version_lag": ("version_lag", "lag/version", "weight_version_lag", "version_lag_mean", "steps_since_sync"),
    "resyncs": ("resyncs", "resync/count", "num_resyncs", "resync_count"),
}


@dataclasses.dataclass
class RunSpec:
    """One training run: its name, arm, scenario and the config overrides that define it."""

    name: str
    arm: str
    scenario: str
    overrides: tuple[str, ...]


def _log(msg: str) -> None:
    print(f"[experiment {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_specs(preset: ExperimentPreset, arms=None, scenarios=None) -> list[RunSpec]:
    """The matrix: the two on-policy runs first, then scenario x arm."""
    arms = list(arms or preset.arms)
    scs = [preset.scenario(s) for s in scenarios] if scenarios else list(preset.scenarios)
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise ValueError(f"--arms: unknown arms {bad} (known: {sorted(ARMS)})")
    s1, s2 = preset.onpolicy_seeds
    specs = [RunSpec(ONPOLICY[0], "onpolicy", "reference", ("loss.name=naive", "resync.policy=onpolicy", f"train.seed={s1}")),
             RunSpec(ONPOLICY[1], "onpolicy", "reference", ("loss.name=naive", "resync.policy=onpolicy", f"train.seed={s2}"))]
    for sc in scs:
        for a in arms:
            specs.append(RunSpec(f"{sc.name}__{a}", a, sc.name, arm_overrides(ARMS[a], sc) + (f"train.seed={s1}",)))
    return specs


def arm_overrides(arm, sc: Scenario) -> tuple[str, ...]:
    out = [f"loss.name={arm.loss}"] + [f"loss.{k}={v}" for k, v in arm.options]
    policy = arm.own_resync or sc.sync
    out += [f"resync.policy={policy}", f"resync.k={sc.sync_k}"]
    out += [f"sampler.quantization={sc.quantization}", f"sampler.weight_noise={sc.weight_noise}"]
    return tuple(out)


class Experiment:
    """Runs a preset's matrix under ``out``. ``steps`` overrides the preset's run length."""

    def __init__(self, preset: ExperimentPreset, out: str | Path, *, arms=None, scenarios=None, steps: int | None = None,
                 run_timeout_s: float = 3600.0):
        self.preset = preset
        self.out = Path(out).absolute()
        self.steps = int(steps or preset.steps)
        self.ckpt_every = min(preset.checkpoint_every, self.steps)
        self.specs = run_specs(preset, arms, scenarios)
        self.run_timeout_s = run_timeout_s
        self.timings: dict[str, float] = {}

    # -- configs --------------------------------------------------------------------------------
    def _base_path(self) -> Path:
        p = Path(self.preset.base_config)
        return p if p.is_absolute() else REPO_ROOT / p

    def base_overrides(self) -> list[str]:
        return list(self.preset.overrides) + [
            f"train.steps={self.steps}", f"checkpoint.every={self.ckpt_every}",
            f"checkpoint.keep={self.steps // self.ckpt_every + 2}", "checkpoint.resume=true",
            # a never-synced sampler is up to `steps` versions behind: keep its rollouts (and theta_s)
            f"async.max_staleness={self.steps + 1}",
            f"sft.cache_dir={self.out / 'cache'}"]

    def run_config(self, spec: RunSpec, model_dir: str | None):
        from dlc_jax.trainer.config import load_config

        run_dir = self.out / "runs" / spec.name
        ov = self.base_overrides() + list(spec.overrides) + [
            f"checkpoint.dir={run_dir / 'ckpt'}", f"log.dir={run_dir / 'logs'}"]
        if model_dir is not None:
            ov += [f"model.path={model_dir}", "sft.enabled=false"]
        return load_config(self._base_path(), ov)

    def training_identity(self, cfg) -> str:
        """Hash of everything that determines a training run except where it writes."""
        d = cfg.to_dict()
        d["checkpoint"] = {k: v for k, v in d["checkpoint"].items() if k != "dir"}
        d["log"] = {}
        return json.dumps(d, sort_keys=True)

    # -- stages ---------------------------------------------------------------------------------
    def resolve_model(self) -> str:
        """The initial policy's HF dir: model.path, or the (SFT-warmed) tiny model, made once.

        All runs then point at this directory with SFT off, so the on-policy runs differ only in
        ``train.seed`` (sampling), never in their starting weights."""
        marker = self.out / "model.json"
        if marker.exists():
            return json.loads(marker.read_text())["model_dir"]
        from dlc_jax.trainer.config import load_config

        cfg = load_config(self._base_path(), self.base_overrides() + [f"train.seed={self.preset.onpolicy_seeds[0]}"])
        if cfg.model.path:
            model_dir = cfg.model.path
        else:
            from dlc_jax.trainer import sft

            model_dir = str(sft.ensure_sft_model(cfg, log=_log) if cfg.sft.enabled else sft.base_model_dir(cfg))
        self.out.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"model_dir": model_dir}))
        return model_dir

    def make_prefixes(self, model_dir: str):
        from dlc_jax.data.tokenize import load_tokenizer
        from dlc_jax.experiments.prefixes import PrefixSet, client_generate, load_or_create
        from dlc_jax.sampler.process import SamplerProcess

        pdir = self.out / "prefixes"
        if PrefixSet.exists(pdir):
            return PrefixSet.load(pdir)
        cfg = self.run_config(self.specs[0], model_dir)
        tok = load_tokenizer(model_dir)
        pcfg = dataclasses.replace(self.preset.prefixes, temperature=cfg.sampler.temperature)
        _log(f"creating reference prefixes ({pcfg.num_prompts} prompts) with the {cfg.sampler.backend} sampler")
        proc = SamplerProcess(cfg.sampler.backend, model_dir, extra_args=["--max-model-len", str(cfg.sampler.max_model_len)],
                              log_file=str(self.out / "prefixes_sampler.log"))
        proc.start()
        try:
            with proc.client() as client:
                pad = tok.pad_token_id if tok.pad_token_id is not None else 0
                return load_or_create(pdir, pcfg, tok, client_generate(client), pad_id=int(pad),
                                      extra_meta={"model_dir": model_dir, "backend": cfg.sampler.backend})
        finally:
            proc.stop()

    def train(self, spec: RunSpec, cfg) -> Path:
        """Train one run in a subprocess (``dlc-jax train``), unless it already finished."""
        from dlc_jax.trainer.config import dump_config

        run_dir = self.out / "runs" / spec.name
        if (run_dir / "DONE").exists():
            return run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = run_dir / "config.yaml"
        cfg_path.write_text(dump_config(cfg))
        cmd = [sys.executable, "-m", "dlc_jax.cli", "train", "--config", str(cfg_path)]
        _log(f"train {spec.name}: {' '.join(spec.overrides)}")
        t0 = time.time()
        env = dict(os.environ)
        # runs share shapes: a persistent compilation cache saves most of each run's compile time
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(self.out / "jax_cache"))
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
        with open(run_dir / "train.log", "ab") as logf:
            rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
                                env=env, timeout=self.run_timeout_s).returncode
        wall = time.time() - t0
        if rc != 0:
            tail = (run_dir / "train.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"run {spec.name} failed with exit code {rc}; log {run_dir / 'train.log'}:\n{tail}")
        (run_dir / "DONE").write_text(json.dumps({"wall_s": wall}))
        _log(f"train {spec.name}: done in {wall:.0f}s")
        return run_dir

    def checkpoint_steps(self) -> list[int]:
        return list(range(self.ckpt_every, self.steps + 1, self.ckpt_every))

    def reference_evals(self, spec: RunSpec, cfg, prefixes) -> dict:
        """onpolicy_seed1 at each checkpoint evaluated on the prefixes (kept as npz: every D_t needs it)."""
        from dlc_jax.experiments.checkpoints import load_checkpoint_model
        from dlc_jax.experiments.distance import PolicyOnPrefixes, evaluate_policy

        edir = self.out / "evals" / spec.name
        edir.mkdir(parents=True, exist_ok=True)
        out = {}
        for step in self.checkpoint_steps():
            p = edir / f"step_{step}.npz"
            if not p.exists():
                model = load_checkpoint_model(cfg, step)
                evaluate_policy(model, prefixes, batch_size=self.preset.eval_batch_size).save(p)
            out[step] = PolicyOnPrefixes.load(p)
        return out

    def distances(self, spec: RunSpec, cfg, prefixes, ref: dict) -> dict[int, tuple[float, float]]:
        """{step: (KL(run_t || ref_t), KL(ref_t || run_t))}, one checkpoint in memory at a time (only the
        numbers are cached, in ``evals/<name>/kl.json``: a big model's evaluations are not kept)."""
        from dlc_jax.experiments.checkpoints import load_checkpoint_model
        from dlc_jax.experiments.distance import PolicyOnPrefixes, evaluate_policy, prefix_kl

        edir = self.out / "evals" / spec.name
        cache = edir / "kl.json"
        if cache.exists():
            return {int(k): tuple(v) for k, v in json.loads(cache.read_text()).items()}
        edir.mkdir(parents=True, exist_ok=True)
        out = {}
        for step in self.checkpoint_steps():
            p = edir / f"step_{step}.npz"
            if p.exists():
                ev = PolicyOnPrefixes.load(p)
            else:
                ev = evaluate_policy(load_checkpoint_model(cfg, step), prefixes, batch_size=self.preset.eval_batch_size)
            kl = prefix_kl(ev, ref[step], temperature=self.preset.kl_temperature, chunk_size=self.preset.kl_chunk_size)
            out[step] = (kl["forward"], kl["reverse"])
        cache.write_text(json.dumps({str(k): v for k, v in out.items()}))
        return out

    def result(self, spec: RunSpec, run_dir: Path, kl: dict) -> RunResult:
        rows = read_metrics(run_dir / "logs" / "metrics.jsonl")
        steps, series = normalize_metrics(rows)
        kl_steps = sorted(kl)
        done = json.loads((run_dir / "DONE").read_text())
        return RunResult(name=spec.name, arm=spec.arm, scenario=spec.scenario, steps=steps, series=series,
                         kl_steps=kl_steps, kl_forward=[kl[s][0] for s in kl_steps],
                         kl_reverse=[kl[s][1] for s in kl_steps], wall_s=float(done.get("wall_s", 0.0)),
                         info={"overrides": list(spec.overrides), "trained_as": run_dir.name})

    def run(self, *, report: bool = True) -> Path:
        t_all = time.time()
        self.out.mkdir(parents=True, exist_ok=True)
        model_dir = self.resolve_model()
        prefixes = self.make_prefixes(model_dir)
        _log(f"{prefixes.num_prefixes} reference prefixes; {len(self.specs)} runs x {self.steps} steps, "
             f"checkpoints at {self.checkpoint_steps()}")
        trained: dict[str, str] = {}  # training identity -> run name that trained it
        kl_by_name: dict[str, dict] = {}
        failures: dict[str, str] = {}
        ref = None
        for spec in self.specs:
            cfg = self.run_config(spec, model_dir)
            ident = self.training_identity(cfg)
            src = trained.get(ident)
            if src is not None and src != spec.name:
                _log(f"{spec.name}: identical config to {src}; reusing its run")
                run_dir, kl = self.out / "runs" / src, kl_by_name[src]
            else:
                t0 = time.time()
                try:
                    fresh = not (self.out / "runs" / spec.name / "DONE").exists()
                    run_dir = self.train(spec, cfg)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    if spec.name in ONPOLICY:
                        raise  # no reference, no experiment
                    failures[spec.name] = str(e)[-2000:]
                    _log(f"{spec.name} FAILED (continuing; listed in failures.json): {str(e)[:300]}")
                    continue
                if spec.name == ONPOLICY[0]:
                    ref = self.reference_evals(spec, cfg, prefixes)
                kl = self.distances(spec, cfg, prefixes, ref)
                if fresh:
                    self.timings[spec.name] = time.time() - t0
                trained[ident] = spec.name
                kl_by_name[spec.name] = kl
            if spec.name == ONPOLICY[1]:  # N_t = KL(O1_t || O2_t) = the reverse direction of O2's distance
                steps = sorted(kl)
                NoiseThreshold(steps=steps, forward=[kl[s][1] for s in steps],
                               reverse=[kl[s][0] for s in steps]).save(self.out)
            self.result(spec, run_dir, kl).save(self.out)
        (self.out / "failures.json").write_text(json.dumps(failures, indent=1))
        _log(f"all runs done in {time.time() - t_all:.0f}s ({len(failures)} failed)")
        if self.timings:  # keep earlier invocations' timings: one file per invocation
            (self.out / f"timings_{time.strftime('%Y%m%d_%H%M%S')}.json").write_text(
                json.dumps({"total_s": time.time() - t_all, "runs": self.timings}, indent=1))
        if report:
            return self.write_report()
        return self.out

    def write_report(self) -> Path:
        from dlc_jax.experiments.report import write_report

        notes = list(self.preset.notes) + [
            f"preset `{self.preset.name}`: {self.steps} steps per run, checkpoints every {self.ckpt_every} steps; "
            f"base config `{self.preset.base_config}` with overrides {list(self.preset.overrides)}."]
        f = self.out / "failures.json"
        if f.exists() and json.loads(f.read_text()):
            notes.append(f"runs that failed and are missing from the tables: {sorted(json.loads(f.read_text()))} "
                         f"(see failures.json and runs/<name>/train.log).")
        for t in sorted(self.out.glob("timings*.json")):  # one file per `run` invocation
            tt = json.loads(t.read_text())
            notes.append(f"`{t.name}`: wall time {tt['total_s']:.0f} s for {len(tt['runs'])} runs trained and "
                         f"evaluated ({', '.join(sorted(tt['runs']))}).")
        return write_report(self.out, title=f"KL to on-policy training — preset `{self.preset.name}`", notes=notes)


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"no metrics at {path} (did the run log JSONL?)")
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    by_step = {}
    for r in rows:  # a resumed run may log a step twice: keep the last
        by_step[int(r["step"])] = r
    return [by_step[s] for s in sorted(by_step)]


def normalize_metrics(rows: list[dict]) -> tuple[list[int], dict[str, list]]:
    """Trainer metric rows -> (steps, canonical series) using :data:`METRIC_KEYS`."""
    steps = [int(r["step"]) for r in rows]
    series = {}
    for name, keys in METRIC_KEYS.items():
        key = next((k for k in keys if any(k in r for r in rows)), None)
        if key is not None:
            series[name] = [r.get(key) for r in rows]
    return steps, series


def clean(out: str | Path, what: str) -> None:
    """Remove derived outputs (``results``/``evals``/``report``) so they are recomputed."""
    out = Path(out)
    targets = {"results": ["results", "noise.json"], "evals": ["evals", "results", "noise.json"],
               "report": ["report.md", "plots"]}[what]
    for t in targets:
        p = out / t
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
