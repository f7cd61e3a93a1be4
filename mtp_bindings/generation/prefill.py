"""The prompt: decode it into the KV, ready for the first sampled token.

With embeddings on, llama.cpp outputs every row of a batch: only the last prompt token's hidden
state is needed, so the rest of the prompt is processed without them. Plain decoding splits the
prompt the same way: a batch and a single-token decode may round a near-tie differently, and
greedy output must not depend on whether drafting is on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..context import Context

PromptProgress = Callable[[int, int], "bool | None"]


def prefill(ctx: Context, prompt: Sequence[int], seq_id: int, hidden: bool,
            progress: PromptProgress | None = None) -> bool:
    """Empty ``seq_id`` and decode ``prompt`` into it; the last token's logits (and hidden state
    when ``hidden``) are then row -1. False when ``progress`` asked to stop."""
    ctx.seq_rm(seq_id, 0, -1)
    if len(prompt) > 1:
        ctx.set_embeddings(False)
        if not _decode_prompt(ctx, list(prompt[:-1]), seq_id, progress):
            return False
    ctx.set_embeddings(hidden)
    ctx.decode(prompt[-1:], pos=len(prompt) - 1, seq_id=seq_id)
    return True


def _decode_prompt(ctx: Context, tokens: list[int], seq_id: int, progress: PromptProgress | None) -> bool:
    """Decode the prompt (no outputs) batch by batch, as :meth:`Context.decode` splits it, telling
    ``progress(done, total)`` after each batch: a long prompt takes a while, and a caller may show
    it or stop. False when ``progress`` asked to stop."""
    if progress is None:
        ctx.decode(tokens, pos=0, seq_id=seq_id, logits="none")
        return True
    step = ctx.n_batch
    for start in range(0, len(tokens), step):
        ctx.decode(tokens[start:start + step], pos=start, seq_id=seq_id, logits="none")
        if progress(min(start + step, len(tokens)), len(tokens)) is False:
            return False
    return True
