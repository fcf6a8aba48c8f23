"""The experiment matrix: reference prefixes, two on-policy runs, each arm under each scenario, KL,
report.

Directory layout (``out``)::

    model/                 -> the initial policy every run starts from (resolved once)
    prefixes/              reference prefix set (created once, shared by all runs)
    runs/<name>/config.yaml, train.log, ckpt/, logs/metrics.jsonl, DONE
    evals/<name>/step_<t>.npz   the run's policy at checkpoint t evaluated on the prefixes
    results/<name>.json    normalized metrics + D_t (see results.py);  noise.json: N_t
    report.md, plots/

Every stage is skipped when its output exists, so an interrupted experiment resumes and the report
can be regenerated from finished runs. All runs share the base config (model, data order, optimizer,
batch, steps, checkpoint steps); an arm sets ``loss.*`` (and DLC its ESS resync), a scenario sets
the
sync schedule and the sampler perturbation. Runs whose resolved configs are identical (e.g. DLC with
its own ESS trigger under "stale every K" and "stale never") are trained once and shared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from dlc_jax.experiments.presets import ARMS, ExperimentPreset, Scenario
from dlc_jax.experiments.results import NoiseThreshold, RunResult

REPO_ROOT = Path(__file__).resolve().parents[2]

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
    "version_lag": (
        "version_lag",
        "lag/version",
        "weight_version_lag",
        "version_lag_mean",
        "steps_since_sync",
    ),
    "resyncs": ("resyncs", "resync/count", "num_resyncs", "resync_count"),
}


@dataclasses.dataclass
class RunSpec:
    """One training run: its name, arm, scenario, sampling seed and the config overrides that define
    it."""

    name: str
    arm: str
    scenario: str
    overrides: tuple[str, ...]
    seed: int = 0


def _log(msg: str) -> None:
    print(f"[experiment {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def onpolicy_name(seed: int) -> str:
    return f"onpolicy__s{seed}"


def run_specs(preset: ExperimentPreset, arms=None, scenarios=None, seeds=None) -> list[RunSpec]:
    """The matrix: the on-policy runs first, then seed-major scenario x arm (so an interrupted
    matrix has
    every arm at its first seeds rather than some arms at all seeds)."""
    arms = list(arms or preset.arms)
    scs = [preset.scenario(s) for s in scenarios] if scenarios else list(preset.scenarios)
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise ValueError(f"--arms: unknown arms {bad} (known: {sorted(ARMS)})")
    seeds = list(seeds if seeds is not None else preset.seeds)
    specs = [
        RunSpec(
            onpolicy_name(s),
            "onpolicy",
            "reference",
            ("loss.name=naive", "resync.policy=onpolicy", f"train.seed={s}"),
            seed=s,
        )
        for s in preset.onpolicy_seeds
    ]
    for seed in seeds:
        for sc in scs:
            for a in arms:
                specs.append(
                    RunSpec(
                        f"{sc.name}__{a}__s{seed}",
                        a,
                        sc.name,
                        arm_overrides(ARMS[a], sc) + (f"train.seed={seed}",),
                        seed=seed,
                    )
                )
    return specs


def arm_overrides(arm, sc: Scenario) -> tuple[str, ...]:
    out = [f"loss.name={arm.loss}"] + [f"loss.{k}={v}" for k, v in arm.options]
    policy = arm.own_resync or sc.sync
    out += [f"resync.policy={policy}", f"resync.k={sc.sync_k}"]
    out += [f"sampler.quantization={sc.quantization}", f"sampler.weight_noise={sc.weight_noise}"]
    return tuple(out)


class Experiment:
    """Runs a preset's matrix under ``out``. ``steps`` overrides the preset's run length, ``seeds``
    the
    arms' seeds (the on-policy runs always use all of ``preset.onpolicy_seeds``)."""

    def __init__(
        self,
        preset: ExperimentPreset,
        out: str | Path,
        *,
        arms=None,
        scenarios=None,
        steps: int | None = None,
        seeds=None,
        run_timeout_s: float = 3600.0,
        extra_overrides: tuple[str, ...] = (),
    ):
        self.preset = preset
        self.out = Path(out).absolute()
        self.steps = int(steps or preset.steps)
        self.ckpt_every = min(preset.checkpoint_every, self.steps)
        self.specs = run_specs(preset, arms, scenarios, seeds)
        self.run_timeout_s = run_timeout_s
        self.extra_overrides = tuple(extra_overrides)
        self.timings: dict[str, float] = {}
        self._models: dict[tuple[str, int], object] = {}

    # -- configs --------------------------------------------------------------------------------
    def _base_path(self) -> Path:
        p = Path(self.preset.base_config)
        return p if p.is_absolute() else REPO_ROOT / p

    def cache_dir(self) -> Path:
        return self.out / "cache"

    def base_overrides(self) -> list[str]:
        ov = list(self.preset.overrides) + [
            f"train.steps={self.steps}",
            f"checkpoint.every={self.ckpt_every}",
            f"checkpoint.keep={self.steps // self.ckpt_every + 2}",
            "checkpoint.resume=true",
            # a never-synced sampler is up to `steps` versions behind: keep its rollouts (and
            # theta_s)
            f"async.max_staleness={self.steps + 1}",
            f"sft.cache_dir={self.cache_dir()}",
        ]
        if self.preset.task is not None:
            from dlc_jax.experiments.warmup import data_file

            ov += [
                f"data.source={data_file(self.preset.task, self.cache_dir())}",
                "data.prompt_field=prompt",
                "data.answer_field=answer",
                "sft.enabled=false",
            ]
        return ov + list(self.extra_overrides)

    def run_config(self, spec: RunSpec, model_dir: str | None):
        from dlc_jax.trainer.config import load_config

        run_dir = self.out / "runs" / spec.name
        ov = (
            self.base_overrides()
            + list(spec.overrides)
            + [f"checkpoint.dir={run_dir / 'ckpt'}", f"log.dir={run_dir / 'logs'}"]
        )
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
        """The initial policy's HF dir: model.path, the chain-task warm-up, or the (SFT-warmed) tiny
        model,
        made once. All runs then point at this directory with SFT off, so the on-policy runs differ
        only
        in ``train.seed`` (sampling), never in their starting weights."""
        marker = self.out / "model.json"
        if marker.exists():
            return json.loads(marker.read_text())["model_dir"]
        from dlc_jax.trainer.config import load_config

        self.out.mkdir(parents=True, exist_ok=True)
        cfg = load_config(
            self._base_path(),
            self.base_overrides() + [f"train.seed={self.preset.onpolicy_seeds[0]}"],
        )
        if cfg.model.path:
            model_dir = cfg.model.path
        elif self.preset.task is not None:
            from dlc_jax.experiments.warmup import ensure_chain_model

            _log(f"chain-arithmetic warm-up ({self.preset.task.steps} SFT steps)")
            model_dir = str(ensure_chain_model(self.preset.task, self.cache_dir()))
        else:
            from dlc_jax.trainer import sft

            model_dir = str(
                sft.ensure_sft_model(cfg, log=_log) if cfg.sft.enabled else sft.base_model_dir(cfg)
            )
        info = {"model_dir": model_dir}
        wj = Path(model_dir) / "warmup.json"
        if wj.exists():
            info["warmup"] = json.loads(wj.read_text())
        marker.write_text(json.dumps(info, indent=1))
        return model_dir

    def prefix_config(self):
        pcfg = self.preset.prefixes
        if self.preset.task is not None:
            from dlc_jax.data.chain_arith import ChainArithSource, write_jsonl

            t = self.preset.task
            held = self.cache_dir() / f"chain_arith_heldout-{t.key()}.jsonl"
            if not held.exists():
                write_jsonl(
                    ChainArithSource(
                        dataclasses.replace(t.task, num_examples=max(pcfg.num_prompts, 64)),
                        seed=pcfg.data_seed,
                    ),
                    held,
                )
            pcfg = dataclasses.replace(
                pcfg, source=str(held), prompt_field="prompt", answer_field="answer"
            )
        return pcfg

    def make_prefixes(self, model_dir: str):
        from dlc_jax.data.tokenize import load_tokenizer
        from dlc_jax.experiments.prefixes import PrefixSet, client_generate, load_or_create
        from dlc_jax.sampler.process import SamplerProcess

        pdir = self.out / "prefixes"
        if PrefixSet.exists(pdir):
            return PrefixSet.load(pdir)
        cfg = self.run_config(self.specs[0], model_dir)
        tok = load_tokenizer(model_dir)
        pcfg = dataclasses.replace(self.prefix_config(), temperature=cfg.sampler.temperature)
        _log(
            f"creating reference prefixes ({pcfg.num_prompts} prompts) with the "
            f"{cfg.sampler.backend} sampler"
        )
        proc = SamplerProcess(
            cfg.sampler.backend,
            model_dir,
            extra_args=["--max-model-len", str(cfg.sampler.max_model_len)],
            log_file=str(self.out / "prefixes_sampler.log"),
        )
        proc.start()
        try:
            with proc.client() as client:
                pad = tok.pad_token_id if tok.pad_token_id is not None else 0
                return load_or_create(
                    pdir,
                    pcfg,
                    tok,
                    client_generate(client),
                    pad_id=int(pad),
                    extra_meta={"model_dir": model_dir, "backend": cfg.sampler.backend},
                )
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
            # its own session, so a timeout also ends the sampler and reward workers it started
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=str(REPO_ROOT),
                env=env,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=self.run_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        wall = time.time() - t0
        if rc != 0:
            tail = (run_dir / "train.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"run {spec.name} failed with exit code {rc}; log {run_dir / 'train.log'}:\n{tail}"
            )
        (run_dir / "DONE").write_text(json.dumps({"wall_s": wall}))
        _log(f"train {spec.name}: done in {wall:.0f}s")
        return run_dir

    def checkpoint_steps(self) -> list[int]:
        return list(range(self.ckpt_every, self.steps + 1, self.ckpt_every))

    def _model(self, name: str, cfg, step: int):
        """theta_t of run ``name`` at ``step`` (on-policy models are kept: every run is compared
        with them)."""
        from dlc_jax.experiments.checkpoints import load_checkpoint_model

        key = (name, step)
        if key in self._models:
            return self._models[key]
        model = load_checkpoint_model(cfg, step)
        if name.startswith("onpolicy__"):
            self._models[key] = model
        return model

    def reference_evals(self, spec: RunSpec, cfg, prefixes) -> dict:
        """An on-policy run at each checkpoint evaluated on the prefixes (kept as npz: every D_t
        needs it)."""
        from dlc_jax.experiments.distance import PolicyOnPrefixes, evaluate_policy

        edir = self.out / "evals" / spec.name
        edir.mkdir(parents=True, exist_ok=True)
        out = {}
        for step in self.checkpoint_steps():
            p = edir / f"step_{step}.npz"
            if not p.exists():
                evaluate_policy(
                    self._model(spec.name, cfg, step),
                    prefixes,
                    batch_size=self.preset.eval_batch_size,
                ).save(p)
            out[step] = PolicyOnPrefixes.load(p)
        return out

    def refs_for(self, spec: RunSpec) -> list[str]:
        """On-policy runs a run is compared with: those of the other sampling seeds."""
        return [
            onpolicy_name(s)
            for s in self.preset.onpolicy_seeds
            if s != spec.seed and onpolicy_name(s) != spec.name
        ]

    def distances(
        self, spec: RunSpec, cfg, prefixes, refs: dict
    ) -> dict[str, dict[int, tuple[float, float]]]:
        """{ref: {step: (KL(run_t || ref_t), KL(ref_t || run_t))}} on the reference prefixes, one
        checkpoint
        in memory at a time (cached as numbers in ``evals/<name>/kl.json``)."""
        from dlc_jax.experiments.distance import PolicyOnPrefixes, evaluate_policy, prefix_kl

        edir = self.out / "evals" / spec.name
        cache = edir / "kl.json"
        if cache.exists():
            d = json.loads(cache.read_text())
            return {r: {int(k): tuple(v) for k, v in by.items()} for r, by in d.items()}
        edir.mkdir(parents=True, exist_ok=True)
        out: dict[str, dict[int, tuple[float, float]]] = {r: {} for r in self.refs_for(spec)}
        for step in self.checkpoint_steps():
            p = edir / f"step_{step}.npz"
            if p.exists():
                ev = PolicyOnPrefixes.load(p)
            else:
                ev = evaluate_policy(
                    self._model(spec.name, cfg, step),
                    prefixes,
                    batch_size=self.preset.eval_batch_size,
                )
            for r in out:
                kl = prefix_kl(
                    ev,
                    refs[r][step],
                    temperature=self.preset.kl_temperature,
                    chunk_size=self.preset.kl_chunk_size,
                )
                out[r][step] = (kl["forward"], kl["reverse"])
        cache.write_text(
            json.dumps({r: {str(k): v for k, v in by.items()} for r, by in out.items()})
        )
        return out

    def wants_own_prefixes(self, spec: RunSpec) -> bool:
        sc = self.preset.own_prefix_scenarios
        return bool(sc) and (spec.scenario in sc or spec.arm == "onpolicy")

    def own_distances(
        self, spec: RunSpec, cfg, prefixes, ref_cfgs: dict
    ) -> dict[str, dict[int, tuple[float, float]]]:
        """Like :meth:`distances`, but on prefixes the run samples itself from theta_t at each
        checkpoint
        (the first ``own_prefix_prompts`` reference prompts, one response each, a fixed seed per
        step)."""
        from dlc_jax.data.tokenize import load_tokenizer
        from dlc_jax.experiments.distance import evaluate_policy, prefix_kl
        from dlc_jax.experiments.own_prefixes import own_prefix_set

        edir = self.out / "evals" / spec.name
        cache = edir / "own_kl.json"
        if cache.exists():
            d = json.loads(cache.read_text())
            return {r: {int(k): tuple(v) for k, v in by.items()} for r, by in d.items()}
        edir.mkdir(parents=True, exist_ok=True)
        tok = load_tokenizer(cfg.model.path)
        k = min(self.preset.own_prefix_prompts, prefixes.tokens.shape[0])
        prompts = [prefixes.tokens[i, : prefixes.prompt_lens[i]] for i in range(k)]
        max_tokens = int(prefixes.meta.get("config", {}).get("max_tokens", cfg.sampler.max_tokens))
        out: dict[str, dict[int, tuple[float, float]]] = {r: {} for r in self.refs_for(spec)}
        lens = {}
        for step in self.checkpoint_steps():
            model = self._model(spec.name, cfg, step)
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
            ev = evaluate_policy(model, own, batch_size=self.preset.eval_batch_size)
            for r in out:
                ev_r = evaluate_policy(
                    self._model(r, ref_cfgs[r], step), own, batch_size=self.preset.eval_batch_size
                )
                kl = prefix_kl(
                    ev,
                    ev_r,
                    temperature=self.preset.kl_temperature,
                    chunk_size=self.preset.kl_chunk_size,
                )
                out[r][step] = (kl["forward"], kl["reverse"])
        cache.write_text(
            json.dumps({r: {str(k): v for k, v in by.items()} for r, by in out.items()})
        )
        (edir / "own_lens.json").write_text(json.dumps(lens))
        return out

    def result(self, spec: RunSpec, run_dir: Path, kl: dict, own: dict | None) -> RunResult:
        rows = read_metrics(run_dir / "logs" / "metrics.jsonl")
        steps, series = normalize_metrics(rows)
        kl_steps = sorted({s for by in kl.values() for s in by})
        refs = sorted(kl)

        def mean_at(d, s, i):
            vals = [d[r][s][i] for r in d if s in d[r]]
            return float(sum(vals) / len(vals)) if vals else None

        done = json.loads((run_dir / "DONE").read_text())
        own = own or {}
        return RunResult(
            name=spec.name,
            arm=spec.arm,
            scenario=spec.scenario,
            steps=steps,
            series=series,
            kl_steps=kl_steps,
            kl_forward=[mean_at(kl, s, 0) for s in kl_steps],
            kl_reverse=[mean_at(kl, s, 1) for s in kl_steps],
            wall_s=float(done.get("wall_s", 0.0)),
            seed=spec.seed,
            kl_by_ref={r: [kl[r].get(s, (None,))[0] for s in kl_steps] for r in refs},
            own_kl_by_ref={r: [own[r].get(s, (None,))[0] for s in kl_steps] for r in sorted(own)},
            info={"overrides": list(spec.overrides), "trained_as": run_dir.name},
        )

    def run(self, *, report: bool = True) -> Path:
        t_all = time.time()
        self.out.mkdir(parents=True, exist_ok=True)
        model_dir = self.resolve_model()
        prefixes = self.make_prefixes(model_dir)
        _log(
            f"{prefixes.num_prefixes} reference prefixes; {len(self.specs)} runs x {self.steps} "
            "steps, "
            f"checkpoints at {self.checkpoint_steps()}"
        )
        trained: dict[str, str] = {}  # training identity -> run name that trained it
        done: dict[str, tuple[Path, dict, dict | None]] = {}
        failures: dict[str, str] = {}
        onpol = [s for s in self.specs if s.arm == "onpolicy"]
        ref_cfgs = {s.name: self.run_config(s, model_dir) for s in onpol}
        refs = {}
        for spec in onpol:  # no reference, no experiment: these must all finish
            t0 = time.time()
            fresh = not (self.out / "runs" / spec.name / "DONE").exists()
            self.train(spec, ref_cfgs[spec.name])
            refs[spec.name] = self.reference_evals(spec, ref_cfgs[spec.name], prefixes)
            if fresh:
                self.timings[spec.name] = time.time() - t0
        for spec in self.specs:
            cfg = ref_cfgs.get(spec.name) or self.run_config(spec, model_dir)
            ident = self.training_identity(cfg)
            src = trained.get(ident)
            if src is not None and src != spec.name and src in done:
                _log(f"{spec.name}: identical config to {src}; reusing its run")
                run_dir, kl, own = done[src]
            else:
                t0 = time.time()
                try:
                    fresh = not (self.out / "runs" / spec.name / "DONE").exists()
                    run_dir = self.train(spec, cfg)
                    kl = self.distances(spec, cfg, prefixes, refs)
                    own = (
                        self.own_distances(spec, cfg, prefixes, ref_cfgs)
                        if self.wants_own_prefixes(spec)
                        else None
                    )
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failures[spec.name] = str(e)[-2000:]
                    _log(
                        f"{spec.name} FAILED (continuing; listed in failures.json): {str(e)[:300]}"
                    )
                    continue
                if fresh and spec.name not in self.timings:
                    self.timings[spec.name] = time.time() - t0
                trained[ident] = spec.name
                done[spec.name] = (run_dir, kl, own)
            self.result(spec, run_dir, kl, own).save(self.out)
            self._write_noise(onpol)
        (self.out / "failures.json").write_text(json.dumps(failures, indent=1))
        _log(f"all runs done in {time.time() - t_all:.0f}s ({len(failures)} failed)")
        if self.timings:  # keep earlier invocations' timings: one file per invocation
            (self.out / f"timings_{time.strftime('%Y%m%d_%H%M%S')}.json").write_text(
                json.dumps(
                    {
                        "total_s": time.time() - t_all,
                        "started": t_all,
                        "finished": time.time(),
                        "runs": self.timings,
                        "loadavg": _loadavg(),
                    },
                    indent=1,
                )
            )
        if report:
            return self.write_report()
        return self.out

    def _write_noise(self, onpol: list[RunSpec]) -> None:
        """N_t = mean over ordered on-policy pairs (i != j) of KL(O_i,t || O_j,t), on the reference
        prefixes
        and (when measured) on each run's own prefixes; every pair is kept for the bootstrap."""
        from dlc_jax.experiments.results import load_results

        res = load_results(self.out)
        have = [res[s.name] for s in onpol if s.name in res]
        if len(have) < 2:
            return
        steps = have[0].kl_steps
        pairs = {f"{r.name}|{ref}": vals for r in have for ref, vals in r.kl_by_ref.items()}
        own = {f"{r.name}|{ref}": vals for r in have for ref, vals in r.own_kl_by_ref.items()}

        def mean(d):
            return (
                [float(sum(v[i] for v in d.values()) / len(d)) for i in range(len(steps))]
                if d
                else []
            )

        # ordered pairs hold both directions, so the mean forward and reverse KL coincide
        NoiseThreshold(
            steps=steps, forward=mean(pairs), reverse=mean(pairs), pairs=pairs, own_pairs=own
        ).save(self.out)

    def write_report(self) -> Path:
        from dlc_jax.experiments.report import write_report

        notes = list(self.preset.notes)
        f = self.out / "failures.json"
        if f.exists() and json.loads(f.read_text()):
            notes.append(
                "runs that failed and are missing from the tables: "
                f"{sorted(json.loads(f.read_text()))} "
                f"(see failures.json and runs/<name>/train.log)."
            )
        return write_report(
            self.out,
            title=f"KL to on-policy training — preset `{self.preset.name}`",
            notes=notes,
            preset=self.preset,
            steps=self.steps,
            ckpt_every=self.ckpt_every,
        )


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"no metrics at {path} (did the run log JSONL?)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
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
    targets = {
        "results": ["results", "noise.json"],
        "evals": ["evals", "results", "noise.json"],
        "report": ["report.md", "plots"],
    }[what]
    for t in targets:
        p = out / t
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
