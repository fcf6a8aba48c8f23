"""Reward functions: answer extraction, exact_match without wrong-last-number credit, math_verify,
the reward config (fn / weighted fns), gold-answer checks."""

import threading

import pytest

from dlc_jax.data.answers import extract_answer, extract_gold, parse_number
from dlc_jax.data.rewards import (
    EXACT_MATCH,
    MATH_VERIFY,
    RewardConfig,
    exact_match,
    exact_match_reward,
    math_verify,
    resolve_fn,
)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so the total is #### 1,234", "1234"),
        ("first 3 then #### 42\nlater 7", "42"),
        ("we get \\boxed{17} and 3", "17"),
        ("\\boxed{1} then \\boxed{-5.0}", "-5"),
        ("numbers 3, 4 and finally 12.50.", "12.5"),
        ("no digits here", None),
        ("29", "29"),
        ("it costs $72.", "72"),
        ("\\boxed{\\frac{3}{2}}", "1.5"),
        ("\\boxed{\\frac{1}{3}}", "1/3"),
        ("x^2", None),  # the 2 is an exponent, not an answer
        ("3√2", None),
        ("2x", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "completion,gold,em,mv",
    [
        # the wrong-credit cases: 1.0 before, must be 0 for both rewards
        ("so \\boxed{\\frac{3}{2}}", "1/2", 0.0, 0.0),
        ("\\boxed{5\\sqrt{2}}", "3√2", 0.0, 0.0),
        ("\\boxed{x^2}", "2", 0.0, 0.0),
        # the missed cases: math_verify must credit them
        ("\\boxed{0.5}", "1/2", 1.0, 1.0),  # exact fractions: 0.5 == 1/2 for exact_match too
        ("\\boxed{2^{10}}", "1024", 0.0, 1.0),
        # plain right / wrong answers
        ("The answer is 19.", "19", 1.0, 1.0),
        ("so #### 1,234", "1234", 1.0, 1.0),
        ("it is $72", "72", 1.0, 1.0),
        ("\\boxed{3\\sqrt{2}}", "3√2", 1.0, 1.0),
        ("The answer is 18.", "19", 0.0, 0.0),
        ("", "19", 0.0, 0.0),
    ],
)
def test_exact_match_and_math_verify(completion, gold, em, mv):
    assert exact_match(["p"], [completion], [gold]) == [em]
    assert math_verify(["p"], [completion], [gold]) == [mv]


def test_batch_signature_options_and_scalar_helper():
    out = exact_match(
        ["a", "b", "c"], ["19", "it is 19", "20"], ["19"] * 3, format_bonus=0.1, ids=["0", "1", "2"]
    )
    assert out == pytest.approx([1.1, 1.0, 0.1])
    assert exact_match(["a"], ["7"], ["7"], correct=2.0) == [2.0]
    assert (
        exact_match_reward("the answer is 19", "#### 19") == 1.0
    )  # legacy scalar helper (SFT eval)
    assert exact_match_reward("20", "19", RewardConfig(format_bonus=0.1)) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="no number"):
        exact_match_reward("1", "abc")
    with pytest.raises(ValueError):
        exact_match(["a"], ["1", "2"], ["1"])  # lengths must agree


def test_math_verify_off_the_main_thread():
    """math-verify's signal timeouts need the main thread; elsewhere the built-in skips them."""
    out = []
    t = threading.Thread(
        target=lambda: out.append(math_verify(["p"], ["\\boxed{2^{10}}"], ["1024"]))
    )
    t.start()
    t.join(60)
    assert out == [[1.0]]


def test_gold_checks():
    assert exact_match.check_answer("1,234") is None and exact_match.check_answer("-3/4") is None
    assert "not a number" in exact_match.check_answer("abc")
    assert "not a number" in exact_match.check_answer("3√2")
    assert math_verify.check_answer("3\\sqrt{2}") is None
    assert math_verify.check_answer("") is not None


def test_gold_formats_and_numbers():
    assert extract_gold("Natalia sold 48/2 = 24 clips.\n#### 72", "gsm8k") == "72"
    assert extract_gold("so $\\boxed{\\frac{1}{2}}$.", "boxed") == "\\frac{1}{2}"
    assert extract_gold("  42 ", "raw") == "42"
    with pytest.raises(ValueError, match="no '####'"):
        extract_gold("no marker 72", "gsm8k")
    assert parse_number("\\frac{1}{2}") == parse_number("0.5") == parse_number("1/2")
    assert (
        parse_number("1,234") == 1234
        and parse_number("3, 4") is None
        and parse_number("50\\%") == 50
    )


def test_reward_config_specs_and_errors():
    cfg = RewardConfig()
    (s,) = cfg.specs()
    assert s.fn == EXACT_MATCH and s.name == "exact_match" and s.kwargs["correct"] == 1.0
    cfg = RewardConfig(fns={"acc": {"fn": MATH_VERIFY, "weight": 1.0}, "fmt": "my.mod:fmt_reward"})
    assert [(s.name, s.fn, s.weight) for s in cfg.specs()] == [
        ("acc", MATH_VERIFY, 1.0),
        ("fmt", "my.mod:fmt_reward", 1.0),
    ]
    for bad, msg in [
        ({"a": {"fn": "nocolon"}}, "reward.fns.a.fn"),
        ({"a": {"fn": "m:f", "w": 1}}, "unknown keys"),
        ({"a": {"fn": "m:f", "weight": "x"}}, "reward.fns.a.weight"),
        ({"errors": "m:f"}, "reserved"),
    ]:
        with pytest.raises(ValueError, match=msg):
            RewardConfig(fns=bad)
    with pytest.raises(ValueError, match="reward.fn"):
        RewardConfig(fn="not a path")
    assert resolve_fn(MATH_VERIFY) is math_verify
    with pytest.raises(ValueError, match="cannot import reward module 'no_such_mod_xyz'"):
        resolve_fn("no_such_mod_xyz:f")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        resolve_fn("dlc_jax.data.rewards:nope")
