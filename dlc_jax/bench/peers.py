"""Peer Qwen3 implementations for the trainer benchmark: ``transformers`` (PyTorch fp32, loaded with
our weights) and ``google-tunix``'s NNX Qwen3 (random weights), which is not a dependency:
`prepare_tunix` installs it into a side folder, never into the main environment.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

# What tunix's import chain (tunix/__init__ -> sft/metrics, generate/mappings) needs beyond our
# environment; installed --no-deps into the side folder.
TUNIX_SIDE_PACKAGES = (
    "google-tunix",
    "google-metrax",
    "qwix",
    "jaxtyping",
    "wadler_lindig",
    "omegaconf",
    "antlr4-python3-runtime",
    "clu",
    "wrapt",
    "perfetto",
    "pandas",
)


def torch_qwen3(cfg, our_model):
    """A ``transformers`` Qwen3ForCausalLM (fp32, train mode) of ``cfg``'s dims with the weights of
    ``our_model`` (our NNX Qwen3), on all CPUs' threads (as XLA)."""
    import numpy as np
    import torch
    import transformers

    from dlc_jax.model import iter_hf_tensors

    torch.set_num_threads(os.cpu_count() or 1)
    hf, drop = cfg.to_hf_dict(), ("architectures", "model_type", "dtype")
    hf_cfg = transformers.Qwen3Config(**{k: v for k, v in hf.items() if k not in drop})
    hf_cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(hf_cfg).to(torch.float32)
    sd = {n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in iter_hf_tensors(our_model)}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(
            f"copying our weights into transformers: missing {missing}, unexpected {unexpected}"
        )
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model.train()
    return model


def torch_loss_and_grad_fn(model, input_ids, targets):
    """Closure: mean NLL of ``targets`` given ``input_ids`` [B,T], backward -> the loss."""
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    tgt = torch.as_tensor(targets, dtype=torch.long)

    def step():
        for p in model.parameters():
            p.grad = None
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1)
        )
        loss.backward()
        return float(loss.detach())

    return step


def _last_line(r: subprocess.CompletedProcess) -> str:
    tail = (r.stderr or r.stdout).strip().splitlines()
    return tail[-1] if tail else f"exit {r.returncode}"


def side_env(site: str, *, first: bool = False) -> dict:
    """This process's environment with the folder ``site`` on ``PYTHONPATH``, after ours (a side
    folder adds, never shadows) or, ``first``, ahead of it."""
    path = [os.environ.get("PYTHONPATH", "")]
    path = [site, *path] if first else [*path, site]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def import_error(modules: str, env: dict, timeout_s: float = 600.0) -> str:
    """'' when ``import modules`` works in a fresh process with ``env``, else why not (one line)."""
    probe = [sys.executable, "-c", f"import {modules}"]
    try:
        r = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"importing {modules} timed out after {timeout_s}s"
    return "" if r.returncode == 0 else _last_line(r)


def prepare_tunix(target_dir, timeout_s: float = 300.0) -> tuple[bool, str]:
    """Make ``tunix.models.qwen3.model`` importable from ``target_dir`` (appended to ``sys.path``),
    pip-installing ``TUNIX_SIDE_PACKAGES`` there if needed -> (ok, message)."""
    side = str(Path(target_dir) / "pkgs")
    env = side_env(side, first=True)
    why = import_error("tunix.models.qwen3.model", env, timeout_s)
    if why:
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", side]
        try:
            r = subprocess.run(
                [*pip, *TUNIX_SIDE_PACKAGES], capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return False, f"pip install of google-tunix timed out after {timeout_s}s"
        if r.returncode != 0:
            return False, f"pip install google-tunix failed: {_last_line(r)}"
        why = import_error("tunix.models.qwen3.model", env, timeout_s)
    if why:
        return False, f"tunix does not import: {why}"
    if side not in sys.path:
        sys.path.append(side)  # appended: our environment's packages keep priority
    importlib.invalidate_caches()
    try:
        mod = importlib.import_module("tunix.models.qwen3.model")
    except Exception as e:  # noqa: BLE001 - report any import failure as the reason
        return False, f"tunix does not import in-process: {type(e).__name__}: {e}"
    try:
        version = importlib.metadata.version("google-tunix")
    except Exception:  # noqa: BLE001
        version = "?"
    return True, f"google-tunix {version} from {mod.__file__}"


def tunix_qwen3(cfg, *, seed: int = 0):
    """tunix's Qwen3 of ``cfg``'s dims, fp32, random weights."""
    import tunix.models.qwen3.model as tq
    from flax import nnx

    tcfg = tq.ModelConfig(
        num_layers=cfg.num_hidden_layers,
        vocab_size=cfg.vocab_size,
        embed_dim=cfg.hidden_size,
        hidden_dim=cfg.intermediate_size,
        num_heads=cfg.num_attention_heads,
        head_dim=cfg.head_dim,
        num_kv_heads=cfg.num_key_value_heads,
        rope_theta=int(cfg.rope_theta),
        norm_eps=cfg.rms_norm_eps,
        use_tied_embedding=cfg.tie_word_embeddings,
    )
    return tq.Qwen3(tcfg, rngs=nnx.Rngs(seed))


def tunix_loss_and_grad_fn(model, input_ids, targets):
    """Jitted closure: mean NLL of ``targets`` under tunix's full-logits forward + grad."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    ids = jnp.asarray(input_ids, jnp.int32)
    tgt = jnp.asarray(targets, jnp.int32)
    b, t = ids.shape
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))

    def loss_fn(p):
        m = nnx.merge(graphdef, p, rest)
        logits, _ = m(ids, pos, None, mask)
        lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(lp, tgt[..., None], axis=-1))

    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    return lambda: grad_fn(params)
