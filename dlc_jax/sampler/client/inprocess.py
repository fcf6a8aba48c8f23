"""`InProcessSampler`: the JAX backend behind the `Sampler` protocol in the caller's process
(``sampler.backend=inprocess``), with the server's request checks, version-tagged tokens and
atomic weight swaps between decode steps."""

from __future__ import annotations

import itertools
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..backends.base import BackendConfig
from ..backends.jax_backend import JaxBackend
from ..service.server_config import ServerConfig
from ..service.service import check_request
from ..wire.types import PushResult, Rollout
from .protocol import SingleSampler, generate_request
from .retry import RetryPolicy

# the server's default limits: the same requests are refused in process as over gRPC
SERVER_DEFAULTS = ServerConfig()

_ids = itertools.count()


class InProcessSampler(SingleSampler):
    """A `Sampler` running the JAX backend (`cfg`) here; `generate` is thread-safe."""

    def __init__(self, cfg: BackendConfig):
        self.backend = JaxBackend(cfg)
        graphdef, state = self.backend.load_weights_dir(cfg.model_dir)
        self.backend.set_weights(graphdef, state, int(cfg.initial_version))
        self.address = f"inprocess:{next(_ids)}"
        self._closed = False
        self._push_lock = threading.Lock()
        self.counters = {"tokens_generated": 0, "requests": 0, "pushes": 0, "rejected_pushes": 0}

    @classmethod
    def from_section(cls, sampler_cfg: Any, model_dir: str | pathlib.Path) -> InProcessSampler:
        """From the trainer's ``sampler`` config section, with a spawned sampler's limits."""
        s = sampler_cfg
        return cls(
            BackendConfig(
                model_dir=str(model_dir),
                dtype="bfloat16" if s.dtype in ("bfloat16", "float16") else "float32",
                quantization=s.quantization or None,
                max_model_len=s.max_model_len,
                max_n=max(1, s.n),
                max_head_k=max(1, s.head_k),
                weight_noise=s.weight_noise,
            )
        )

    def _generate(self, prompts, params, slot_ids, request_id) -> Iterator[Rollout]:
        """A request the server would refuse raises `RequestError` (before any rollout)."""
        self._check_open()
        req = generate_request(prompts, params, slot_ids)
        checked, params = check_request(self.backend, SERVER_DEFAULTS, req)
        self.counters["requests"] += 1
        for r in self.backend.generate_sync(request_id, checked, params):
            self.counters["tokens_generated"] += len(r.response_ids)
            yield r

    def push_weights(self, named_tensors: Any, version: int, **_options: Any) -> PushResult:
        """Load ``named_tensors`` ((name, array) pairs, or a callable returning them) as
        ``version``; names and shapes must be the served model's. The wire's options are ignored."""
        self._check_open()
        t0 = time.time()
        tensors = dict(named_tensors() if callable(named_tensors) else named_tensors)
        got = {n: tuple(a.shape) for n, a in tensors.items()}
        want = {n: tuple(shape) for n, (shape, _) in self.backend.expected_tensors().items()}
        if got != want:
            bad = sorted(set(got) ^ set(want)) or sorted(n for n in got if got[n] != want[n])
            message = f"push v{version}: tensors differ from the served model's ({bad[:3]})"
            return self._refused(message, "INVALID_ARGUMENT")

        def state():  # the backend's load of a memory-staged push, with its numerics knobs
            load = self.backend.begin_load()
            for name, arr in tensors.items():
                load.add(name, arr)
            return load.state()

        return self._serve(state, version, tensors, t0)

    def push_adapter(self, tensors: Any, version: int, meta: Any) -> PushResult:
        """Serve the start-up base + the LoRA adapter ``tensors`` ((PEFT name, array) pairs;
        ``meta``: its `AdapterMeta`) as ``version``, after a server's adapter checks."""
        import numpy as np

        from ..push.adapter import check_adapter
        from ..push.weight_checks import PushError

        self._check_open()
        t0 = time.time()
        adapter = {n: np.asarray(a, np.float32) for n, a in tensors}
        b = self.backend
        try:
            check_adapter(b.expected_tensors(), adapter, meta, b.adapter_base)
        except PushError as e:
            return self._refused(e.message, e.code.name)
        return self._serve(lambda: b.merged_adapter_state(adapter, meta), version, adapter, t0)

    def _refused(self, message: str, code: str) -> PushResult:
        self.counters["rejected_pushes"] += 1
        return PushResult(False, self.backend.version, message, code=code)

    def _serve(self, state: Callable, version: int, tensors: dict, t0: float) -> PushResult:
        """Serve `state()` as `version` (one push at a time) -> the push's result."""
        with self._push_lock:
            self.backend.serve_state(state(), int(version))
            self.counters["pushes"] += 1
        nbytes = sum(int(a.nbytes) for a in tensors.values())
        return PushResult(
            True, int(version), "", bytes=nbytes, seconds=time.time() - t0, transport="inprocess"
        )

    def info(self, *, timeout: float | None = None, retry: RetryPolicy | None = None) -> dict:
        self._check_open()
        b = self.backend
        return {
            "model_config": dict(b.model_config),
            "version": b.version,
            "backend": "inprocess",
            "queue_depth": 0,
            **self.counters,
            **b.limits(),  # vocab_size, max_model_len, max_n, max_head_k
            "data_port": 0,
        }

    def wait_ready(self, timeout: float = 120.0) -> dict:
        return self.info()

    @property
    def active(self) -> bool:
        return not self._closed

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise SamplerClosed(f"sampler {self.address} is closed")


class SamplerClosed(RuntimeError):
    """A call on a closed `InProcessSampler` (the trainer recovers by making a new one)."""
