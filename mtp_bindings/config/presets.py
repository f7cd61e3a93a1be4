"""Named MTP presets (design doc section 11): how many tokens to draft per round, and whether
to skip drafting after a streak of zero-accept rounds.

MTP is lossless: every preset writes exactly the text plain decoding writes (greedy: the same tokens;
sampling: the same distribution). A preset trades speed only, never the quality of the text; each
one's ``description`` (the command line's ``--preset`` help) says when it is fastest.

============  ===========  ===========  ==========================================================
preset        draft_n_max  skip_streak  fastest when
============  ===========  ===========  ==========================================================
auto          6 (ceiling)  0            the default: each round drafts the count (0..6) with the
                                        most expected tokens/s from this context's measured costs
                                        and acceptance (:mod:`.generation.controller`)
throughput    1            0            heavy drafters (centroid heads) or low acceptance
lift          2            0            a good drafter on most text
balanced      2            4            mixed workloads: stops paying for drafts on hard stretches
quality       3            0            highly predictable text (code, boilerplate); the name is
                                        historical: the text is the same with every preset
============  ===========  ===========  ==========================================================

The fixed presets draft ``draft_n_max`` tokens every round. An explicit ``draft_n_max`` without a
preset is a fixed count too; with ``preset="auto"`` it is auto's ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..exceptions import InvalidParameterError


@dataclass(frozen=True)
class Preset:
    name: str
    draft_n_max: int
    skip_streak: int
    auto: bool = False  # draft_n_max is the ceiling of the per-round choice, not a fixed count
    description: str = ""  # the text it is fastest for (never: better text; see :meth:`summary`)

    def summary(self) -> str:
        """What it drafts and when that is fastest, in one line (the ``--preset`` help)."""
        if self.auto:
            what = f"drafts 0..{self.draft_n_max} tokens each round"
        else:
            what = f"drafts {self.draft_n_max} token{'s' if self.draft_n_max != 1 else ''} a round"
        if self.skip_streak:
            what += f", skips a round after {self.skip_streak} in a row with nothing accepted"
        return f"{what}; fastest for {self.description}"


PRESETS: dict[str, Preset] = {
    # 7 verify rows at most: inside the batch-invariant 1..8
    "auto": Preset("auto", 6, 0, auto=True, description="any text: it picks the count with the most expected "
                                                          "tokens/s from this context's measured costs and "
                                                          "acceptance"),
    "throughput": Preset("throughput", 1, 0, description="heavy drafters (centroid heads) or low acceptance"),
    "lift": Preset("lift", 2, 0, description="a good drafter on most text"),
    "balanced": Preset("balanced", 2, 4, description="mixed text (stops paying for drafts on hard stretches)"),
    "quality": Preset("quality", 3, 0, description="highly predictable text (code, boilerplate); the name is "
                                                   "historical: the text is the same with every preset"),
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
