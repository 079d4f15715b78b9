"""One colour per stage, the same in every plot, SVG and terminal: the Okabe–Ito palette.

Okabe & Ito's eight colours ("Color Universal Design", 2008) stay distinguishable under the
common colour-vision deficiencies. Eleven client stages share them; stages that share a colour
never sit next to each other on a request's path. Server stages reuse the colour of what they
explain (server ``prefill`` is first-token pink, server ``decode`` is decode green), so a
reader matches a server lane to its client stage at a glance.
"""

from __future__ import annotations

from typing import Final

__all__ = ["OKABE_ITO", "STAGE_COLOURS", "ansi256", "colour", "profile_colour"]

#: The eight Okabe–Ito colours, by their published names.
OKABE_ITO: Final = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}
_GREY, _LIGHT_GREY, _PALE_GREY = "#999999", "#BBBBBB", "#DDDDDD"
_PALE_SKY = "#A6D8F5"  # sky blue lightened: h2_setup follows tls and must differ from connect

#: Stage (and residual) name → hex colour.
STAGE_COLOURS: Final = {
    "schedule_lag": _GREY,
    "pool_wait": OKABE_ITO["yellow"],
    "dns": OKABE_ITO["orange"],
    "connect": OKABE_ITO["sky_blue"],
    "tls": OKABE_ITO["blue"],
    "h2_setup": _PALE_SKY,
    "send": OKABE_ITO["black"],
    "wait": OKABE_ITO["vermillion"],
    "first_token": OKABE_ITO["reddish_purple"],
    "decode": OKABE_ITO["bluish_green"],
    "tail": _GREY,
    # server stages: the colour of what they explain
    "server_queue": OKABE_ITO["yellow"],
    "preprocess": OKABE_ITO["sky_blue"],
    "prefill": OKABE_ITO["reddish_purple"],
    "postprocess": _GREY,
    "inference": OKABE_ITO["orange"],
    # residuals
    "network": _LIGHT_GREY,
    "other": _PALE_GREY,
}

_PROFILE_CYCLE: Final = tuple(
    OKABE_ITO[k] for k in ("blue", "orange", "bluish_green", "vermillion")
)


def colour(stage: str) -> str:
    """The hex colour of ``stage``; unknown names get the neutral grey."""
    return STAGE_COLOURS.get(stage, _GREY)


def profile_colour(index: int) -> str:
    """Colour of the ``index``-th profiled thread's lane (cycles through four)."""
    return _PROFILE_CYCLE[index % len(_PROFILE_CYCLE)]


def _cube(level: int) -> int:
    """Nearest step of xterm's 6-level colour cube (0, 95, 135, 175, 215, 255)."""
    steps = (0, 95, 135, 175, 215, 255)
    return min(range(6), key=lambda i: abs(steps[i] - level))


def ansi256(hex_colour: str) -> int:
    """The xterm-256 code nearest to ``hex_colour`` (cube or grey ramp, whichever is closer).

    The terminal waterfall derives its colours from the same hex values as the plots, so the
    two can never drift apart.
    """
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    steps = (0, 95, 135, 175, 215, 255)
    ci = (_cube(r), _cube(g), _cube(b))
    cube_rgb = tuple(steps[i] for i in ci)
    grey_i = min(23, max(0, round((sum((r, g, b)) / 3 - 8) / 10)))
    grey = 8 + 10 * grey_i

    def dist(c: tuple[int, ...]) -> int:
        return sum((x - y) ** 2 for x, y in zip(c, (r, g, b), strict=True))

    if dist((grey, grey, grey)) < dist(cube_rgb):
        return 232 + grey_i
    return 16 + 36 * ci[0] + 6 * ci[1] + ci[2]
