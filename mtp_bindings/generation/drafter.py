"""Drafters: who proposes the tokens a round verifies, and how they learn from the outcome.

A drafter follows one small protocol, as transformers' candidate generators do
(``get_candidates`` / ``update_candidate_strategy``): :meth:`Drafter.propose` offers up to ``n``
tokens, :meth:`Drafter.update` hears how many of them the target accepted,
:meth:`Drafter.prepare_next` may start the next round's drafting early (depth-2 overlap), and
:meth:`Drafter.cancel` drops work in flight. Policies wrap a drafter: :class:`SkipStreak` is the
adaptive skip of the design's section 9, not a branch in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..llama_context import LlamaContext
from ..mtp import MTPHandle, session_of, set_worker_threads


@dataclass
class Proposal:
    """One round's drafts and how they came about (``path``, for the trace): ``lazy`` (waited
    for a depth-2 request), ``sync``, ``skip-streak`` (a policy skipped the round) or ``none``."""

    tokens: list[int]
    path: str
    skipped: bool = False


class Drafter(Protocol):
    """What the loop needs of a drafting strategy."""

    def propose(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> Proposal:
        """Up to ``n`` (>= 1) draft tokens following ``last_token``, whose predecessor sits at KV
        position ``attn_pos`` and left hidden state ``h``."""

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """Feedback: the target kept the first ``n_accepted`` of the ``n_drafted`` proposed."""

    def prepare_next(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> None:
        """Start drafting the next round ahead of time (depth-2); a no-op where unsupported."""

    def cancel(self) -> None:
        """Drop any work in flight (before destructive KV edits, at the end of a request)."""


class NoDrafter:
    """Plain decoding: never drafts."""

    def propose(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> Proposal:
        return Proposal([], "none")

    def update(self, n_drafted: int, n_accepted: int) -> None:
        pass

    def prepare_next(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> None:
        pass

    def cancel(self) -> None:
        pass


class MTPDrafter:
    """Drafts with the model's MTP assistant through the async C API (:mod:`mtp_bindings.mtp`)."""

    def __init__(self, ctx: LlamaContext, seq_id: int = 0, depth2: bool = True) -> None:
        self.session = session_of(ctx)
        self.seq_id = seq_id
        self.depth2 = depth2
        self.pending: MTPHandle | None = None
        self.pending_key: tuple[int, int, int] | None = None
        self.worker_threads: int | None = None  # what the drafting worker was last given

    def propose(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> Proposal:
        assert h is not None
        if self.pending is not None:
            if self.pending_key == (attn_pos, last_token, n):
                drafts, _ = self.pending.wait()
                self.pending = None
                return Proposal(drafts.tolist(), "lazy")
            self.cancel()  # n_steps (or the round) changed: drain and draft synchronously
        drafts, _ = self.session.submit(self.seq_id, attn_pos, last_token, h, n).wait()
        return Proposal(drafts.tolist(), "sync")

    def update(self, n_drafted: int, n_accepted: int) -> None:
        pass  # the MTP head drafts by argmax: nothing to adapt

    def prepare_next(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> None:
        if not self.depth2 or n <= 0 or h is None:
            return
        self.cancel()
        # The loop waits for this request before its next decode (meanwhile it only hands text to
        # the caller), so the worker may compute with the context's threads rather than the CPUs
        # they leave free (1 on 2 cores: measured 21.4 vs 22.6 tokens/s on the E2B-sized pair).
        # (a count the user set on the context, llama.cpp's -td, is kept). Where the target's short decodes run
        # faster on one thread, so does drafting, a smaller graph (tiny pair: 1 draft 100 vs 178 us a token); a
        # worker on two threads beside a target on one waited 860.
        ctx = self.session.ctx
        want = getattr(ctx, "draft_threads", None) or ctx.decode_threads
        if self.worker_threads != want:
            set_worker_threads(ctx, want)
            self.worker_threads = want
        self.pending = self.session.submit(self.seq_id, attn_pos, last_token, h, n)
        self.pending_key = (attn_pos, last_token, n)

    def cancel(self) -> None:
        if self.pending is not None:
            self.session.discard()
            self.pending = None
            self.pending_key = None


class SkipStreak:
    """Adaptive skip (design section 9) around another drafter: after ``threshold`` rounds in a
    row with zero accepted drafts, draft nothing for one round. A skipped round never counts
    towards the next streak (``last_was_skip``), so threshold 1 alternates instead of skipping
    forever."""

    def __init__(self, inner: Drafter | Any, threshold: int) -> None:
        self.inner = inner
        self.threshold = threshold
        self.streak = 0
        self.last_was_skip = False

    def will_skip(self) -> bool:
        """Whether the next round skips (without changing state)."""
        return self.threshold > 0 and not self.last_was_skip and self.streak >= self.threshold

    def propose(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> Proposal:
        skip = self.will_skip()
        if skip:
            self.streak = 0
        self.last_was_skip = skip
        if skip:
            self.inner.cancel()
            return Proposal([], "skip-streak", skipped=True)
        return self.inner.propose(attn_pos, last_token, h, n)

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted:
            self.streak = self.streak + 1 if n_accepted == 0 else 0
        self.inner.update(n_drafted, n_accepted)

    def prepare_next(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> None:
        if not self.will_skip():  # no point drafting a round that will be skipped
            self.inner.prepare_next(attn_pos, last_token, h, n)

    def cancel(self) -> None:
        self.inner.cancel()


def make_drafter(ctx: LlamaContext, drafting: bool, seq_id: int, depth2: bool, skip_streak: int) -> Drafter:
    """The drafter for a generation: MTP (wrapped in the skip-streak policy when its threshold is
    set) when drafting, else none."""
    if not drafting:
        return NoDrafter()
    drafter: Drafter = MTPDrafter(ctx, seq_id, depth2)
    return SkipStreak(drafter, skip_streak) if skip_streak > 0 else drafter
