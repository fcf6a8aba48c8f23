"""How arms look in tables and plots: their order, colour, line style and marker."""

from __future__ import annotations

# Order and style of arms in tables and plots; unknown arms go last in name order.
ARM_ORDER = (
    "onpolicy",
    "naive",
    "tis",
    "mis",
    "score_centering",
    "score_centering_tis",
    "ppo_clip",
    "decoupled_ppo",
    "m2po",
    "vcpo",
    "dlc",
    "dlc_seq",
    "dlc_noresync",
    "frozen",
)
_COLOURS = {
    "naive": "tab:orange",
    "tis": "tab:green",
    "mis": "tab:red",
    "score_centering": "tab:brown",
    "score_centering_tis": "tab:olive",
    "ppo_clip": "tab:pink",
    "decoupled_ppo": "tab:gray",
    "m2po": "tab:cyan",
    "vcpo": "gold",
    "dlc": "tab:blue",
    "dlc_noresync": "tab:purple",
    "dlc_seq": "navy",
    "frozen": "black",
}
LINE_STYLES = (
    ("-", "o"),
    ("--", "s"),
    ("-.", "^"),
    (":", "D"),
    ("-", "v"),
    ("--", "P"),
    ("-.", "X"),
    (":", "*"),
)


def arm_key(arm: str):
    """Sort key: arms in ARM_ORDER first, in that order, then the others by name."""
    return (ARM_ORDER.index(arm), arm) if arm in ARM_ORDER else (len(ARM_ORDER), arm)


def arm_style(arm: str) -> dict:
    """Colour, line style and marker of an arm: every known arm has its own colour, and neighbours
    in ARM_ORDER differ in line style and marker too."""
    if arm == "onpolicy":
        return {"color": "black", "ls": "-", "marker": None, "lw": 2.2}
    i = ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER) + sum(map(ord, arm)) % 8
    ls, mk = LINE_STYLES[i % len(LINE_STYLES)]
    return {"color": _COLOURS.get(arm, "tab:olive"), "ls": ls, "marker": mk, "lw": 1.5}
