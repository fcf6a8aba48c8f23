"""HBM bytes of an optimized HLO module with each while loop's body weighted by its trip count
(XLA's ``bytes accessed`` counts a loop body once). Each instruction outside a fused computation
moves its operands and result; slices read only the slice, in-place dynamic-update-slices write
only the update, and a fusion result aliasing an operand (``output_to_operand_aliasing``) counts
neither way. ``once`` / ``weighted``: their ratio scales XLA's figure in the roofline."""

from __future__ import annotations

import math
import re

# version of the walk's rules, recorded in each plan JSON (``hlo_bytes_rules``): 2 = aliased
# fusion buffers count neither as read nor as written (1: counted whole)
RULES = 2
ARRAY_RE = re.compile(r"\b(pred|s8|u8|s16|u16|bf16|f16|s32|u32|f32|s64|u64|f64)\[([\d,]*)\]")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2}
_DTYPE_BYTES.update({"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8})


def shape_bytes(text: str) -> int:
    """Bytes of every array shape written in ``text`` (a tuple's elements summed)."""
    return sum(
        math.prod(int(d) for d in filter(None, dims.split(","))) * _DTYPE_BYTES[dt]
        for dt, dims in ARRAY_RE.findall(text)
    )


_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "iota"}
_FREE.update({"partition-id", "replica-id", "opt-barrier"})


def _balanced(s: str, i: int) -> int:
    """Index just past the bracket group opening at s[i]."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "([{":
            depth += 1
        elif s[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(s)


def _instruction(line: str):
    """(name, shape text, opcode, operand names, attributes text) of one HLO instruction line."""
    m = _NAME.match(line)
    if not m:
        return None
    rest = line[m.end() :]
    end = _balanced(rest, 0) if rest.startswith("(") else rest.find(" ")
    shape, rest = rest[:end], rest[end:].lstrip()
    p = rest.find("(")
    if p < 0:
        return None
    operands = re.findall(r"%([\w.\-]+)", rest[p : _balanced(rest, p)])
    return m.group(1), shape, rest[:p], operands, rest[p:]  # attributes with the operand text


def parse_module(hlo: str) -> tuple[dict, str]:
    """({computation: [instruction tuples]}, entry computation name)."""
    comps: dict[str, list] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        h = _HEADER.match(line)
        if h:
            current = h.group(1)
            comps[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None and (ins := _instruction(line)):
            comps[current].append(ins)
    return comps, entry


_ALIAS = re.compile(r"output_to_operand_aliasing=\{(.*?)\}(?:,\s*\w+=|$)")
_ALIAS_PAIR = re.compile(r"\{(\d*)[^}]*\}:\s*\((\d+),")


def _aliased(shape: str, attrs: str) -> tuple[int, set[int]]:
    """(bytes of the result's elements that alias an operand, those operands' indices): buffers
    threaded through in place, neither re-read nor rewritten whole."""
    m = _ALIAS.search(attrs)
    if not m:
        return 0, set()
    elements = [shape_bytes(f"{dt}[{dims}]") for dt, dims in ARRAY_RE.findall(shape)]
    out, ops = 0, set()
    for element, operand in _ALIAS_PAIR.findall(m.group(1)):
        k = int(element) if element else 0
        out += elements[k] if k < len(elements) else 0
        ops.add(int(operand))
    return out, ops


def _instruction_bytes(ins, shapes: dict, comps: dict) -> int:
    name, shape, op, operands, attrs = ins
    out = shape_bytes(shape)
    ins_bytes = [shape_bytes(shapes.get(o, "")) for o in operands]
    if op in ("dynamic-slice", "slice"):
        return 2 * out
    if op == "dynamic-update-slice" and len(ins_bytes) > 1:
        return 2 * ins_bytes[1]
    if op == "fusion":
        alias_out, alias_ops = _aliased(shape, attrs)
        out -= alias_out
        ins_bytes = [0 if k in alias_ops else b for k, b in enumerate(ins_bytes)]
        called = re.search(r"calls=%?([\w.\-]+)", attrs)
        body = comps.get(called.group(1), []) if called else []
        root = body[-1] if body else None
        if root and root[2] == "dynamic-update-slice":  # in place: the buffer is not re-read
            fshapes = {i[0]: i[1] for i in body}
            upd = shape_bytes(fshapes.get(root[3][1], "")) if len(root[3]) > 1 else out
            # the updated buffer is the largest operand, unless aliasing already took it out
            big = 0 if alias_ops else max(ins_bytes, default=0)
            return 2 * upd + sum(ins_bytes) - big
        # a parameter used only through dynamic slices is read only where sliced
        sliced = _sliced_params(body)
        return out + sum(sliced.get(k, b) for k, b in enumerate(ins_bytes))
    return out + sum(ins_bytes)


def _sliced_params(body: list) -> dict[int, int]:
    """{parameter index: bytes read} of fused parameters used only as dynamic-slice operands."""
    index: dict[str, int] = {}
    uses: dict[str, list] = {}
    read: dict[int, int] = {}
    for name, shape, op, operands, _ in body:
        if op == "parameter":  # fused parameters are named param_<index>[.<id>]
            m = re.match(r"param_(\d+)", name)
            index[name] = int(m.group(1)) if m else -1
        for k, o in enumerate(operands):
            uses.setdefault(o, []).append((op, k, shape))
    for pname, i in index.items():
        us = uses.get(pname, [])
        if us and all(op in ("dynamic-slice", "slice") and k == 0 for op, k, _ in us):
            read[i] = sum(shape_bytes(s) for _, _, s in us)
    return read


def _trip_count(attrs: str, comps: dict) -> int:
    """A while loop's trip count: ``known_trip_count`` when the backend config has it, else the
    bound of its condition (``i < N``: the loops jax emits count from 0 in steps of 1), else 1."""
    n = _TRIP.search(attrs)
    if n:
        return int(n.group(1))
    c = re.search(r"condition=%?([\w.\-]+)", attrs)
    cond = comps.get(c.group(1), []) if c else []
    bounds = [int(m) for i in cond if i[2] == "constant" for m in re.findall(r"^\((-?\d+)\)", i[4])]
    called = [comps.get(m, []) for i in cond for m in re.findall(r"calls=%?([\w.\-]+)", i[4])]
    lt = any(i[2] == "compare" and "direction=LT" in i[4] for c in [cond, *called] for i in c)
    return max(bounds) if bounds and lt and max(bounds) > 0 else 1


def loop_weighted_bytes(hlo: str) -> dict[str, float]:
    """{'once': each loop body once, 'weighted': bodies x trip counts} (0s without an entry)."""
    comps, entry = parse_module(hlo)
    totals = {"once": 0.0, "weighted": 0.0}
    if not entry:
        return totals

    def walk(comp: str, trips: float, depth: int) -> None:
        body = comps.get(comp, [])
        shapes = {i[0]: i[1] for i in body}
        for ins in body:
            _, _, op, _, attrs = ins
            if op == "while":
                loop = re.search(r"body=%?([\w.\-]+)", attrs)
                if loop and depth < 16:
                    walk(loop.group(1), trips * _trip_count(attrs, comps), depth + 1)
                continue
            if op in ("call", "conditional"):
                for c in re.findall(r"(?:to_apply|branch_computations)=\{?([^}\s]+)", attrs):
                    for sub in c.split(","):
                        walk(sub.strip().lstrip("%"), trips, depth + 1)
                continue
            if op in _FREE or op.endswith("-done"):
                continue
            b = _instruction_bytes(ins, shapes, comps)
            totals["once"] += b
            totals["weighted"] += b * trips

    walk(entry, 1.0, 0)
    return totals
