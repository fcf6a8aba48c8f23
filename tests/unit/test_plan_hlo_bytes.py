"""plan.hlo_bytes: HBM bytes of an optimized HLO module with each while body weighted by its trip
count (the roofline's HBM term; XLA's cost analysis counts a body once)."""

import jax
import jax.numpy as jnp

from dlc_jax.plan.hlo_bytes import loop_weighted_bytes, parse_module

# f32[1024] = 4 KiB; a loop of 128 iterations whose body reads a 4 KiB slice of a 512 KiB stack
# and adds it into a 4 KiB carry; the condition's bound is its only trip count (as on TPU)
HLO = """HloModule m

%body (p: (s32[], f32[1024], f32[128,1024])) -> (s32[], f32[1024], f32[128,1024]) {
  %p = (s32[], f32[1024]{0}, f32[128,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %acc = f32[1024]{0} get-tuple-element(%p), index=1
  %xs = f32[128,1024]{1,0} get-tuple-element(%p), index=2
  %zero = s32[] constant(0)
  %row = f32[1,1024]{1,0} dynamic-slice(%xs, %i, %zero), dynamic_slice_sizes={1,1024}
  %flat = f32[1024]{0} bitcast(%row)
  %sum = f32[1024]{0} add(%acc, %flat)
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[1024]{0}, f32[128,1024]{1,0}) tuple(%next, %sum, %xs)
}

%cond (p: (s32[], f32[1024], f32[128,1024])) -> pred[] {
  %p = (s32[], f32[1024]{0}, f32[128,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(128)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[1024], xs: f32[128,1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %xs = f32[128,1024]{1,0} parameter(1)
  %c = s32[] constant(0)
  %init = (s32[], f32[1024]{0}, f32[128,1024]{1,0}) tuple(%c, %a, %xs)
  %w = (s32[], f32[1024]{0}, f32[128,1024]{1,0}) while(%init), condition=%cond, body=%body
  %out = f32[1024]{0} get-tuple-element(%w), index=1
  ROOT %neg = f32[1024]{0} negate(%out)
}
"""


def test_hand_written_loop():
    comps, entry = parse_module(HLO)
    assert entry == "main" and set(comps) == {"body", "cond", "main"}
    got = loop_weighted_bytes(HLO)
    # body: the slice (read 4 KiB, written 4 KiB), the add (two 4 KiB reads, one write), the
    # counter (12 B); the entry: the negate (4 KiB in, 4 KiB out)
    body = 2 * 4096 + 3 * 4096 + 12
    assert got["once"] == body + 2 * 4096
    assert got["weighted"] == 128 * body + 2 * 4096


def test_compiled_scan_weighs_its_body_by_the_trip_count():
    """A CPU compile of a 64-step scan: the walk's 'once' is XLA's own count to 15%, and the
    weighted bytes are close to 64x the body's."""

    def f(xs):
        return jax.lax.scan(lambda c, x: (jnp.tanh(c * x + 1.0), None), xs[0], xs)[0]

    compiled = jax.jit(f).lower(jax.ShapeDtypeStruct((64, 256, 256), jnp.float32)).compile()
    got = loop_weighted_bytes(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    assert abs(got["once"] / cost["bytes accessed"] - 1) < 0.15, (got, cost["bytes accessed"])
    assert 30 < got["weighted"] / got["once"] <= 64, got


# a fusion threading a 512 KiB buffer through in place (as the async collective fusions of the
# collective matmul loops do: output_to_operand_aliasing) beside a 4 KiB elementwise result
ALIASED = """HloModule m

%fused (param_0: f32[1024], param_1: f32[128,1024]) -> (f32[1024], f32[128,1024]) {
  %param_0 = f32[1024]{0} parameter(0)
  %param_1 = f32[128,1024]{1,0} parameter(1)
  %neg = f32[1024]{0} negate(%param_0)
  ROOT %t = (f32[1024]{0}, f32[128,1024]{1,0}) tuple(%neg, %param_1)
}

ENTRY %main (a: f32[1024], buf: f32[128,1024]) -> (f32[1024], f32[128,1024]) {
  %a = f32[1024]{0} parameter(0)
  %buf = f32[128,1024]{1,0} parameter(1)
  ROOT %f = (f32[1024]{0}, f32[128,1024]{1,0}) fusion(%a, %buf), kind=kOutput, output_to_operand_aliasing={{1}: (1, {})}, calls=%fused
}
"""  # noqa: E501 (an HLO instruction is one line)


def test_a_buffer_aliased_through_a_fusion_is_neither_read_nor_written():
    # the negate's 4 KiB in and 4 KiB out; the aliased 512 KiB buffer not at all (2 x 512 KiB +
    # 8 KiB without the rule)
    assert loop_weighted_bytes(ALIASED)["once"] == 2 * 4096
    plain = ALIASED.replace(", output_to_operand_aliasing={{1}: (1, {})}", "")
    assert loop_weighted_bytes(plain)["once"] == 2 * 4096 + 2 * 128 * 4096
