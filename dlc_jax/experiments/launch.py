"""The processes an experiment launches: a training run (``dlc-jax train``) and the sampler that
draws the reference prefixes, each skipped when its output exists."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dlc_jax.data.tokenize import load_tokenizer
from dlc_jax.experiments.matrix import RunSpec
from dlc_jax.experiments.prefixes import client_generate, load_or_create

REPO_ROOT = Path(__file__).resolve().parents[2]


def log_progress(msg: str) -> None:
    print(f"[experiment {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def train_run(spec: RunSpec, cfg, run_dir: Path, *, jax_cache: Path, timeout_s: float) -> Path:
    """Train one run in a subprocess under ``run_dir`` unless it finished (``run_dir/DONE``)."""
    from dlc_jax.trainer.config import dump_config

    if (run_dir / "DONE").exists():
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.yaml"
    cfg_path.write_text(dump_config(cfg))
    cmd = [sys.executable, "-m", "dlc_jax.cli", "train", "--config", str(cfg_path)]
    log_progress(f"train {spec.name}: {' '.join(spec.overrides)}")
    t0 = time.time()
    env = dict(os.environ)
    # runs share shapes: a persistent compilation cache saves most of each run's compile time
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(jax_cache))
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
        rc, cpu_s = _wait_with_usage(proc, timeout_s)
    wall = time.time() - t0
    if rc != 0:
        tail = (run_dir / "train.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(
            f"run {spec.name} failed with exit code {rc}; log {run_dir / 'train.log'}:\n{tail}"
        )
    (run_dir / "DONE").write_text(
        json.dumps({"wall_s": wall, "cpu_s": cpu_s, "loadavg": loadavg()})
    )
    log_progress(f"train {spec.name}: done in {wall:.0f}s ({cpu_s:.0f} CPU-s, load {loadavg()})")
    return run_dir


def _wait_with_usage(proc: subprocess.Popen, timeout_s: float) -> tuple[int, float]:
    """Wait for ``proc`` (killed after ``timeout_s``) -> (exit code, CPU-seconds incl. children)."""
    deadline = time.time() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, float(usage.ru_utime + usage.ru_stime)
        if time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        time.sleep(0.2)


def loadavg() -> str:
    """The 1/5/15-minute load averages ("" where unavailable)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


def sample_reference_prefixes(out: Path, cfg, pcfg, model_dir: str):
    """The reference prefix set under ``out/prefixes``, sampled by ``cfg``'s sampler backend."""
    from dlc_jax.sampler.service.process import SamplerProcess

    tok = load_tokenizer(model_dir)
    pcfg = dataclasses.replace(pcfg, temperature=cfg.sampler.temperature)
    log_progress(
        f"creating reference prefixes ({pcfg.num_prompts} prompts) with the "
        f"{cfg.sampler.backend} sampler"
    )
    proc = SamplerProcess(
        cfg.sampler.backend,
        model_dir,
        extra_args=["--max-model-len", str(cfg.sampler.max_model_len)],
        log_file=str(out / "prefixes_sampler.log"),
    )
    proc.start()
    try:
        with proc.client() as client:
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            return load_or_create(
                out / "prefixes",
                pcfg,
                tok,
                client_generate(client),
                pad_id=int(pad),
                extra_meta={"model_dir": model_dir, "backend": cfg.sampler.backend},
            )
    finally:
        proc.stop()
