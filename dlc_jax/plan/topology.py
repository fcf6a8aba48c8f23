"""TPU slice names -> ``jax.experimental.topologies.get_topology_desc`` arguments (compile-only
devices, no TPU needed). Accepted: GCP accelerator types (``v5p-16``, ``v5litepod-16``; v4 and v5p
count TensorCores, two per chip) and libtpu topology strings (``v5p:2x2x2``, ``v5e:4x4``)."""

from __future__ import annotations

import dataclasses
import math
import os
import re

from dlc_jax.plan.chips import CHIPS, TYPE_PREFIXES, ChipSpec


@dataclasses.dataclass(frozen=True)
class Topology:
    """One or more identical slices. ``shape``: chips along each torus axis of one slice."""

    chip: ChipSpec
    shape: tuple[int, ...]
    num_slices: int = 1

    @property
    def chips_per_slice(self) -> int:
        return math.prod(self.shape)

    @property
    def chips(self) -> int:
        return self.chips_per_slice * self.num_slices

    @property
    def topology_name(self) -> str:
        return f"{self.chip.libtpu_name}:" + "x".join(map(str, self.shape))

    @property
    def accelerator_type(self) -> str:
        """The GCP accelerator type of one slice (``v5p-16``, ``v5litepod-16``)."""
        n = self.chips_per_slice * (2 if self.chip.cores_in_type_name else 1)
        prefix = {"v5e": "v5litepod"}.get(self.chip.generation, self.chip.generation)
        return f"{prefix}-{n}"

    @property
    def name(self) -> str:
        one = f"{self.accelerator_type} ({self.topology_name})"
        return one if self.num_slices == 1 else f"{self.num_slices} x {one}"

    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int]:
        """Chips per host: 2x2x1 on multi-host slices; a single-host slice is one host."""
        s = tuple(self.shape) + (1,) * (3 - len(self.shape))
        if self.chip.dims == 2 and self.chips_per_slice <= 8:
            return (s[0], s[1], 1)
        if self.chip.dims == 3 and self.chips_per_slice <= 4:
            return (s[0], s[1], s[2])
        return (2, 2, 1)

    def desc_kwargs(self) -> dict:
        return dict(
            platform="tpu",
            topology_name=self.topology_name,
            chip_config_name=self.chip.chip_config,
            chips_per_host_bounds=self.chips_per_host_bounds,
            num_slices=self.num_slices,
        )


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def slice_shape(chips: int, dims: int) -> tuple[int, ...]:
    """Torus shape GCP uses for a slice of ``chips`` chips: 3-D 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4,
    ...; 2-D 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, ..."""
    if not _pow2(chips):
        raise ValueError(f"{chips} chips: only power-of-two slices are supported")
    if chips > MAX_SLICE_CHIPS:
        raise ValueError(f"{chips} chips: more than a pod ({MAX_SLICE_CHIPS})")
    if dims == 2:
        a = 1 << (chips.bit_length() - 1) // 2
        return (a, chips // a)
    if chips < 4:
        raise ValueError(f"{chips} chips: the smallest 3-D slice has 4 chips (2x2x1)")
    s = [2, 2, 1]
    while math.prod(s) < chips:
        i = max(j for j in range(3) if s[j] == min(s))
        s[i] *= 2
    return tuple(s)


_TYPE_RE = re.compile(r"^(v4|v5p|v5litepod|v5e|v6e)-(\d+)$")
_TOPO_RE = re.compile(r"^(v4|v5p|v5e|v6e):(\d+(?:x\d+){1,2})$")


def parse_topology(text: str, num_slices: int = 1) -> Topology:
    """``v5p-16`` / ``v5litepod-16`` / ``v5p:2x2x2`` -> :class:`Topology` (``num_slices`` of it)."""
    t = text.strip().lower()
    if num_slices < 1:
        raise ValueError(f"--slices must be >= 1, got {num_slices}")
    m = _TYPE_RE.match(t)
    if m:
        spec = CHIPS[TYPE_PREFIXES[m.group(1)]]
        n = int(m.group(2))
        if n < 1:
            raise ValueError(f"{text}: a slice has at least one chip")
        if spec.cores_in_type_name:
            if n % 2:
                raise ValueError(
                    f"{text}: {m.group(1)} types count TensorCores (2 per chip); use an even number"
                )
            n //= 2
        try:
            return Topology(spec, slice_shape(n, spec.dims), num_slices)
        except ValueError as e:
            raise ValueError(f"{text}: {e}") from e
    m = _TOPO_RE.match(t)
    if m:
        spec = CHIPS[m.group(1)]
        shape = tuple(int(x) for x in m.group(2).split("x"))
        if len(shape) != spec.dims:
            raise ValueError(f"{text}: {spec.generation} slices have {spec.dims}-D topologies")
        check_shape(text, shape, spec.dims)
        return Topology(spec, shape, num_slices)
    raise ValueError(
        f"{text}: expected a GCP accelerator type (v4-8, v5p-16, v5litepod-16, v6e-8) or a "
        f"topology (v5p:2x2x2, v5e:4x4)"
    )


MAX_SLICE_CHIPS = 16384


def check_shape(text: str, shape: tuple[int, ...], dims: int) -> None:
    """A ValueError naming ``text`` unless ``shape`` is a torus GCP can provision (see messages)."""
    if any(d < 1 for d in shape):
        raise ValueError(f"{text}: every topology dimension must be >= 1")
    if dims == 2 and not all(_pow2(d) and d <= 16 for d in shape):
        raise ValueError(
            f"{text}: 2-D slice dimensions are powers of two up to 16 (1x1, 2x2, 2x4, 4x4, ...)"
        )
    if dims == 3 and not all(d in (1, 2) or d % 4 == 0 for d in shape):
        raise ValueError(
            f"{text}: 3-D slice dimensions are 1, 2 or multiples of 4 (2x2x1, 2x2x2, 2x2x4, "
            "4x4x4, ...)"
        )
    if math.prod(shape) > MAX_SLICE_CHIPS:
        raise ValueError(f"{text}: {math.prod(shape)} chips, more than a pod ({MAX_SLICE_CHIPS})")


def abstract_devices(topo: Topology) -> list:
    """The compile-only TPU devices of ``topo`` (libtpu; no TPU attached)."""
    # libtpu looks for the TPU VM's metadata and warns on stderr without these
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", topo.accelerator_type)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    # libtpu takes /tmp/libtpu_lockfile for a real TPU; compile-only use can share the machine
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    from dlc_jax.plan.libtpu import ensure_libtpu

    ensure_libtpu()
    return list(topologies.get_topology_desc(**topo.desc_kwargs()).devices)
