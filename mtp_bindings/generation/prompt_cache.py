"""The prompt cache: which tokens a context's sequence holds in its KV memory, so that the next
generation on that context decodes only what follows the longest common token prefix (as
llama-server's ``cache_prompt``; a chat's next turn re-reads only the new messages).

What the KV holds is known only where generation itself put it: the loop records the tokens at
positions ``0..n-1`` when it ends (:meth:`PromptCache.store`), and any other destructive KV edit
(:meth:`Context.seq_rm`, :meth:`Context.clear`, the context's ``on_kv_edit`` hook) forgets every
record of the context, since those cells may have changed. The generation's own edits forget the
record too; it is written again at the end. Exactness rules the reuse: the prompt's last token is
always decoded again (drafting needs its hidden state, and the first sampled token its logits), so
at most ``len(prompt) - 1`` tokens are reused.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..llama_context import LlamaContext

KEY = "prompt_cache"


class PromptCache:
    """The tokens whose KV each sequence of one context holds (positions ``0..len - 1``)."""

    def __init__(self, ctx: LlamaContext) -> None:
        self.ctx = ctx
        self.held: dict[int, list[int]] = {}
        # Any edit may have removed or shifted cells of a recorded prefix: forget them all (the
        # hook does not say which sequence; only the generation of that sequence writes again).
        ctx.on_kv_edit(self.held.clear)

    def store(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Record that ``seq_id`` holds ``tokens`` at positions ``0..len(tokens) - 1`` (it may hold
        more cells past them: the next generation removes those)."""
        self.held[seq_id] = list(tokens)

    def reusable(self, seq_id: int, prompt: Sequence[int]) -> int:
        """How many leading tokens of ``prompt`` need not be decoded again: the common prefix with
        what ``seq_id`` holds, at most ``len(prompt) - 1``, and 0 where the KV no longer has the
        cells that the first re-decoded token attends to."""
        held = self.held.get(seq_id)
        if not held:
            return 0
        n = common_prefix(held, prompt[:-1])
        if n == 0 or self.ctx.seq_pos_max(seq_id) < n - 1:
            return 0
        return n if self._window_held(seq_id, n) else 0

    def _window_held(self, seq_id: int, n: int) -> bool:
        """Whether the cells that a token at position ``n`` attends to are still there. A
        sliding-window cache (Gemma's SWA layers, unless its cache is the full context) lets cells
        go once they are outside every window of the sequence; rolling back far past them (an edit
        of an early message) leaves a hole, and llama-server then re-reads the whole prompt too."""
        n_swa = int(getattr(self.ctx.model, "n_swa", 0))
        first_needed = max(0, n - n_swa + 1) if n_swa > 0 else 0
        return self.ctx.seq_pos_min(seq_id) <= first_needed


def prompt_cache(ctx: LlamaContext) -> PromptCache:
    """The context's :class:`PromptCache` (created on first use)."""
    cache = ctx.extension(KEY, PromptCache)
    assert cache is not None
    return cache


def cached_prefix(ctx: LlamaContext, tokens: Sequence[int], seq_id: int = 0) -> int:
    """How many leading ``tokens`` the record of ``ctx``'s sequence matches (0 without one): to pick
    a context for a prompt. Pure Python, no native call: safe from another thread while ``ctx`` is
    idle."""
    cache = ctx.extension(KEY)
    held = cache.held.get(seq_id) if isinstance(cache, PromptCache) else None
    return common_prefix(held or (), tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
