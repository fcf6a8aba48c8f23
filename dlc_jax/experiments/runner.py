"""Drives an experiment's stages under ``out`` (initial model, ``prefixes/``, ``runs/<name>/``,
``evals/<name>/``, ``results/``, ``noise.json``, ``report.md``), each skipped when its output exists
(an interrupted experiment resumes); runs whose resolved configs are identical train once."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from dlc_jax.experiments.budget import Budget, estimate
from dlc_jax.experiments.checkpoint_evals import CheckpointEvals, HeldoutEvals
from dlc_jax.experiments.heldout_split import (
    SPLIT_FILE,
    disjoint_heldout,
    training_prompts,
    write_split,
)
from dlc_jax.experiments.launch import (
    REPO_ROOT,
    loadavg,
    log_progress,
    sample_reference_prefixes,
    train_run,
)
from dlc_jax.experiments.matrix import RunSpec, onpolicy_name, run_specs
from dlc_jax.experiments.prefixes import PrefixSet
from dlc_jax.experiments.presets import ExperimentPreset
from dlc_jax.experiments.report import write_report
from dlc_jax.experiments.run_outputs import run_result, write_noise
from dlc_jax.experiments.warmup import data_file, ensure_chain_model


class Experiment:
    """Runs a preset's matrix under ``out`` (``workers`` trainings at once)."""

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
        workers: int = 1,
        cache_dir: str | Path | None = None,
    ):
        if workers < 1:
            raise ValueError(f"--workers must be >= 1, got {workers}")
        self.workers = int(workers)
        self._cache_dir = Path(cache_dir).absolute() if cache_dir is not None else None
        self.preset = preset
        self.out = Path(out).absolute()
        self.steps = int(steps or preset.steps)
        self.ckpt_every = min(preset.checkpoint_every, self.steps)
        self.specs = run_specs(preset, arms, scenarios, seeds)
        self.run_timeout_s = run_timeout_s
        self.extra_overrides = tuple(extra_overrides)
        self.timings: dict[str, float] = {}
        self.evals = CheckpointEvals(preset, self.out, self.checkpoint_steps())
        self.heldout = HeldoutEvals(preset, self.out, self.checkpoint_steps(), self.prefix_config)

    def _base_path(self) -> Path:
        return REPO_ROOT / self.preset.base_config  # an absolute base_config stays as it is

    def cache_dir(self) -> Path:
        """Warm-up model, task data and compile cache (``out/cache`` unless shared)."""
        return self._cache_dir or self.out / "cache"

    def base_overrides(self) -> list[str]:
        ov = list(self.preset.overrides) + [
            f"train.steps={self.steps}",
            f"checkpoint.every={self.ckpt_every}",
            f"checkpoint.keep={self.steps // self.ckpt_every + 2}",
            "checkpoint.resume=true",
            # a never-synced sampler is up to `steps` versions behind: keep its rollouts
            f"async.max_staleness={self.steps + 1}",
            f"sft.cache_dir={self.cache_dir()}",
        ]
        if self.preset.task is not None:
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
        """Everything that determines a training run except where it writes."""
        d = cfg.to_dict()
        d["checkpoint"] = {k: v for k, v in d["checkpoint"].items() if k != "dir"}
        d["log"] = {}
        return json.dumps(d, sort_keys=True)

    def budget(self) -> Budget:
        """The dry-run estimate of this matrix (budget.py)."""
        ov = list(self.preset.overrides) + list(self.extra_overrides)
        batch = [int(o.split("=", 1)[1]) for o in ov if o.startswith("train.batch_prompts=")]
        trainings = len({tuple(sorted(s.overrides)) for s in self.specs})
        return estimate(len(self.specs), trainings, self.steps, (batch or [16])[-1], self.workers)

    def resolve_model(self) -> str:
        """The initial policy's HF dir every run starts from (SFT off), made once."""
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
            log_progress(f"chain-arithmetic warm-up ({self.preset.task.steps} SFT steps)")
            model_dir = str(ensure_chain_model(self.preset.task, self.cache_dir()))
        else:
            from dlc_jax.trainer import sft

            model_dir = str(
                sft.ensure_sft_model(cfg, log=log_progress)
                if cfg.sft.enabled
                else sft.base_model_dir(cfg)
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
            t = self.preset.task
            n = max(pcfg.num_prompts, self.preset.heldout.prompts, 64)
            held = self.cache_dir() / f"chain_arith_heldout-{t.key()}-{n}-disjoint.jsonl"
            if not held.exists() or not (self.out / SPLIT_FILE).exists():
                train = training_prompts(data_file(t, self.cache_dir()))
                rows, _ = disjoint_heldout(t.task, pcfg.data_seed, n, train)
                self.out.mkdir(parents=True, exist_ok=True)
                write_split(held, rows, self.out, train)
            pcfg = dataclasses.replace(
                pcfg, source=str(held), prompt_field="prompt", answer_field="answer"
            )
        return pcfg

    def make_prefixes(self, model_dir: str):
        pdir = self.out / "prefixes"
        if PrefixSet.exists(pdir):
            return PrefixSet.load(pdir)
        cfg = self.run_config(self.specs[0], model_dir)
        return sample_reference_prefixes(self.out, cfg, self.prefix_config(), model_dir)

    def train(self, spec: RunSpec, cfg) -> Path:
        """Train one run in a subprocess, unless it already finished."""
        return train_run(
            spec,
            cfg,
            self.out / "runs" / spec.name,
            jax_cache=self.out / "jax_cache",
            timeout_s=self.run_timeout_s,
        )

    def checkpoint_steps(self) -> list[int]:
        return list(range(self.ckpt_every, self.steps + 1, self.ckpt_every))

    def refs_for(self, spec: RunSpec) -> list[str]:
        """On-policy runs a run is compared with: those of the other sampling seeds."""
        return [onpolicy_name(s) for s in self.preset.onpolicy_seeds if s != spec.seed]

    def wants_own_prefixes(self, spec: RunSpec) -> bool:
        sc = self.preset.own_prefix_scenarios
        return bool(sc) and (spec.scenario in sc or spec.arm == "onpolicy")

    def run(self, *, report: bool = True) -> Path:
        t_all = time.time()
        model_dir = self.resolve_model()  # makes self.out
        prefixes = self.make_prefixes(model_dir)
        log_progress(
            f"{prefixes.num_prefixes} reference prefixes; {len(self.specs)} runs x {self.steps} "
            f"steps, checkpoints at {self.checkpoint_steps()}, {self.workers} worker(s)"
        )
        cfgs = {s.name: self.run_config(s, model_dir) for s in self.specs}
        same: dict[str, list[RunSpec]] = {}  # training identity -> the runs of that config
        for spec in self.specs:
            same.setdefault(self.training_identity(cfgs[spec.name]), []).append(spec)
        aliases = {runs[0].name: runs for runs in same.values()}  # the run that trains -> all
        failures: dict[str, str] = {}
        onpol = [s for s in self.specs if s.arm == "onpolicy"]
        for spec, err in self._train_parallel(onpol, cfgs):  # no reference, no experiment
            if err is not None:
                raise RuntimeError(f"on-policy run {spec.name} failed: {err}")
        refs = {s.name: self.evals.reference_evals(s.name, cfgs[s.name], prefixes) for s in onpol}
        todo = onpol + [s for s in self.specs if s.arm != "onpolicy" and s.name in aliases]
        for spec, err in self._train_parallel(todo, cfgs):
            if err is not None:
                failures[spec.name] = str(err)[-2000:]
                log_progress(
                    f"{spec.name} FAILED (continuing; listed in failures.json): {str(err)[:300]}"
                )
                continue
            self._evaluate(spec, cfgs, prefixes, refs, aliases[spec.name])
            write_noise(self.out, [s.name for s in onpol])
        (self.out / "failures.json").write_text(json.dumps(failures, indent=1))
        log_progress(f"all runs done in {time.time() - t_all:.0f}s ({len(failures)} failed)")
        if self.timings:  # keep earlier invocations' timings: one file per invocation
            t_end = time.time()
            timing: dict = {"total_s": t_end - t_all, "started": t_all, "finished": t_end}
            timing.update(workers=self.workers, runs=self.timings, loadavg=loadavg())
            path = self.out / f"timings_{time.strftime('%Y%m%d_%H%M%S')}.json"
            path.write_text(json.dumps(timing, indent=1))
        return self.write_report() if report else self.out

    def _train_parallel(self, specs: list[RunSpec], cfgs: dict):
        """Yield (spec, None | error) as the trainings finish, ``self.workers`` at a time."""

        def one(spec: RunSpec) -> Exception | None:
            t0 = time.time()
            fresh = not (self.out / "runs" / spec.name / "DONE").exists()
            try:
                self.train(spec, cfgs[spec.name])
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                return e
            if fresh:
                self.timings[spec.name] = time.time() - t0
            return None

        if self.workers <= 1:
            yield from ((spec, one(spec)) for spec in specs)
            return
        with ThreadPoolExecutor(self.workers) as pool:
            futures = {pool.submit(one, spec): spec for spec in specs}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()  # other exceptions propagate

    def _evaluate(self, spec: RunSpec, cfgs: dict, prefixes, refs: dict, same: list[RunSpec]):
        """Evaluate the trained ``spec``; its result is saved under every run name in ``same``."""
        cfg = cfgs[spec.name]
        t0 = time.process_time()
        others = self.refs_for(spec)
        kl = self.evals.distances(spec.name, cfg, prefixes, {r: refs[r] for r in others})
        own = (
            self.evals.own_distances(spec.name, cfg, prefixes, {r: cfgs[r] for r in others})
            if self.wants_own_prefixes(spec)
            else None
        )
        held = self.heldout.run(spec.name, cfg, self.evals.model)
        if spec.name in self.timings:
            self.timings[f"{spec.name}/eval_cpu_s"] = time.process_time() - t0
        for alias in same:
            if alias.name != spec.name:
                log_progress(f"{alias.name}: identical config to {spec.name}; reusing its run")
            run_result(alias, self.out / "runs" / spec.name, kl, own, held).save(self.out)

    def write_report(self) -> Path:
        notes = list(self.preset.notes)
        f = self.out / "failures.json"
        failed = json.loads(f.read_text()) if f.exists() else {}
        if failed:
            notes.append(
                f"runs that failed and are missing from the tables: {sorted(failed)} "
                "(see failures.json and runs/<name>/train.log)."
            )
        return write_report(
            self.out,
            title=f"KL to on-policy training — preset `{self.preset.name}`",
            notes=notes,
            preset=self.preset,
            steps=self.steps,
            ckpt_every=self.ckpt_every,
        )
