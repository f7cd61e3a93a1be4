"""When two greedy decodes agree: the one rule for comparing the tokens of two computations.

Two computations of the same model that round differently (another build, another weight or KV
type, a scaled-up copy, Hugging Face's reference) give logits that differ by up to some ``tol`` on
every entry. Greedy decoding then picks the same token wherever the best token leads the second by
more than ``2 * tol`` -- and may pick either where it does not: a *near-tie*. So two greedy token
sequences agree when they are identical, or when they first part where the reference's row (the one
plain decoding chose its token from) puts the two tokens within ``2 * tol`` of each other. After a
parting the histories differ and no later token is comparable; to compare further, feed one run's
tokens to both (teacher forcing, :func:`forced_rows`) and compare the rows.

Within one model and build, greedy MTP equals plain greedy exactly (every CPU kernel of a decode of
1..8 tokens is batch-invariant), so there the tolerance is 0 and any parting is a defect.

Pure: numpy and a context's ``decode`` / ``get_logits`` / ``clear``, nothing compiled imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def first_parting(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (the shorter one's length when one is a
    prefix of the other), None when they are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def gap(row: np.ndarray, chosen: int, other: int) -> float:
    """How far ``chosen``'s logit leads ``other``'s in ``row`` (negative when it trails)."""
    return float(row[chosen]) - float(row[other])


def is_near_tie(gap_: float, tol: float) -> bool:
    """Whether two computations whose logits differ by at most ``tol`` may choose differently
    between two tokens ``gap_`` apart in one of them (each may move by ``tol``, in opposite ways)."""
    return abs(gap_) <= 2.0 * tol


@dataclass(frozen=True)
class Agreement:
    """How ``other`` relates to ``reference``: identical, or parted first at ``at`` where the
    reference's row put its token ``gap`` above other's (None when one of them had ended there)."""

    tol: float
    at: int | None = None
    gap: float | None = None

    @property
    def identical(self) -> bool:
        return self.at is None

    @property
    def agrees(self) -> bool:
        """Identical, or parted at a near-tie of the computations compared."""
        return self.at is None or (self.gap is not None and is_near_tie(self.gap, self.tol))

    def describe(self) -> str:
        if self.at is None:
            return "identical"
        if self.gap is None:
            return f"one ended at token {self.at} where the other went on"
        kind = "a near-tie" if self.agrees else "not a near-tie"
        return f"parted at token {self.at}, where the reference's token leads by {self.gap:.4g} ({kind} for tolerance " \
               f"{self.tol:g})"


def compare_greedy(reference: Sequence[int], other: Sequence[int], row_at: Callable[[int], np.ndarray],
                   tol: float) -> Agreement:
    """Judge ``other`` against ``reference`` with the near-tie rule. ``row_at(i)``: the logits row
    the reference chose token ``i`` from (only called at a parting)."""
    at = first_parting(reference, other)
    if at is None or at >= len(reference) or at >= len(other):
        return Agreement(tol, at)
    return Agreement(tol, at, gap(row_at(at), reference[at], other[at]))


def forced_rows(ctx: Any, prompt: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """Teacher forcing on plain decoding: the rows ``[len(tokens), n_vocab]`` a plain decode of
    ``prompt`` then ``tokens`` one at a time gives, row ``i`` being the one token ``i`` is chosen
    from. The prompt is decoded as generation's prefill does (all but its last token in batches,
    the last alone), so row 0 is plain generation's first row bit for bit. Clears ``ctx``."""
    prompt = list(prompt)
    ctx.clear()
    if len(prompt) > 1:
        ctx.decode(prompt[:-1], pos=0, logits="none")
    ctx.decode(prompt[-1:], pos=len(prompt) - 1)
    rows = [np.array(ctx.get_logits(-1), dtype=np.float32)]
    for i, tok in enumerate(tokens[:-1]):
        ctx.decode([int(tok)], pos=len(prompt) + i)
        rows.append(np.array(ctx.get_logits(-1), dtype=np.float32))
    ctx.clear()
    return np.stack(rows[:len(tokens)]) if len(tokens) else np.zeros((0, rows[0].size), np.float32)
