"""Named MTP presets (design doc section 11): how many tokens to draft per round, and whether
to skip drafting after a streak of zero-accept rounds.

============  ===========  ===========  ==========================================================
preset        draft_n_max  skip_streak  when
============  ===========  ===========  ==========================================================
auto          6 (ceiling)  0            the default: each round drafts the count (0..6) with the
                                        most expected tokens/s from this context's measured costs
                                        and acceptance (:mod:`.generation.controller`)
throughput    1            0            heavy drafters (centroid heads) or low acceptance
lift          2            0            a good drafter on most text
balanced      2            4            mixed workloads: stops paying for drafts on hard stretches
quality       3            0            highly predictable text (code, boilerplate)
============  ===========  ===========  ==========================================================

The fixed presets draft ``draft_n_max`` tokens every round. An explicit ``draft_n_max`` without a
preset is a fixed count too; with ``preset="auto"`` it is auto's ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass

from .exceptions import InvalidParameterError


@dataclass(frozen=True)
class Preset:
    name: str
    draft_n_max: int
    skip_streak: int
    auto: bool = False  # draft_n_max is the ceiling of the per-round choice, not a fixed count


PRESETS: dict[str, Preset] = {
    "auto": Preset("auto", 6, 0, auto=True),  # 7 verify rows at most: inside the batch-invariant 1..8
    "throughput": Preset("throughput", 1, 0),
    "lift": Preset("lift", 2, 0),
    "balanced": Preset("balanced", 2, 4),
    "quality": Preset("quality", 3, 0),
}
DEFAULT_PRESET = "auto"


def resolve_preset(name: str | None) -> Preset:
    """The preset called ``name`` (default: ``auto``)."""
    if name is None:
        return PRESETS[DEFAULT_PRESET]
    try:
        return PRESETS[name]
    except KeyError:
        raise InvalidParameterError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}") from None
