"""A non-editable install ships the configs: build a wheel, install it into a fresh venv, and run
``dlc-jax train --print-config`` from outside the repository (the embedded default comes from the
installed package, not from a checkout)."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_wheel_install_runs_print_config_from_the_package(tmp_path):
    # build from a copy of the sources (no build/ or egg-info written into the shared checkout)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "dlc_jax", src / "dlc_jax", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    wheels = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(src),
        ]
    )
    (wheel,) = wheels.glob("dlc_jax-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "dlc_jax/configs/tiny_cpu.yaml",
        "dlc_jax/configs/qwen3_0p6b_gsm8k.yaml",
        "dlc_jax/sampler/wire/sampler.proto",
    } <= names

    # a fresh venv: the package only from the wheel; its dependencies visible through a plain path
    # entry to this environment's site-packages (no .pth processing there, so the editable
    # install of the checkout is not picked up)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(
        _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)]
    )

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(
        [str(py), "-c", "import dlc_jax; print(dlc_jax.__file__)"], cwd=elsewhere, env=env
    ).strip()
    assert Path(where).is_relative_to(venv), where
    out = _run([str(venv / "bin" / "dlc-jax"), "train", "--print-config"], cwd=elsewhere, env=env)
    cfg = yaml.safe_load(out)
    shipped = yaml.safe_load((REPO / "dlc_jax" / "configs" / "tiny_cpu.yaml").read_text())
    assert cfg["model"]["preset"] == "tiny" and cfg["sft"]["enabled"] is True
    assert (
        cfg["train"]["steps"] == shipped["train"]["steps"]
        and cfg["data"]["arithmetic"]["digits"] == 1
    )
    # a shipped recipe by name, from outside a checkout
    out = _run(
        [
            str(venv / "bin" / "dlc-jax"),
            "train",
            "--config",
            "configs/qwen3_0p6b_gsm8k.yaml",
            "--print-config",
        ],
        cwd=elsewhere,
        env=env,
    )
    assert yaml.safe_load(out)["data"]["source"] == "hf:openai/gsm8k"


def test_repo_configs_link_to_the_packaged_ones():
    link = REPO / "configs"
    assert link.is_symlink() and link.resolve() == (REPO / "dlc_jax" / "configs").resolve()
    from dlc_jax.trainer.config import default_config_path, load_config

    assert default_config_path().parent.resolve() == (REPO / "dlc_jax" / "configs").resolve()
    for p in sorted((REPO / "dlc_jax" / "configs").glob("*.yaml")):
        load_config(p)  # every shipped config loads and validates
