"""JAX backend: the project's models with a KV cache, batched prefill + jitted decode and
vLLM-equivalent sampling (`jax_sampling`). Numerics knobs, applied in HF layout to every 2-D weight
as it loads: `quantization="int8"` / `"fp8_e4m3"` (weight-only, per output channel, dequantized
back), `weight_noise=s` (w += s * rms(w) * N(0,1), fixed seed). Token t of sample j of prompt i
uses key fold_in(seed, i, j, t), whatever the batching; a batch whose weights changed between
decode steps is re-prefilled with the new ones, so every token comes from one version."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import pathlib
import shutil
import tempfile
import threading
import zlib

import numpy as np

from ..wire import safetensors_io as st
from ..wire.types import Rollout, SamplingParams, spans_from_versions
from .base import BackendConfig, SamplerBackend
from .jax_sampling import sample_args, sample_step


def available() -> bool:
    """Whether this backend can run here: its model package (JAX, Flax) imports."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("jax", "flax"))


_BUCKET = 32


def _bucket(n: int, m: int = _BUCKET) -> int:
    return max(m, -(-n // m) * m)


QUANTIZATIONS = (None, "", "int8", "fp8_e4m3")
FP8_E4M3_MAX = 448.0


def has_knobs(cfg: BackendConfig) -> bool:
    """Whether loaded weights pass through `transform_weights` (noise or quantization on)."""
    return cfg.weight_noise > 0 or cfg.quantization in ("int8", "fp8_e4m3")


def _row_scale(w: np.ndarray, qmax: float) -> np.ndarray:
    """Per-output-channel (per row) scale mapping max |w| to `qmax` (1 for an all-zero row)."""
    amax = np.max(np.abs(w), axis=tuple(range(1, w.ndim)), keepdims=True)
    return np.where(amax == 0, 1.0, amax / qmax).astype(np.float32)


def fp8_e4m3_roundtrip(w: np.ndarray) -> np.ndarray:
    """w quantized to FP8 e4m3 with a per-output-channel (per row) scale and dequantized."""
    import jax.numpy as jnp

    scale = _row_scale(w, FP8_E4M3_MAX)
    q = (w / scale).astype(jnp.float8_e4m3fn)
    return (q.astype(np.float32) * scale).astype(np.float32)


def transform_weights(name: str, w: np.ndarray, cfg: BackendConfig) -> np.ndarray:
    """Apply the numerics knobs to one HF tensor (fp32 math, returned as fp32)."""
    w = np.asarray(w, np.float32)
    if w.ndim < 2:
        return w
    if cfg.weight_noise > 0:
        rng = np.random.default_rng([cfg.weight_noise_seed, zlib.crc32(name.encode())])
        rms = float(np.sqrt(np.mean(np.square(w, dtype=np.float64))))
        w = w + np.float32(cfg.weight_noise * rms) * rng.standard_normal(w.shape, dtype=np.float32)
    if cfg.quantization == "int8":
        scale = _row_scale(w, 127.0)
        w = (np.clip(np.round(w / scale), -127, 127) * scale).astype(np.float32)
    if cfg.quantization == "fp8_e4m3":
        w = fp8_e4m3_roundtrip(w)
    return w


class JaxBackend(SamplerBackend):
    name = "jax"

    def __init__(self, cfg: BackendConfig):
        if cfg.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"jax backend: quantization must be one of {QUANTIZATIONS[1:]} or None, got "
                f"{cfg.quantization!r}"
            )
        super().__init__(cfg)
        self._lock = threading.Lock()
        self._graphdef = None
        self._state = None
        self._base_state = None
        self._seed_counter = np.random.default_rng(cfg.seed)
        self._routes = False  # the family returns routed experts (set at start)
        # loads on their own thread: decode batches queued on the default executor never delay them
        self._load_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jax-load")

    # -- weights ----------------------------------------------------------------------------
    def load_weights_dir(self, weights_dir: str):
        """HF safetensors dir -> (graphdef, params state), numerics knobs applied."""
        import jax.numpy as jnp
        from flax import nnx

        from dlc_jax.model import load_hf

        tmp = pathlib.Path(tempfile.mkdtemp(prefix="dlc_jaxbackend_"))
        try:
            shutil.copy(pathlib.Path(self.cfg.model_dir) / "config.json", tmp / "config.json")
            if has_knobs(self.cfg):
                st.write_file(
                    tmp / "model.safetensors",
                    {n: transform_weights(n, w, self.cfg) for n, w in st.iter_tensors(weights_dir)},
                )
            else:
                for f in st.safetensors_files(weights_dir):
                    os.symlink(f.resolve(), tmp / f.name)
            compute = jnp.bfloat16 if self.cfg.dtype == "bfloat16" else jnp.float32
            model = load_hf(tmp, param_dtype=jnp.float32, compute_dtype=compute)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return nnx.split(model)

    async def start(self) -> None:
        from dlc_jax.model.registry import family_for_hf

        family = family_for_hf(self.model_config)  # refuses an unsupported architecture
        if self.name not in family.samplers:
            raise ValueError(
                f"jax backend: model_type {family.model_type!r} runs on {list(family.samplers)}"
            )
        self._routes = family.routed_experts  # forward_with_cache can return the routed experts
        self._graphdef, self._state = await asyncio.to_thread(
            self.load_weights_dir, self.cfg.model_dir
        )
        self._base_state = self._state  # what LoRA adapter pushes are merged into

    async def _on_load_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._load_pool, fn, *args)

    async def apply_weights(self, weights_dir: str, version: int) -> None:
        graphdef, state = await self._on_load_thread(self.load_weights_dir, weights_dir)
        self.set_weights(graphdef, state, version)

    def set_weights(self, graphdef, state, version: int) -> None:
        """Serve (graphdef, state) as ``version`` from the next decode step on."""
        with self._lock:
            self._graphdef, self._state, self.version = graphdef, state, int(version)
            if self._base_state is None:  # the start-up weights: what adapters are merged into
                self._base_state = state

    def begin_load(self, state=None):
        """A tensor-by-tensor load into `state`'s structure (default: the served one)."""
        from .jax_weights import JaxWeightLoad

        return JaxWeightLoad(
            self._snapshot()[0] if state is None else state,
            int(self.model_config["num_hidden_layers"]),
            (lambda n, w: transform_weights(n, w, self.cfg)) if has_knobs(self.cfg) else None,
        )

    async def apply_load(self, load, version: int) -> None:
        self.serve_state(await self._on_load_thread(load.state), version)

    # -- LoRA adapter pushes: base + delta merged in memory at commit ------------------------------
    def adapter_base(self, rank: int) -> str:
        return self.base_fingerprint()

    def merged_adapter_state(self, adapter: dict[str, np.ndarray], meta):
        """The start-up base with ``W + scale * B @ A`` in every kernel ``adapter`` adapts: merged
        on the device, or with numerics knobs on the host from the model directory."""
        from ..push.adapter import merged_tensors, peft_name, split_name

        load = self.begin_load(self._base_state)
        if has_knobs(self.cfg):
            base = st.iter_tensors(self.cfg.model_dir)
            for name, w in merged_tensors(base, adapter, meta.scale):
                load.add(name, w)
        else:
            for mod in sorted({split_name(n)[0] for n in adapter}):
                a, b = adapter[peft_name(mod, "lora_A")], adapter[peft_name(mod, "lora_B")]
                load.add_lora(f"{mod}.weight", a, b, meta.scale)
        return load.state(partial=True)

    async def apply_adapter(self, adapter_dir: str, version: int, meta) -> None:
        from ..push.adapter import read_adapter

        state = await self._on_load_thread(
            lambda: self.merged_adapter_state(read_adapter(adapter_dir), meta)
        )
        self.serve_state(state, version)

    def serve_state(self, state, version: int) -> None:
        """Serve ``state`` (the served graph's parameters) as ``version`` from the next step on."""
        with self._lock:
            self._state, self.version = state, int(version)

    def _snapshot(self):
        with self._lock:
            return self._state, self.version

    # -- jitted pieces ----------------------------------------------------------------------
    @functools.cached_property
    def _fns(self):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        graphdef = self._graphdef
        cache_dtype = jnp.bfloat16 if self.cfg.dtype == "bfloat16" else jnp.float32
        routes, max_head_k = self._routes, self.cfg.max_head_k

        def forward(model, ids, positions, cache, mask=None):
            """(logits, cache, routed experts [B, T, L, K] or None)."""
            if routes:
                return model.forward_with_cache(
                    ids, positions, cache, attention_mask=mask, return_routing=True
                )
            return (*model.forward_with_cache(ids, positions, cache, attention_mask=mask), None)

        @functools.partial(jax.jit, static_argnames=("cache_len",))
        def prefill(state, ids, mask, cache_len):
            """ids, mask [B, L] (left-padded) -> (last logits [B, V] f32, cache of length
            cache_len, routed experts [B, L, layers, K] or None)."""
            model = nnx.merge(graphdef, state)
            positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
            cache = model.init_cache(ids.shape[0], cache_len, cache_dtype)
            logits, cache, routed = forward(model, ids, positions, cache, mask)
            return logits[:, -1].astype(jnp.float32), cache, routed

        @functools.partial(jax.jit, donate_argnames=("cache",))
        def decode(state, tok, pos, cache):
            """tok, pos [B] -> (logits [B, V] f32, cache, routed [B, 1, layers, K] or None); the
            cache is donated (k/v written in place)."""
            model = nnx.merge(graphdef, state)
            logits, cache, routed = forward(model, tok[:, None], pos[:, None], cache)
            return logits[:, 0].astype(jnp.float32), cache, routed

        def sample(logits, keys, temperature, top_k, top_p, head_k):
            """logits [B, V], keys [B] -> (tokens, logprobs [B], head ids/logprobs [B, head_k])."""
            traced, static = sample_args(
                temperature, top_k, top_p, head_k, vocab=logits.shape[-1], max_head_k=max_head_k
            )
            tok, lp, hid, hlp = sample_step(logits, keys, *traced, **static)
            return tok, lp, np.asarray(hid)[:, :head_k], np.asarray(hlp)[:, :head_k]

        return prefill, decode, sample

    # -- generation -------------------------------------------------------------------------
    def _generate_batch(
        self,
        seqs: list[tuple[int, int, int, list[int]]],
        params: SamplingParams,
        seed: int,
        request_id: str,
        cancel: threading.Event | None = None,
    ) -> list[Rollout]:
        """seqs: [(prompt_index, slot_id, sample_index, prompt)] -> rollouts ([] once `cancel`)."""
        import jax
        import jax.numpy as jnp

        prefill, decode, sample = self._fns
        b_real = len(seqs)
        b = 1 << (b_real - 1).bit_length()  # pad the batch to a power of two (fewer compiles)
        lp_len = _bucket(max(len(s[3]) for s in seqs))
        t_max = params.max_tokens
        # a re-prefill at step t runs on lp_len + _bucket(t) slots (fewer than _BUCKET of them left
        # padding), then decodes the other t_max - 1 - t tokens: room for both
        cache_len = lp_len + _bucket(t_max + _BUCKET - 1)
        tokens = np.zeros((b, lp_len + t_max), np.int32)
        mask = np.zeros((b, lp_len + t_max), np.int32)
        for r, (_, _, _, p) in enumerate(seqs):
            tokens[r, lp_len - len(p) : lp_len] = p
            mask[r, lp_len - len(p) : lp_len] = 1
        mask[b_real:, lp_len - 1] = 1  # padding rows: a one-token dummy prompt (token 0)
        plen = mask[:, :lp_len].sum(1)
        base = jax.random.PRNGKey(seed)
        per_row = [jax.random.fold_in(jax.random.fold_in(base, s[0]), s[2]) for s in seqs]
        row_keys = jnp.stack(per_row + [base] * (b - b_real))
        stop = set(params.stop_token_ids)
        out_lp = np.zeros((b, t_max), np.float32)
        out_hid = np.zeros((b, t_max, params.head_k), np.int32)
        out_hlp = np.zeros((b, t_max, params.head_k), np.float32)
        out_ver = np.zeros((b, t_max), np.int64)
        done = np.arange(b) >= b_real  # padding rows are done from the start
        length = np.full(b, t_max)
        finish = ["length"] * b
        want_routes = params.return_routed_experts and self._routes
        out_route: np.ndarray | None = None
        knobs = (float(params.temperature), int(max(params.top_k, 0)), float(params.top_p))
        version = -1  # set by the first step's prefill
        for t in range(t_max):
            if cancel is not None and cancel.is_set():
                return []
            new_state, new_version = self._snapshot()
            if t == 0 or new_version != version:  # the KV of the whole prefix (with new weights)
                state, version = new_state, new_version
                # left-padded to a bucket, so re-prefills at any step share a few compiles
                pad = _bucket(t) - t if t else 0
                logits, cache, routed = prefill(
                    state,
                    jnp.asarray(np.pad(tokens[:, : lp_len + t], ((0, 0), (pad, 0)))),
                    jnp.asarray(np.pad(mask[:, : lp_len + t], ((0, 0), (pad, 0)))),
                    cache_len,
                )
                if want_routes:  # these weights' routing of the whole prefix
                    prefix_route = np.asarray(routed)[:, pad:]
                    if out_route is None:
                        n_exp = int(self.model_config.get("num_experts", 0))
                        dt = np.uint8 if n_exp <= 256 else np.uint16
                        out_route = np.zeros((b, lp_len + t_max, *prefix_route.shape[2:]), dt)
                    out_route[:, : lp_len + t] = prefix_route
            keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, t)
            tok, lp, hid, hlp = sample(logits, keys, *knobs, int(params.head_k))
            tok = np.asarray(tok)
            tokens[:, lp_len + t] = tok
            mask[:, lp_len + t] = 1
            out_lp[:, t], out_ver[:, t] = np.asarray(lp), version
            if params.head_k:
                out_hid[:, t], out_hlp[:, t] = np.asarray(hid), np.asarray(hlp)
            for r in range(b_real):
                if not done[r] and int(tok[r]) in stop:
                    done[r], length[r], finish[r] = True, t + 1, "stop"
            if done.all() or t == t_max - 1:
                break
            logits, cache, routed = decode(state, jnp.asarray(tok), jnp.asarray(plen + t), cache)
            if out_route is not None:
                out_route[:, lp_len + t] = np.asarray(routed)[:, 0]
        return [
            Rollout(
                prompt_ids=np.asarray(p, np.int32),
                response_ids=tokens[r, lp_len : lp_len + n].copy(),
                logprobs=out_lp[r, :n].copy(),
                head_ids=out_hid[r, :n].copy(),
                head_logprobs=out_hlp[r, :n].copy(),
                finish_reason=finish[r],
                version_spans=spans_from_versions(out_ver[r, :n].tolist()),
                slot_id=slot,
                sample_index=j,
                request_id=request_id,
                # positions the model ran on: the prompt and all response tokens but the last
                routed_experts=None
                if out_route is None
                else out_route[r, lp_len - len(p) : lp_len + n - 1].copy(),
            )
            for r, ((_, slot, j, p), n) in enumerate(zip(seqs, length.tolist()))
        ]

    def _batches(self, prompts, params):
        """(seed, [seqs of at most max_batch]) of a request: prompts [(slot_id, token_ids)]."""
        seed = params.seed if params.seed is not None else int(self._seed_counter.integers(2**31))
        seqs = [
            (i, slot, j, list(p)) for i, (slot, p) in enumerate(prompts) for j in range(params.n)
        ]
        bs = self.cfg.max_batch
        return seed, [seqs[k : k + bs] for k in range(0, len(seqs), bs)]

    async def generate(self, request_id, prompts, params):
        seed, batches = self._batches(prompts, params)
        cancel = threading.Event()
        try:
            for seqs in batches:
                for r in await asyncio.to_thread(
                    self._generate_batch, seqs, params, seed, request_id, cancel
                ):
                    yield r
        finally:  # consumer gone (client disconnected / cancelled): stop the decode loop
            cancel.set()

    def generate_sync(self, request_id, prompts, params):
        """`generate` in the caller's thread (the in-process sampler): same rollouts and keys."""
        seed, batches = self._batches(prompts, params)
        for seqs in batches:
            yield from self._generate_batch(seqs, params, seed, request_id)

    async def close(self) -> None:
        self._load_pool.shutdown(wait=False)
        self._state = None
