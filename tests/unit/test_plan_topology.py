"""dlc-jax plan: slice names -> libtpu topology arguments, and the chip table (no compilation)."""

import pytest

from dlc_jax.plan.chips import CHIPS
from dlc_jax.plan.topology import parse_topology, slice_shape


@pytest.mark.parametrize(
    "name, chips, topology, hosts_bounds",
    [
        ("v4-8", 4, "v4:2x2x1", (2, 2, 1)),
        ("v5p-16", 8, "v5p:2x2x2", (2, 2, 1)),
        ("v5p-64", 32, "v5p:2x4x4", (2, 2, 1)),
        ("v5litepod-4", 4, "v5e:2x2", (2, 2, 1)),
        ("v5e-8", 8, "v5e:2x4", (2, 4, 1)),
        ("v5litepod-16", 16, "v5e:4x4", (2, 2, 1)),
        ("v6e-256", 256, "v6e:16x16", (2, 2, 1)),
        ("v5p:2x2x2", 8, "v5p:2x2x2", (2, 2, 1)),
    ],
)
def test_gcp_types_and_topology_strings(name, chips, topology, hosts_bounds):
    t = parse_topology(name)
    assert (t.chips, t.topology_name, t.chips_per_host_bounds) == (chips, topology, hosts_bounds)
    assert parse_topology(t.accelerator_type).shape == t.shape  # the GCP name round-trips


def test_slices_and_shapes():
    t = parse_topology("v5p-16", num_slices=2)
    assert t.chips == 16 and t.desc_kwargs()["num_slices"] == 2 and t.name.startswith("2 x v5p-16")
    assert [slice_shape(n, 3) for n in (4, 8, 16, 32, 64, 128)] == [
        (2, 2, 1),
        (2, 2, 2),
        (2, 2, 4),
        (2, 4, 4),
        (4, 4, 4),
        (4, 4, 8),
    ]
    assert [slice_shape(n, 2) for n in (1, 4, 8, 16, 32)] == [
        (1, 1),
        (2, 2),
        (2, 4),
        (4, 4),
        (4, 8),
    ]


@pytest.mark.parametrize("bad", ["v5p-15", "v5p-12", "tpu-8", "v5e:2x2x2", "v5p:2x2"])
def test_bad_names_say_what_is_expected(bad):
    with pytest.raises(ValueError, match=bad.split(":")[0]):
        parse_topology(bad)


def test_chip_table_names_sources_and_usable_below_published():
    for spec in CHIPS.values():
        assert spec.source.startswith("https://cloud.google.com/tpu/docs/")
        assert 0 < spec.hbm_usable_bytes <= spec.hbm_published_bytes * 1.01
        assert spec.peak_bf16_flops > 1e14
