"""Sampling: turn a logits row into the next token, and verify drafted tokens losslessly.

:class:`SamplingParams` holds llama.cpp-style sampler settings. :meth:`Sampler.distribution`
builds the exact next-token distribution for a logits row given the token history (penalties
over the last ``repeat_last_n`` tokens, then top-k, temperature, min-p, top-p, as llama.cpp's
default chain orders them). :meth:`Sampler.verify` implements exact speculative sampling
(Leviathan et al. 2023, sec. 2.3) for *deterministic* drafts (the MTP head drafts by argmax, so
the draft distribution is one-hot): draft ``d`` at row ``i`` is accepted with probability
``p_i(d)``; on rejection the token is drawn from ``p_i`` with ``d`` removed; when every draft is
accepted the bonus token is drawn from the last row. Penalties for row ``i`` are computed over the
history plus the drafts accepted before it, so accepted tokens are distributed exactly as
one-at-a-time sampling. At temperature 0 both reduce to argmax (greedy equivalence).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .exceptions import InvalidParameterError


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings (llama.cpp names and defaults, except ``temperature`` defaults to greedy)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        def num(name: str, lo: float, hi: float) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or v != v:
                raise InvalidParameterError(f"{name} must be a number in [{lo}, {hi}], got {v!r}")

        num("temperature", 0.0, 100.0)
        num("top_p", 0.0, 1.0)
        num("min_p", 0.0, 1.0)
        num("repeat_penalty", 0.0, 100.0)
        num("presence_penalty", -100.0, 100.0)
        num("frequency_penalty", -100.0, 100.0)
        for name in ("top_k", "repeat_last_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidParameterError(f"{name} must be a non-negative int, got {v!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise InvalidParameterError(f"seed must be a non-negative int or None, got {self.seed!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                    isinstance(k, int) and not isinstance(k, bool) and k >= 0 and isinstance(v, (int, float))
                    and not isinstance(v, bool) and v == v for k, v in self.logit_bias.items()):
                raise InvalidParameterError("logit_bias must map token ids (ints >= 0) to numbers")
        if self.top_p == 0.0:
            raise InvalidParameterError("top_p must be > 0")
        if self.repeat_penalty == 0.0:
            raise InvalidParameterError("repeat_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0) \
            and self.repeat_last_n > 0


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
        z = self.penalized(logits, history).astype(np.float64)
        if p.top_k and p.top_k < z.size:
            ids = np.argpartition(-z, p.top_k - 1)[: p.top_k]
        else:
            ids = np.arange(z.size)
        order = np.argsort(-z[ids], kind="stable")
        ids = ids[order]
        zs = z[ids] / p.temperature
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

    # --- sampling and verification -------------------------------------------------------------

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """One token from one logits row."""
        if self.params.greedy:
            return int(np.argmax(self.penalized(logits, history)))
        ids, probs = self.distribution(logits, history)
        return int(ids[self._draw(probs)])

    def verify(self, rows: np.ndarray, drafts: Sequence[int], history: Sequence[int]) -> tuple[int, int]:
        """Verify ``drafts`` against the target's ``rows`` (``len(drafts) + 1`` logits rows: row
        ``i`` is the target's prediction after ``history + drafts[:i]``).

        Returns ``(n_accepted, next_token)``: the first ``n_accepted`` drafts are kept and
        ``next_token`` follows them (the correction on a rejection, the bonus otherwise).
        """
        hist = list(history)
        for i, d in enumerate(drafts):
            if self.params.greedy:
                tok = int(np.argmax(self.penalized(rows[i], hist)))
                if tok != d:
                    return i, tok
            else:
                ids, probs = self.distribution(rows[i], hist)
                hit = np.nonzero(ids == d)[0]
                p_d = float(probs[hit[0]]) if hit.size else 0.0
                if p_d <= 0.0 or self.rng.random() >= p_d:
                    # residual norm(max(p - q, 0)) with a one-hot q: p without d, renormalised
                    if hit.size:
                        probs = probs.copy()
                        probs[hit[0]] = 0.0
                        probs /= probs.sum()
                    return i, int(ids[self._draw(probs)])
            hist.append(int(d))
        return len(drafts), self.sample(rows[len(drafts)], hist)

    def _draw(self, probs: np.ndarray) -> int:
        u = self.rng.random()
        idx = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return min(idx, probs.size - 1)
