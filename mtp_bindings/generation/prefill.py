"""The prompt: decode it into the KV, ready for the first sampled token.

With embeddings on, llama.cpp outputs every row of a batch: only the last prompt token's hidden
state is needed, so the rest of the prompt is processed without them. Plain decoding splits the
prompt the same way: a batch and a single-token decode may round a near-tie differently, and
greedy output must not depend on whether drafting is on.

A cached prefix (:mod:`.prompt_cache`) is kept rather than decoded again: only the tokens after it
are decoded, in batches that start where it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..llama_context import LlamaContext

PromptProgress = Callable[[int, int], "bool | None"]


def prefill(ctx: LlamaContext, prompt: Sequence[int], seq_id: int, hidden: bool,
            progress: PromptProgress | None = None, n_keep: int = 0, sampled: bool = False) -> bool:
    """Keep the first ``n_keep`` tokens of ``seq_id`` (a cached prefix of ``prompt``, at most
    ``len(prompt) - 1``), remove the rest, and decode ``prompt[n_keep:]`` after them; the last
    token's logits (its greedy pick in the graph when ``sampled``; and hidden state when ``hidden``)
    are then row -1. False when ``progress`` asked to stop."""
    ctx.seq_rm(seq_id, n_keep, -1)  # also drains a drafting request in flight (the KV-edit hook)
    if len(prompt) - 1 > n_keep:
        ctx.set_embeddings(False)
        if not _decode_prompt(ctx, list(prompt[:-1]), n_keep, seq_id, progress):
            return False
    ctx.set_embeddings(hidden)
    ctx.decode(prompt[-1:], pos=len(prompt) - 1, seq_id=seq_id, sampled=sampled)
    return True


def _decode_prompt(ctx: LlamaContext, tokens: list[int], start: int, seq_id: int,
                   progress: PromptProgress | None) -> bool:
    """Decode ``tokens[start:]`` (no outputs) batch by batch, as :meth:`Context.decode` splits it,
    telling ``progress(done, total)`` after each batch (``done`` counts the ``start`` tokens kept
    from the cache): a long prompt takes a while, and a caller may show it or stop. False when
    ``progress`` asked to stop."""
    if progress is None:
        ctx.decode(tokens[start:], pos=start, seq_id=seq_id, logits="none")
        return True
    step = ctx.n_batch
    for begin in range(start, len(tokens), step):
        ctx.decode(tokens[begin:begin + step], pos=begin, seq_id=seq_id, logits="none")
        if progress(min(begin + step, len(tokens)), len(tokens)) is False:
            return False
    return True
