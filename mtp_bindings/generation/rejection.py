"""Exact speculative sampling over drafted tokens (the role of vLLM's ``RejectionSampler``).

Leviathan et al. 2023, sec. 2.3, for *deterministic* drafts (the MTP head drafts by argmax, so
the draft distribution is one-hot): draft ``d`` at row ``i`` is accepted with probability
``p_i(d)``; on rejection the token is drawn from ``p_i`` with ``d`` removed; when every draft is
accepted the bonus token is drawn from the last row. Penalties for row ``i`` are computed over the
history plus the drafts accepted before it, so accepted tokens are distributed exactly as
one-at-a-time sampling. At temperature 0 both reduce to argmax (greedy equivalence). Pure numpy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import Sampler


class RejectionSampler:
    """Accepts or rejects drafts against the target's rows, drawing from ``sampler``'s generator
    (one seeded generator per generation: the same seed gives the same tokens)."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def verify(self, rows: np.ndarray, drafts: Sequence[int], history: Sequence[int]) -> tuple[int, int]:
        """Verify ``drafts`` against the target's ``rows`` (``len(drafts) + 1`` logits rows: row
        ``i`` is the target's prediction after ``history + drafts[:i]``).

        Returns ``(n_accepted, next_token)``: the first ``n_accepted`` drafts are kept and
        ``next_token`` follows them (the correction on a rejection, the bonus otherwise).
        """
        hist = list(history)
        for i, d in enumerate(drafts):
            if self.sampler.params.greedy:
                tok = int(np.argmax(self.sampler.penalized(rows[i], hist)))
                if tok != d:
                    return i, tok
            else:
                ids, probs = self.sampler.distribution(rows[i], hist)
                hit = np.nonzero(ids == d)[0]
                p_d = float(probs[hit[0]]) if hit.size else 0.0
                if p_d <= 0.0 or self.sampler.rng.random() >= p_d:
                    # residual norm(max(p - q, 0)) with a one-hot q: p without d, renormalised
                    if hit.size:
                        probs = probs.copy()
                        probs[hit[0]] = 0.0
                        probs /= probs.sum()
                    return i, int(ids[self.sampler.draw(probs)])
            hist.append(int(d))
        return len(drafts), self.sampler.sample(rows[len(drafts)], hist)
