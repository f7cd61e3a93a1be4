"""The sampler: turn a logits row into the next-token distribution, and draw from it.

The distribution is the one llama-server draws from: its sampler chain (:mod:`.chain`, llama.cpp's
own samplers in llama-server's order) keeps candidates and their logits, and
:func:`candidate_distribution` turns those into probabilities, in one canonical order (ascending
token id) whatever order the chain left them in, so that a draw depends only on the distribution and
the random number. :meth:`Sampler.sample` draws one token (at temperature 0 the highest logit, no
draw); verifying drafted tokens is :mod:`.rejection`'s job. The settings are
:class:`~mtp_bindings.config.params.SamplingParams`.

The chain is anything with :class:`Chain`'s shape, so this module is pure numpy: the tests give it a
chain of their own where llama.cpp's is not the point.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..config.params import SamplingParams

_SORT_MAX = 4096  # more candidates than this are put in id order by a scatter over the vocabulary, not a sort


class NoCandidateError(ValueError):
    """Every token of a row is out: its logits are all -inf (a grammar's mask, bans)."""


class Chain(Protocol):
    """What a sampler needs of a sampler chain (:class:`~.chain.SamplerChain` is the real one)."""

    changes_argmax: bool  # whether temperature 0 can pick another token than the raw row's argmax

    def apply(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates that survive the chain on ``row``: (token ids, logits)."""
        ...

    def accept(self, token: int) -> None:
        """Hear an emitted token."""
        ...

    def accept_history(self, tokens: list[int]) -> None:
        """Hear the tokens before the first sampled one."""
        ...

    def close(self) -> None:
        ...


def in_id_order(ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, logits)`` in ascending token id, the one canonical candidate order: a sort for a few
    candidates, a scatter over the vocabulary for many (no sort of a whole vocabulary)."""
    if ids.size <= _SORT_MAX:
        order = np.argsort(ids, kind="stable")
        return ids[order], logits[order]
    present = np.zeros(int(ids.max()) + 1, dtype=bool)
    present[ids] = True
    dense = np.empty(present.size, dtype=logits.dtype)
    dense[ids] = logits
    ordered = np.flatnonzero(present)
    return ordered.astype(ids.dtype, copy=False), dense[ordered]


def candidate_distribution(ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distribution a chain's final ``dist`` sampler draws from, given the candidates it kept:
    (token ids in ascending order, float64 probabilities summing to 1); candidates at -inf (a
    grammar's mask, a banned token) are dropped."""
    finite = np.isfinite(logits)
    if not finite.all():
        ids, logits = ids[finite], logits[finite]
    if ids.size == 0:
        raise NoCandidateError("no candidate token is left (every logit is -inf)")
    ids, logits = in_id_order(ids, logits)
    z = logits.astype(np.float64)
    z -= z.max()
    probs = np.exp(z)
    probs /= probs.sum()
    return ids, probs


def draw_index(probs: np.ndarray, u: float) -> int:
    """The index that the uniform number ``u`` in [0, 1) picks from ``probs`` (inverse CDF; never an
    entry of probability 0)."""
    cum = np.cumsum(probs)
    idx = int(np.searchsorted(cum, u * cum[-1], side="right"))  # cum[idx] > the target >= cum[idx - 1]
    return idx if idx < probs.size else int(np.flatnonzero(probs)[-1])  # the target rounded up to the total


def round_seed(rng: np.random.Generator) -> int:
    """The seed of a generation's native verify rounds (:class:`~.chain.RoundNumbers`), drawn from its
    sampler's generator when the generation starts."""
    return int(rng.integers(0, 1 << 63))


class Sampler:
    """Samples tokens for one generation from ``chain`` (holds the seeded random generator).

    The sampler owns the chain: :meth:`close` (or leaving a ``with`` block) closes it."""

    def __init__(self, params: SamplingParams, chain: Chain) -> None:
        self.params = params
        self.chain = chain
        self.rng = np.random.default_rng(params.seed)

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.chain.close()

    # --- the distribution ----------------------------------------------------------------------

    def distribution(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next-token distribution after ``row`` as (token ids, probabilities > 0), in id order."""
        return candidate_distribution(*self.chain.apply(row))

    def greedy_pick(self, row: np.ndarray) -> int:
        """Temperature 0's token: the highest logit that survives the chain (the lowest id of a tie);
        the raw row's argmax when the chain cannot change it (no bias, penalties, DRY, XTC, typical-p)."""
        if not self.chain.changes_argmax:
            return int(np.argmax(row))
        ids, logits = self.chain.apply(row)
        best = logits.max()
        return int(ids[logits == best].min())

    # --- sampling ------------------------------------------------------------------------------

    def sample(self, row: np.ndarray) -> int:
        """One token from one logits row (not yet heard by the chain: see :meth:`accept`)."""
        if self.params.greedy:
            return self.greedy_pick(row)
        ids, probs = self.distribution(row)
        return int(ids[self.draw(probs)])

    def draw(self, probs: np.ndarray) -> int:
        """An index drawn from ``probs`` with this sampler's random generator."""
        return draw_index(probs, self.rng.random())

    def accept(self, token: int) -> None:
        """``token`` is emitted: the chain hears it (penalties and DRY count it from the next row on)."""
        self.chain.accept(token)

    def accept_history(self, tokens: list[int]) -> None:
        """The tokens before the first sampled one (the prompt)."""
        self.chain.accept_history(tokens)


__all__ = ["Chain", "NoCandidateError", "Sampler", "SamplingParams", "candidate_distribution", "draw_index", "in_id_order", "round_seed"]
