"""The chain task's held-out split, disjoint from the training rows by construction (the prompt
space is small: another seed alone repeats training prompts); the overlap is counted again after
the split (``heldout_split.json``: the report's ``heldout_overlap``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dlc_jax.data.chain_arith import ChainArithConfig, chain_example

SPLIT_FILE = "heldout_split.json"


def training_prompts(path: str | Path) -> set[str]:
    """The ``prompt`` of every row of a training JSONL file."""
    lines = Path(path).read_text().splitlines()
    return {json.loads(line)["prompt"] for line in lines if line.strip()}


def disjoint_heldout(
    task: ChainArithConfig, seed: int, n: int, train: set[str], *, max_draws: int = 100
) -> tuple[list[dict], int]:
    """The first ``n`` examples of the held-out stream (``seed``) whose prompt is not in
    ``train``, and how many were skipped; raises when ``max_draws * n`` candidates do not hold
    ``n``."""
    big = dataclasses.replace(task, num_examples=max_draws * n)
    out: list[dict] = []
    for i in range(big.num_examples):
        ex = chain_example(big, seed, i)
        if ex["prompt"] not in train:
            out.append(ex)
            if len(out) == n:
                return out, i + 1 - n  # the draws skipped
    raise ValueError(
        f"held-out split: only {len(out)} of {n} prompts outside the training rows in "
        f"{big.num_examples} draws"
    )


def overlap(heldout: list[dict], train: set[str]) -> int:
    """How many held-out rows have a training prompt."""
    return sum(1 for r in heldout if r["prompt"] in train)


def write_split(path: str | Path, rows: list[dict], exp_dir: str | Path, train: set[str]) -> None:
    """Write the held-out JSONL and, in the experiment directory, its counted overlap."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = {"prompts": len(rows), "overlap": overlap(rows, train), "disjoint": True}
    Path(exp_dir, SPLIT_FILE).write_text(json.dumps(record, indent=1) + "\n")


def read_overlap(exp_dir: str | Path) -> int | None:
    """The counted overlap of an experiment's held-out split (None when not recorded)."""
    p = Path(exp_dir, SPLIT_FILE)
    return int(json.loads(p.read_text())["overlap"]) if p.exists() else None
