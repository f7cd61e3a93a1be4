"""Named MTP presets (design doc section 11): how many tokens to draft per round, and whether
to skip drafting after a streak of zero-accept rounds.

============  ===========  ===========  ==========================================================
preset        draft_n_max  skip_streak  when
============  ===========  ===========  ==========================================================
throughput    1            0            heavy drafters (centroid heads) or low acceptance
lift          2            0            the default: a good drafter on most text
balanced      2            4            mixed workloads: stops paying for drafts on hard stretches
quality       3            0            highly predictable text (code, boilerplate)
============  ===========  ===========  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from .exceptions import InvalidParameterError


@dataclass(frozen=True)
class Preset:
    name: str
    draft_n_max: int
    skip_streak: int


PRESETS: dict[str, Preset] = {
    "throughput": Preset("throughput", 1, 0),
    "lift": Preset("lift", 2, 0),
    "balanced": Preset("balanced", 2, 4),
    "quality": Preset("quality", 3, 0),
}
DEFAULT_PRESET = "lift"


def resolve_preset(name: str | None) -> Preset:
    """The preset called ``name`` (default: ``lift``)."""
    if name is None:
        return PRESETS[DEFAULT_PRESET]
    try:
        return PRESETS[name]
    except KeyError:
        raise InvalidParameterError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}") from None
