"""The loss config imports without JAX (checked in a fresh interpreter: a subprocess)."""


def test_loss_config_imports_without_jax():
    """Config parsing/validation uses dlc_jax.rl.loss_config alone: it must not pull in JAX."""
    import subprocess
    import sys

    code = (
        "import sys; from dlc_jax.rl import LossConfig, LOSS_SPECS; "
        "from dlc_jax.rl.loss_config import loss_spec; "
        "assert LossConfig().spec is loss_spec('dlc') is LOSS_SPECS['dlc']; "
        "assert 'jax' not in sys.modules, 'jax imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
