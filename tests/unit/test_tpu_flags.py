"""dlc_jax.tpu_flags: the one set of TPU compiler flags that `dlc-jax plan`, `dlc-jax train` and
the pod launcher set, and how a config's plan.libtpu_flags and the environment combine with it."""

import pytest

from dlc_jax import tpu_flags
from dlc_jax.trainer.config import ConfigError, load_config

WINDOWED = "--xla_tpu_enable_windowed_einsum_for_all_gather"


def test_defaults_override_the_environment_and_config_flags_override_both():
    env = {"LIBTPU_INIT_ARGS": f"--xla_user_only=1 {WINDOWED}=true"}
    got = tpu_flags.merged("", env)
    assert f"{WINDOWED}=false" in got and f"{WINDOWED}=true" not in got
    assert "--xla_user_only=1" in got  # a flag the set does not name is kept
    assert all(f in got.split() for f in tpu_flags.DEFAULT_FLAGS)
    mine = tpu_flags.merged(f"{WINDOWED}=true --xla_extra=2", env)
    assert f"{WINDOWED}=true" in mine and "--xla_extra=2" in mine
    assert f"{WINDOWED}=false" not in mine
    # apply() sets the variable and returns it
    assert tpu_flags.apply("", env) == env["LIBTPU_INIT_ARGS"] == got
    # a cached compile is stale when its recorded flags miss or change a default
    assert not tpu_flags.lacks_defaults(got) and not tpu_flags.lacks_defaults(f"--x=1 {got}")
    assert tpu_flags.lacks_defaults(mine)
    assert tpu_flags.lacks_defaults(" ".join(tpu_flags.DEFAULT_FLAGS[1:]))


def test_bad_flag_text_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ValueError, match="expected --name=value"):
        tpu_flags.parse("xla_no_dashes=1")
    with pytest.raises(ConfigError) as e:
        load_config("tiny_cpu", ["plan.libtpu_flags=oops"])
    assert "plan" in str(e.value) and "\n" not in str(e.value)
    assert load_config("tiny_cpu", [f"plan.libtpu_flags={WINDOWED}=false"]).plan.libtpu_flags
