"""How arms look in tables and plots: their order, colour, line style and marker."""

from __future__ import annotations

# Each arm's colour, in table and plot order (after the on-policy runs; unknown arms go last).
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
    "dlc_seq": "navy",
    "dlc_noresync": "tab:purple",
    "frozen": "black",
}
ARM_ORDER = ("onpolicy", *_COLOURS)
LINE_STYLES = tuple(zip(("-", "--", "-.", ":") * 2, "os^DvPX*"))  # (line style, marker)


def arm_key(arm: str):
    """Sort key: arms in ARM_ORDER first, in that order, then the others by name."""
    return (ARM_ORDER.index(arm), arm) if arm in ARM_ORDER else (len(ARM_ORDER), arm)


def arm_style(arm: str) -> dict:
    """Colour, line style and marker of an arm (neighbours in ARM_ORDER differ in all three)."""
    if arm == "onpolicy":
        return {"color": "black", "ls": "-", "marker": None, "lw": 2.2}
    i = ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER) + sum(map(ord, arm)) % 8
    ls, mk = LINE_STYLES[i % len(LINE_STYLES)]
    return {"color": _COLOURS.get(arm, "tab:olive"), "ls": ls, "marker": mk, "lw": 1.5}
