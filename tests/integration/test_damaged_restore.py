"""Damaged checkpoints read by a fresh `dlc-jax` process (issue 33 item 2): export and train
resume end with exit 2 and one error line every time, no traceback, nothing exported. The
checkpoints are made once per module; each repeat is one CLI start (~2-8 CPU-s), so CI runs the
five damage patterns twice for export and once for resume; `dlc-jax bench soak --parts damaged`
runs 10 of each."""

import pytest

from dlc_jax.bench.soak.damaged_restore import PATTERNS, export_args, repeat
from dlc_jax.bench.soak.trainer_harness import run_dlc

pytestmark = pytest.mark.slow

TRAIN = [
    "sft.enabled=false",
    "sampler.backend=inprocess",
    "sampler.n=2",
    "sampler.max_tokens=2",
    "sampler.head_k=2",
    "sampler.max_model_len=64",
    "train.batch_prompts=2",
    "log.progress=false",
    "log.tensorboard=false",
    "checkpoint.every=1",
]


def train_args(model, run, steps=1):
    """``dlc-jax train`` of a run in ``run`` (``steps`` > the checkpoint's: a resume reads the
    arrays, not only the metadata of a finished run)."""
    return lambda ckpt: [
        "train",
        f"model.path={model}",
        *TRAIN,
        f"train.steps={steps}",
        f"log.dir={run}/logs",
        f"checkpoint.dir={ckpt}",
    ]


@pytest.fixture(scope="module")
def good_run(tiny_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("good_run")
    o = run_dlc(train_args(tiny_dir, run)(run / "ckpt"), 900)
    assert o.rc == 0, o.err[-3000:]
    return run / "ckpt"


def test_export_of_a_damaged_checkpoint_fails_in_one_line_every_time(good_run, tmp_path):
    runs = repeat(good_run, tmp_path, export_args(tmp_path / "out"), 2 * len(PATTERNS), 300)
    assert [r["verdict"] for r in runs] == [None] * len(runs), runs
    assert not any(r["written"] for r in runs)


def test_resume_from_a_damaged_checkpoint_fails_in_one_line(tiny_dir, good_run, tmp_path):
    runs = repeat(good_run, tmp_path, train_args(tiny_dir, tmp_path, 2), len(PATTERNS), 600)
    assert [r["verdict"] for r in runs] == [None] * len(runs), runs
    assert all("no good checkpoint" in r["stderr"] for r in runs), runs
