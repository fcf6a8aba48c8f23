"""One error format for every `dlc-jax` command: a bad command line (argparse included) and a bad
input are each one line, ``dlc-jax COMMAND: error: ...``, exit status 2, no traceback."""

from __future__ import annotations

import pytest

from dlc_jax.bench.cli import BENCHMARKS
from dlc_jax.cli import COMMANDS, main


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    return rc, lines, out.err


# per subcommand (and sub-subcommand): an unknown option, a missing required argument
BAD_LINES = [
    *[(cmd, "--no-such-flag") for cmd in COMMANDS if cmd not in ("bench", "sampler")],
    ("make-tiny",),  # OUT_DIR missing
    ("export", "--checkpoint", "x"),  # --out missing
    ("plan",),  # --config missing
    ("experiment",),  # --preset missing
    ("experiment", "--preset", "nope"),
    ("experiment", "--preset", "tiny", "--steps", "0"),
    ("experiment", "--preset", "tiny", "--sweep", "nope"),  # an unknown sweep point
    ("experiment", "--preset", "tiny", "--pilot", "nope"),
    ("train", "--config"),  # no value
    ("sampler",),  # no subcommand
    ("sampler", "serve", "--no-such-flag"),
    ("sampler", "info"),  # --address missing
    ("sampler", "serve", "--backend", "nope", "--model", "m"),
    ("bench", "nope"),
    *[("bench", name, "--no-such-flag") for name in BENCHMARKS],
]


@pytest.mark.parametrize("argv", BAD_LINES, ids=[" ".join(a) for a in BAD_LINES])
def test_bad_command_lines_are_one_line(capsys, argv):
    rc, lines, err = _run(capsys, *argv)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"dlc-jax {argv[0]}: error: "), err
    assert "--help" in lines[0] or argv[:2] in (("bench", "nope"), ("experiment", "--preset"))


def test_every_command_is_covered():
    assert {a[0] for a in BAD_LINES} == set(COMMANDS)


def test_bad_inputs_are_one_line(capsys, tmp_path):
    cases = {
        ("train", "optim.lr=inf"): "optim.lr: expected a finite number",
        ("train", "mesh.data=0"): "mesh.data: must be >= 1 or -1",
        ("plan", "--config", "tiny_cpu", "--topology", "v5p:3x3x3"): "--topology v5p:3x3x3",
        ("plan", "--config", "tiny_cpu", "--topology", "v5p-8", "--efficiency", "2"): "efficiency",
        ("plan", "--config", "tiny_cpu", "--topology", "v5p-8", "sampler.max_model_len=0"): (
            "sampler.max_model_len"
        ),
        ("export", "--checkpoint", str(tmp_path / "none"), "--out", str(tmp_path / "o")): (
            "no checkpoint"
        ),
    }
    for argv, needle in cases.items():
        rc, lines, err = _run(capsys, *argv)
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (argv, err)
        assert lines[0].startswith(f"dlc-jax {argv[0]}: error: ") and needle in lines[0], lines


def test_unknown_command_and_help(capsys):
    rc, lines, _ = _run(capsys, "nope")
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("dlc-jax: error: unknown command")
    with pytest.raises(SystemExit) as e:  # --help still prints the usage and exits 0
        main(["export", "--help"])
    assert e.value.code == 0 and "--overwrite" in capsys.readouterr().out
