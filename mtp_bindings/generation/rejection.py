"""Exact speculative sampling over drafted tokens (the role of vLLM's ``RejectionSampler``).

Leviathan et al. 2023, sec. 2.3, for *deterministic* drafts (the MTP head drafts by argmax, so
the draft distribution is one-hot): draft ``d`` at row ``i`` is accepted with probability
``p_i(d)``; on rejection the token is drawn from ``p_i`` with ``d`` removed; when every draft is
accepted the bonus token is drawn from the last row. Penalties for row ``i`` are computed over the
history plus the drafts accepted before it, so accepted tokens are distributed exactly as
one-at-a-time sampling. At temperature 0 both reduce to argmax (greedy equivalence). Pure numpy.

With a grammar (:class:`~.constraint.TokenConstraint`) every row is masked in the grammar's state
after the tokens before it, so a draft the grammar forbids has probability 0 and is rejected; a
draft enters the grammar only once accepted, and so does the token drawn after the drafts.
Without one the rows are read as they are (no copy, no cost).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .sampling import Sampler

if TYPE_CHECKING:
    from .constraint import TokenConstraint


class RejectionSampler:
    """Accepts or rejects drafts against the target's rows, drawing from ``sampler``'s generator
    (one seeded generator per generation: the same seed gives the same tokens); ``constraint``,
    if given, is the grammar every emitted token follows."""

    def __init__(self, sampler: Sampler, constraint: TokenConstraint | None = None) -> None:
        self.sampler = sampler
        self.constraint = constraint

    def verify(self, rows: Sequence[np.ndarray], drafts: Sequence[int], history: Sequence[int]) -> tuple[int, int]:
        """Verify ``drafts`` against the target's ``rows`` (``len(drafts) + 1`` logits rows: row
        ``i`` is the target's prediction after ``history + drafts[:i]``).

        Returns ``(n_accepted, next_token)``: the first ``n_accepted`` drafts are kept and
        ``next_token`` follows them (the correction on a rejection, the bonus otherwise).
        """
        hist = list(history)
        for i, d in enumerate(drafts):
            row = rows[i] if self.constraint is None else self.constraint.mask(rows[i])
            if self.sampler.params.greedy:
                tok = int(np.argmax(self.sampler.penalized(row, hist)))
                if tok != d:
                    return i, self._emit(tok)
            else:
                ids, probs = self._distribution(row, hist)
                hit = np.nonzero(ids == d)[0]
                p_d = float(probs[hit[0]]) if hit.size else 0.0
                if p_d <= 0.0 or self.sampler.rng.random() >= p_d:
                    # residual norm(max(p - q, 0)) with a one-hot q: p without d, renormalised
                    if hit.size:
                        probs = probs.copy()
                        probs[hit[0]] = 0.0
                        probs /= probs.sum()
                    return i, self._emit(int(ids[self.sampler.draw(probs)]))
            self._emit(int(d))
            hist.append(int(d))
        return len(drafts), self.sample(rows[len(drafts)], hist)

    def sample(self, row: np.ndarray, history: Sequence[int]) -> int:
        """One token from one logits row (the first token after the prompt, or the bonus token
        after the accepted drafts), masked by the constraint if there is one."""
        if self.constraint is None:
            return self.sampler.sample(row, history)
        row = self.constraint.mask(row)
        if self.sampler.params.greedy:
            return self._emit(int(np.argmax(self.sampler.penalized(row, history))))
        ids, probs = self._distribution(row, history)
        return self._emit(int(ids[self.sampler.draw(probs)]))

    def _distribution(self, row: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        ids, probs = self.sampler.distribution(row, history)
        if self.constraint is not None:  # masked tokens keep probability 0: drop them, so no draw lands on one
            keep = probs > 0.0
            ids, probs = ids[keep], probs[keep]
        return ids, probs

    def _emit(self, token: int) -> int:
        if self.constraint is not None:
            self.constraint.consume(token)
        return token
