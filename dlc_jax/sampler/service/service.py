"""The Sampler gRPC service: bearer-token auth on every call; Generate (a rollout with NaN
log-probs is never sent: INTERNAL); weight pushes (serialized, applied only on Commit, any failure
keeping the old weights; sliced pushes applied by a group commit); LoadWeights and Info."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import pathlib
import shutil
import time
from typing import cast

import grpc
import numpy as np

from ..backends.base import SamplerBackend
from ..push import adapter as adapter_push
from ..push import data_plane, relay
from ..push import group as push_group
from ..push import session as push_session
from ..push import sliced as sliced_push
from ..push.staging import WeightStager
from ..push.warm_staging import WarmStaging
from ..push.weight_checks import PushError, check_load_files, check_load_path
from ..wire import sampler_pb2 as pb
from ..wire.types import SamplingParams
from .request_checks import RequestError, validate_generate
from .server_config import ServerConfig

log = logging.getLogger(__name__)


def check_request(
    backend: SamplerBackend, cfg: ServerConfig, request: pb.GenerateRequest
) -> tuple[list[tuple[int, list[int]]], SamplingParams]:
    """`validate_generate` against the backend's and the server's limits (served or in process)."""
    return validate_generate(
        request,
        **backend.limits(),
        max_prompts=cfg.max_prompts,
        min_temperature=cfg.min_temperature,
    )


class SamplerService:
    """The RPCs of one sampler server over `backend` (module doc)."""

    def __init__(self, backend: SamplerBackend, cfg: ServerConfig):
        self.backend = backend
        self.cfg = cfg
        self._push_lock = asyncio.Lock()
        self._io_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="push-io")
        self._current_dir = pathlib.Path(backend.cfg.model_dir)
        self._owned_dir: pathlib.Path | None = None  # staged dir now serving (deleted on next swap)
        self._adapter_dir: pathlib.Path | None = None  # the staged LoRA adapter now serving
        self.counters = {"tokens_generated": 0, "requests": 0, "pushes": 0, "rejected_pushes": 0}
        self.queue_depth = 0
        self.data_listener: data_plane.DataPlaneListener | None = None  # set by SamplerServer.start
        self._group = push_group.PendingGroup()  # a sliced push between its part streams
        # memory staging: superseded staging files stay mapped for the next push (warm_staging)
        self.warm_staging = (
            WarmStaging() if cfg.push_staging == "memory" and cfg.push_staging_warm else None
        )

    async def _auth(self, context) -> None:
        if self.cfg.token is None:
            return
        md = dict(context.invocation_metadata() or ())
        got = md.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.cfg.token}".encode()):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong bearer token in 'authorization' metadata",
            )

    # -- Generate ---------------------------------------------------------------------------
    async def Generate(self, request, context):
        await self._auth(context)
        try:
            prompts, params = check_request(self.backend, self.cfg, request)
        except RequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        self.counters["requests"] += 1
        pending = len(prompts) * params.n
        self.queue_depth += pending
        rollouts = self.backend.generate(request.request_id, prompts, params)
        try:
            async for r in rollouts:
                if np.isnan(r.logprobs).any() or np.isnan(r.head_logprobs).any():
                    what = f"engine returned NaN log-probs (request {request.request_id!r}, slot "
                    what += f"{r.slot_id})"
                    log.error("%s; answering INTERNAL", what)
                    await context.abort(grpc.StatusCode.INTERNAL, f"{what}; rollout withheld")
                self.counters["tokens_generated"] += len(r.response_ids)
                self.queue_depth -= 1
                pending -= 1
                yield r.to_proto()
        finally:  # also on client disconnect: stop the engine work for this request now
            self.queue_depth -= pending
            await rollouts.aclose()

    # -- weights ----------------------------------------------------------------------------
    async def _swap(self, path: pathlib.Path, version: int, owned: bool, load=None) -> None:
        """Serve `path` (or its finished `load`) as `version`; on failure restore the previous
        weights and raise PushError(INTERNAL)."""
        old_dir, old_version = self._current_dir, self.backend.version
        try:
            if load is not None:
                await self.backend.apply_load(load, version)
            else:
                await self.backend.apply_weights(str(path), version)
        except Exception as e:
            log.exception("applying weights v%s failed; restoring v%s", version, old_version)
            try:
                await self.backend.apply_weights(str(old_dir), old_version)
            except Exception:
                log.exception("restoring the previous weights failed too")
            raise PushError(
                grpc.StatusCode.INTERNAL,
                f"backend failed to apply version {version}: {e!r}; previous weights restored",
            ) from e
        if self._owned_dir is not None:
            self.drop_staged(self._owned_dir)
        self._current_dir = path
        self._owned_dir = path if owned else None

    def drop_staged(self, d: pathlib.Path) -> None:
        """A staged directory no longer served: back to the warm buffers, else deleted."""
        if self.warm_staging is None or not self.warm_staging.give_back(d):
            shutil.rmtree(d, ignore_errors=True)

    async def _swap_adapter(self, path: pathlib.Path, version: int, meta) -> None:
        """Serve base + the staged adapter as `version` (atomically), deleting the previous one."""
        try:
            await self.backend.apply_adapter(str(path), version, meta)
        except Exception as e:
            log.exception(
                "applying adapter v%s failed; v%s keeps serving", version, self.backend.version
            )
            raise PushError(
                grpc.StatusCode.INTERNAL,
                f"backend failed to apply adapter version {version}: {e!r}; the current weights "
                f"keep serving",
            ) from e
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
        self._adapter_dir = path

    async def _reject(self, context, e: PushError):
        self.counters["rejected_pushes"] += 1
        log.warning("weight push rejected: %s", e.message)
        await context.abort(e.code, e.message)

    def _result(self, message: str, t0: float, nbytes: int = 0, relayed=()) -> pb.PushResult:
        """The answer to an accepted push (part) or load."""
        seconds = time.perf_counter() - t0
        v = self.backend.version
        return pb.PushResult(
            ok=True, version=v, message=message, bytes=nbytes, seconds=seconds, relayed=relayed
        )

    async def PushWeights(self, request_iterator, context):
        await self._auth(context)
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.push_max_s
        it = request_iterator.__aiter__()
        # the lock is taken once a header arrived: a silent or junk stream never blocks others
        try:
            first = await push_session.next_message(it, deadline, self.cfg, "the header")
            if not isinstance(first, pb.WeightMessage) or first.WhichOneof("kind") != "header":
                raise PushError.invalid("a push must start with a WeightHeader message")
            try:
                await asyncio.wait_for(
                    self._push_lock.acquire(), max(deadline - loop.time(), 0.001)
                )
            except TimeoutError:
                raise PushError(
                    grpc.StatusCode.ABORTED,
                    f"another push held the push lock for the whole {self.cfg.push_max_s:g}s "
                    "push duration",
                ) from None
        except PushError as e:
            await self._reject(context, e)
        try:
            h = first.header
            if h.push_parts or h.group_commit:  # a part / the commit of a sliced push
                return await self._push_sliced(h, it, deadline, context, t0)
            return await self._push_whole(h, it, deadline, context, t0)
        finally:
            self._push_lock.release()

    def _stager(self, header) -> WeightStager:
        """The stager of a whole push, of an adapter push (`header.kind`) or of a push group."""
        b, cfg, memory = self.backend, self.cfg, self.cfg.push_staging == "memory"
        if header.kind and not header.push_parts:  # a LoRA adapter push: applied at commit
            return adapter_push.AdapterStager(
                b.expected_tensors(), b.version, cfg.staging_root, check_base=b.adapter_base,
                reserve_bytes=cfg.staging_reserve_bytes, memory=memory,
            )  # fmt: skip
        cls = sliced_push.SlicedStager if header.push_parts else WeightStager
        return cls(
            b.expected_tensors(), b.version, cfg.staging_root,
            reserve_bytes=cfg.staging_reserve_bytes, memory=memory,
            load=b.begin_load() if memory else None,
            warm=self.warm_staging if cls is WeightStager else None,
        )  # fmt: skip

    async def _receive(self, stager, header, it, deadline: float, context, relay_timeout: float):
        """`push_session.receive` of one push (part) into `stager`, relayed after its header."""
        after_header = None
        if header.relay_to:
            memory = self.cfg.push_staging == "memory"
            relay.check_relay(header, memory, self.cfg.tls_cert is not None)

            def start_relay() -> None:
                if stager.relay is None:
                    token = relay.bearer_token(context.invocation_metadata())
                    fwd = relay.RelayForward(
                        header, stager.verified_tensor, token, timeout=relay_timeout
                    )
                    stager.start_relay(fwd)

            after_header = start_relay
        sliced = isinstance(stager, sliced_push.SlicedStager)
        return await push_session.receive(
            stager, header, it, deadline, self.cfg, self._io_pool, self.data_listener,
            after_header=after_header, on_commit=stager.end_part if sliced else None,
        )  # fmt: skip

    async def _push_whole(self, header, it, deadline: float, context, t0: float):
        self._group.drop("superseded by a full push")
        stager = self._stager(header)
        loop = asyncio.get_running_loop()
        applied = False
        error: PushError | None = None
        relayed: asyncio.Future | None = None

        async def swap(path: pathlib.Path, version: int) -> None:
            nonlocal applied
            if isinstance(stager, adapter_push.AdapterStager):
                await self._swap_adapter(path, version, stager.meta)
            else:
                await self._swap(path, version, owned=True, load=stager.load)
            applied = True

        try:
            timeout = max(deadline - loop.time(), 1.0)
            path = await self._receive(stager, header, it, deadline, context, timeout)
            assert stager.version is not None and path is not None
            if stager.relay is not None:  # verified here: the children commit while this swaps
                relayed = loop.run_in_executor(None, stager.relay.finish, True)
            await _shielded(swap(path, stager.version))
        except PushError as e:
            error = e
        finally:
            if stager.relay is not None and relayed is None:  # failed here: cut the onward pushes
                relayed = loop.run_in_executor(None, stager.relay.finish, False)
            if not applied:
                stager.discard()
                if error is None:  # cancelled / disconnected mid-push
                    self.counters["rejected_pushes"] += 1
                    log.warning("client disconnected before Commit; push discarded")
        outcomes = await relayed if relayed is not None else []
        if error is not None:
            await self._reject(context, error)
        self.counters["pushes"] += 1
        message = f"version {stager.version} applied"
        return self._result(message, t0, stager.bytes_received, outcomes)

    async def _push_sliced(self, header, it, deadline: float, context, t0: float):
        """One part of a sliced push (staged into the pending group), or the group's commit
        (`sliced_push`). Any failure discards the group (and cuts its relay)."""
        group = header.push_group
        try:
            if header.group_commit:
                return await self._commit_group(header, it, deadline, t0)
            new = lambda: cast(sliced_push.SlicedStager, self._stager(header))  # noqa: E731
            stager = self._group.stager_for(header, new)
            before = stager.bytes_received
            await self._receive(stager, header, it, deadline, context, self.cfg.push_max_s)
            message = f"part {header.push_part} of push group {group!r} staged"
            return self._result(message, t0, stager.bytes_received - before)
        except PushError as e:
            self._group.fail(group, e.message)
            await self._reject(context, e)
        except BaseException:  # disconnected / cancelled mid-part
            self._group.fail(group, "a part's stream ended before its Commit")
            raise

    async def _commit_group(self, header, it, deadline: float, t0: float) -> pb.PushResult:
        msg = await push_session.next_message(it, deadline, self.cfg, "Commit")
        if not isinstance(msg, pb.WeightMessage) or msg.WhichOneof("kind") != "commit":
            raise PushError.invalid("a group commit is a header then Commit")
        stager = self._group.take(header, self.backend.version)
        loop = asyncio.get_running_loop()
        try:
            path = await loop.run_in_executor(self._io_pool, stager.apply)
            assert stager.version is not None
            swap = self._swap(path, stager.version, owned=True, load=stager.load)
        except BaseException:
            stager.discard()  # also cuts its relay
            raise
        forward = stager.take_relay()  # verified here: the children commit meanwhile
        if forward is not None:
            relayed = loop.run_in_executor(None, forward.finish, True)
        try:
            await _shielded(swap)
        except PushError:  # not applied (previous weights restored)
            stager.discard()
            raise
        outcomes = await relayed if forward is not None else []
        self.counters["pushes"] += 1
        message = f"version {stager.version} applied from {stager.parts} parts"
        return self._result(message, t0, stager.bytes_received, outcomes)

    async def LoadWeights(self, request, context):
        await self._auth(context)
        t0 = time.perf_counter()
        async with self._push_lock:
            try:
                serving = [self._current_dir] + ([self._owned_dir] if self._owned_dir else [])
                path = check_load_path(request.path, self.cfg.load_root, serving)
                if request.version <= self.backend.version:
                    raise PushError.precondition(
                        f"stale version {request.version}: server already serves version "
                        f"{self.backend.version}"
                    )
                expected = self.backend.expected_tensors()
                await asyncio.get_running_loop().run_in_executor(
                    self._io_pool, check_load_files, path, expected
                )
                await self._swap(path, int(request.version), owned=False)
            except PushError as e:
                await self._reject(context, e)
            self.counters["pushes"] += 1
            return self._result(f"loaded {path}", t0)

    async def Info(self, request, context):
        await self._auth(context)
        b = self.backend
        return pb.InfoResponse(
            model_config_json=json.dumps(b.model_config),
            version=b.version,
            backend=b.name,
            queue_depth=max(self.queue_depth, 0),
            **self.counters,  # tokens_generated, requests, pushes, rejected_pushes
            **b.limits(),  # vocab_size, max_model_len, max_n, max_head_k
            backend_config_json=b.cfg.to_json(),
            data_port=self.data_listener.port if self.data_listener is not None else 0,
        )


async def _shielded(swap) -> None:
    """Run `swap` to its end even if the client goes away (CancelledError raised afterwards)."""
    task = asyncio.ensure_future(swap)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
