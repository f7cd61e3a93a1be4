"""The sampler: turn a logits row and the token history into the next-token distribution, and
draw from it.

:meth:`Sampler.distribution` builds the exact next-token distribution (penalties over the last
``repeat_last_n`` tokens, then top-k, temperature, min-p, top-p, as llama.cpp's default chain
orders them); :meth:`Sampler.sample` draws one token (argmax at temperature 0). The settings are
:class:`~mtp_bindings.params.SamplingParams`. Verifying drafted tokens is :mod:`.rejection`'s job.
Pure numpy.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from ..params import SamplingParams


class Sampler:
    """Samples and verifies tokens for one generation (holds its seeded random generator)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    # --- the distribution ----------------------------------------------------------------------

    def penalized(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """Logits plus ``logit_bias``, then repeat / presence / frequency penalties over the last
        ``repeat_last_n`` tokens (llama.cpp's order)."""
        p = self.params
        if p.logit_bias:
            logits = logits.copy()
            for tok, bias in p.logit_bias.items():
                if tok < logits.size:
                    logits[tok] += bias
        if not p.has_penalties or not history:
            return logits
        window = history[-p.repeat_last_n:]
        counts = Counter(window)
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        cnt = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        out = logits.copy()
        sel = out[ids]
        if p.repeat_penalty != 1.0:
            sel = np.where(sel > 0, sel / p.repeat_penalty, sel * p.repeat_penalty)
        sel = sel - cnt * p.frequency_penalty - p.presence_penalty
        out[ids] = sel
        return out

    def distribution(self, logits: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The next-token distribution as (candidate token ids, probabilities), probabilities > 0."""
        p = self.params
        z = self.penalized(logits, history)
        if p.top_k > 0 and p.top_k < z.size:  # 0 or -1: all (llama.cpp's)
            # the k largest of the float32 row, only the candidates widened to float64 (a float64 copy of 262144
            # logits made it 2-3x slower); partitioned at k - 1 of the negated row: at n - k of the row itself the
            # selection crawls where many logits are equal (the scaled-up pair's padding tokens: 8 ms a row)
            ids = np.argpartition(-z, p.top_k - 1)[: p.top_k]
        else:
            ids = np.arange(z.size)
        zc = z[ids].astype(np.float64)
        order = np.argsort(-zc, kind="stable")
        ids = ids[order]
        zs = zc[order] / p.temperature
        zs -= zs[0]
        probs = np.exp(zs)
        probs /= probs.sum()
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            ids, probs = ids[keep], probs[keep]
            probs = probs / probs.sum()
        if p.top_p < 1.0:
            cum = np.cumsum(probs)
            n = int(np.searchsorted(cum, p.top_p) + 1)
            ids, probs = ids[:n], probs[:n]
            probs = probs / probs.sum()
        return ids, probs

    # --- sampling ------------------------------------------------------------------------------

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """One token from one logits row."""
        if self.params.greedy:
            return int(np.argmax(self.penalized(logits, history)))
        ids, probs = self.distribution(logits, history)
        return int(ids[self.draw(probs)])

    def draw(self, probs: np.ndarray) -> int:
        """An index drawn from ``probs`` with this sampler's random generator."""
        u = self.rng.random()
        idx = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return min(idx, probs.size - 1)

__all__ = ["Sampler", "SamplingParams"]
