"""The pilot's numbers: ESS crossings per statistic from a metrics log, and its table."""

from __future__ import annotations

import pytest

from dlc_jax.experiments.pilot import ess_crossings, pilot_table

pytestmark = pytest.mark.unit


def test_ess_crossings_per_statistic():
    rows = [
        {"step": 1, "ess_lag": 0.99, "ess_lag_seq": 0.9},
        {"step": 2, "ess_lag": 0.98, "ess_lag_seq": 0.45},
        {"step": 3, "ess_lag": 0.4, "ess_lag_seq": 0.6},
        {"step": 4, "ess_lag": None},
    ]
    got = ess_crossings(rows)
    assert got["token"] == {"first_below": 3, "min": 0.4}
    assert got["sequence"] == {"first_below": 2, "min": 0.45}
    assert ess_crossings([{"step": 1}])["token"] == {"first_below": None, "min": None}


def test_pilot_table_row():
    row = {
        "point": "lr1e-4_b32_s40",
        "arm": "dlc_noresync",
        "steps": 40,
        "heldout": {"greedy": [0.406, 0.531], "sampled": [0.25, 0.262]},
        "ess": {
            "token": {"first_below": None, "min": 0.976},
            "sequence": {"first_below": 15, "min": 0.363},
        },
        "cpu_s": 150.2,
        "loadavg": "15.58 8.45 3.56",
    }
    line = pilot_table([row])[2]
    assert line == (
        "| lr1e-4_b32_s40 | dlc_noresync | 40 | 0.406 -> 0.531 | 0.250 -> 0.262 | never (0.976) "
        "| 15 (0.363) | 150 (15.58) |"
    )
