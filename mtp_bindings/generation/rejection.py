"""Exact speculative sampling over drafted tokens (the role of vLLM's ``RejectionSampler``).

Leviathan et al. 2023, sec. 2.3, for *deterministic* drafts (the MTP head drafts by argmax, so
the draft distribution is one-hot): draft ``d`` at row ``i`` is accepted with probability
``p_i(d)``; on rejection the token is drawn from ``p_i`` with ``d`` removed; when every draft is
accepted the bonus token is drawn from the last row. ``p_i`` is the sampler chain's distribution
(:mod:`.sampling`: llama-server's samplers), computed on its candidates only; the chain has heard the
drafts accepted before row ``i`` (penalties, DRY), so accepted tokens are distributed exactly as
one-at-a-time sampling. At temperature 0 both reduce to the greedy pick (greedy equivalence). With
llama.cpp's chain the round runs in C (:meth:`~.chain.SamplerChain.verify_round`, the same rule over the
same distribution, each row read once, a grammar's masks of all its rows computed first); with a chain of the
tests' own, in numpy, here.

With a grammar (:class:`~.constraint.TokenConstraint`) every row is masked in the grammar's state
after the tokens before it, so a draft the grammar forbids has probability 0 and is rejected; a
draft enters the grammar only once accepted, and so does the token drawn after the drafts.
Without one the rows are read as they are (no copy, no cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..exceptions import MTPBindingsError
from .sampling import NoCandidateError, Sampler, round_seed

if TYPE_CHECKING:
    from .constraint import TokenConstraint


class RejectionSampler:
    """Accepts or rejects drafts against the target's rows, drawing from ``sampler``'s generator
    (one seeded generator per generation: the same seed gives the same tokens); ``constraint``,
    if given, is the grammar every emitted token follows. Every emitted token -- an accepted draft,
    the token after the drafts, the token after the prompt -- is heard at once by the sampler's chain
    and the grammar, and nothing else is: a rejected draft never reaches either, so neither has
    anything to take back."""

    def __init__(self, sampler: Sampler, constraint: TokenConstraint | None = None) -> None:
        self.sampler = sampler
        self.constraint = constraint
        # llama.cpp's chain verifies a whole round in C (SamplerChain.verify_round), a grammar's masks of its rows
        # with it; a chain (or a constraint) of the tests' own goes the numpy way
        native = constraint is None or hasattr(constraint, "round_masks")
        self._native = getattr(sampler.chain, "verify_round", None) if native else None
        if self._native is not None and not sampler.params.greedy:  # its numbers, from the sampler's seed
            sampler.chain.seed_rounds(round_seed(sampler.rng))  # type: ignore[attr-defined]

    def verify(self, rows: Sequence[np.ndarray], drafts: Sequence[int]) -> tuple[int, int]:
        """Verify ``drafts`` against the target's ``rows`` (``len(drafts) + 1`` logits rows: row
        ``i`` is the target's prediction after the emitted tokens and ``drafts[:i]``).

        Returns ``(n_accepted, next_token)``: the first ``n_accepted`` drafts are kept and
        ``next_token`` follows them (the correction on a rejection, the bonus otherwise).
        """
        if self._native is not None:
            return self._native_round(rows, drafts)
        sampler = self.sampler
        for i, d in enumerate(drafts):
            row = rows[i] if self.constraint is None else self.constraint.mask(rows[i])
            if sampler.params.greedy:
                tok = sampler.greedy_pick(row)
                if tok != d:
                    return i, self._emit(tok)
            else:
                ids, probs = sampler.distribution(row)
                hit = np.searchsorted(ids, d)  # ids are in ascending order
                p_d = float(probs[hit]) if hit < ids.size and ids[hit] == d else 0.0
                if p_d <= 0.0 or sampler.rng.random() >= p_d:
                    # residual norm(max(p - q, 0)) with a one-hot q: p without d, renormalised
                    if p_d > 0.0:
                        probs = probs.copy()
                        probs[hit] = 0.0
                        probs /= probs.sum()
                    return i, self._emit(int(ids[sampler.draw(probs)]))
            self._emit(int(d))
        return len(drafts), self.sample(rows[len(drafts)])

    def _native_round(self, rows: Sequence[np.ndarray], drafts: Sequence[int]) -> tuple[int, int]:
        c = self.constraint
        if c is None:
            return self._native(rows, drafts)  # type: ignore[misc]
        # the rows up to the first draft the grammar forbids: that draft has probability 0 there, so a draw
        # from the row is the rejection's draw (the same number, u[2 i + 1])
        masks = c.round_masks(list(drafts))
        n = masks.shape[0]
        try:
            n_acc, y = self._native(rows[:n], drafts[:n - 1], None, masks)  # type: ignore[misc]
        except NoCandidateError:
            raise MTPBindingsError(f"the grammar allows no next token: {c.matcher.get_error() or 'dead end'}") from None
        for t in list(drafts[:n_acc]) + [y]:
            c.consume(t)
        return n_acc, y

    def verify_picks(self, picks: Sequence[int], drafts: Sequence[int]) -> tuple[int, int]:
        """:meth:`verify` at temperature 0 with a chain that cannot change the argmax, given each row's
        argmax (``picks``, taken in the graph) instead of the rows: the same tokens, no row read."""
        for i, d in enumerate(drafts):
            if picks[i] != d:
                return i, self._emit(picks[i])
            self._emit(int(d))
        return len(drafts), self._emit(picks[len(drafts)])

    def take(self, pick: int) -> int:
        """The token after the prompt when the graph picked it (greedy): emitted as :meth:`sample`'s is."""
        return self._emit(int(pick))

    def sample(self, row: np.ndarray) -> int:
        """One token from one logits row (the first token after the prompt, or the bonus token
        after the accepted drafts), masked by the constraint if there is one."""
        if self._native is not None:
            return self._native_round([row], [])[1]
        if self.constraint is not None:
            row = self.constraint.mask(row)
        return self._emit(self.sampler.sample(row))

    def _emit(self, token: int) -> int:
        if self.constraint is not None:
            self.constraint.consume(token)
        self.sampler.accept(token)
        return token
