"""The round loop: it only orchestrates. Each round a policy picks ``k`` (:mod:`.controller`: fixed or
``auto``), a drafter proposes ``k`` tokens, the verifier
decodes ``[last token] + drafts`` in one target decode, the rejection sampler keeps a prefix and
draws the next token, the verifier rolls the KV back past it, and the drafter hears the outcome
(and, with depth-2, starts drafting the next round while the caller handles these tokens).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence

import numpy as np

from ..llama_context import LlamaContext
from ..config.params import DraftParams
from .constraint import TokenConstraint
from .controller import make_draft_count
from .drafter import Proposal, make_drafter
from .logprobs import LogprobRecorder
from .prefill import PromptProgress, prefill
from .prompt_cache import prompt_cache
from .rejection import RejectionSampler
from .sampling import Sampler
from .stats import GenerationStats
from .trace import Tracer
from .verifier import Verifier


def plan(draft_n_max: int, remaining: int, attn_pos: int, n_ctx: int) -> int:
    """Drafts for the next round: never past max_tokens (the round adds k + 1) or the context."""
    return max(0, min(draft_n_max, remaining - 1, n_ctx - attn_pos - 2))


def token_rounds(ctx: LlamaContext, prompt: Sequence[int], sampler: Sampler, max_tokens: int, opts: DraftParams,
                 stats: GenerationStats, tracer: Tracer, seq_id: int = 0,
                 prompt_progress: PromptProgress | None = None,
                 logprobs: LogprobRecorder | None = None,
                 constraint: TokenConstraint | None = None) -> Iterator[list[int]]:
    """Yield the tokens each round produces (first the token sampled after the prompt).

    Stops at ``max_tokens``, at an end-of-generation token (not yielded) or when the context is
    full (``stats.hit_context_limit``); the caller may stop early by closing the generator. Any
    drafting work is drained on exit. ``prompt_progress(done, total)`` is called after each batch
    of the prompt; returning False stops before anything is generated. ``logprobs``, if given,
    records each yielded token's logprobs from its row, before the next decode overwrites it.
    ``constraint``, if given, is a grammar every token follows (masked rows, see
    :mod:`.constraint`); the generation stops when the grammar is complete (``stats.hit_eog``).
    ``sampler``'s chain hears the prompt, then every emitted token (the rejection sampler feeds it).
    """
    model = ctx.model
    drafting = opts.draft_n_max > 0 and model.has_assistant  # type: ignore[attr-defined]
    # a verify batch is decoded in one piece, so its rows are all there to read: at most n_batch of them
    draft_n_max = min(opts.draft_n_max, ctx.n_batch - 1) if drafting else 0
    drafter = make_drafter(ctx, drafting, seq_id, opts.depth2, opts.skip_streak)
    # acceptance depends on the sampler's settings (not its seed) and on a grammar: requests alike share a prior
    pool_key = (repr(dataclasses.replace(sampler.params, seed=None)), constraint is not None)
    counts = make_draft_count(ctx, drafting, draft_n_max, opts.auto, pool_key)
    verifier = Verifier(ctx, seq_id, opts.h_idx)
    rejection = RejectionSampler(sampler, constraint)
    # greedy, and nothing needs a row (logprobs, a grammar, a chain that moves the argmax): the graph takes the
    # argmax of each row, and a round reads k + 1 token ids instead of k + 1 rows of n_vocab logits
    graph = (opts.graph_greedy and sampler.params.greedy and not sampler.chain.changes_argmax
             and logprobs is None and constraint is None and ctx.set_graph_greedy(seq_id, True))
    rows: list[np.ndarray] = []
    trace = tracer.enabled and drafting
    history = list(prompt)
    n_ctx = ctx.n_ctx
    cache = prompt_cache(ctx)
    stats.n_prompt_cached = cache.reusable(seq_id, prompt) if opts.cache_prompt else 0
    attn_pos = -1  # KV positions 0..attn_pos hold history[:attn_pos + 1] (none until the prompt is in)
    try:
        t0 = time.perf_counter()
        ctx.adapt_threads()
        if not prefill(ctx, history, seq_id, drafting, prompt_progress, stats.n_prompt_cached, sampled=graph):
            return
        stats.t_prompt = time.perf_counter() - t0
        t = time.perf_counter()
        sampler.accept_history(history)  # the prompt, as llama-server's slot feeds its sampler
        x = rejection.take(ctx.sampled_tokens(1)[0]) if graph else rejection.sample(ctx.logits_view(-1))
        round_end = time.perf_counter()  # rounds are timed end to end, from this token's pick on
        stats.t_sample += round_end - t
        attn_pos = len(history) - 1
        if model.is_eog(x) and not opts.ignore_eos:
            stats.hit_eog = True
            return
        if logprobs is not None:
            logprobs.record(ctx.logits_view(-1), x)
        history.append(x)
        stats.n_generated = 1
        if constraint is not None and constraint.stopped:
            stats.hit_eog = True
            yield [x]
            return
        # each round's k is chosen once, before depth-2 submits its drafting; a plain round (k = 0) needs no
        # hidden state, so none is copied out
        k_next = counts.first()
        lease = 0  # rounds that repeat the policy's last choice without asking it (see DraftCount.lease)
        k = plan(k_next, max_tokens - 1, attn_pos, n_ctx)
        t = time.perf_counter()
        h = ctx.get_embeddings(-1) if k > 0 else None
        drafter.prepare_next(attn_pos, x, h, k)
        # copying h out and submitting the drafting request are drafting: the next round's t_draft counts them
        t_submit = time.perf_counter() - t
        yield [x]
        it = 0
        while stats.n_generated < max_tokens and attn_pos + 2 <= n_ctx:
            t = time.perf_counter()
            if k > 0:
                proposal = drafter.propose(attn_pos, x, h, k)
            else:
                drafter.cancel()
                proposal = Proposal([], "skip-nsteps" if drafting else "none")
            stats.n_skipped_rounds += proposal.skipped
            drafts = proposal.tokens
            t_draft = time.perf_counter() - t + t_submit
            stats.t_draft += t_draft
            if trace:
                tracer.event(event="mtp_draft", iter=it, path=proposal.path, seq_id=seq_id, id_last=x, k=k,
                             h_idx=opts.h_idx, attn_pos=attn_pos, n_steps=len(drafts),
                             h_l2=float(np.linalg.norm(h)) if h is not None else 0.0, drafts=drafts)

            t = time.perf_counter()
            if graph:
                picks = verifier.picks(x, drafts, attn_pos)
            else:
                rows = verifier.rows(x, drafts, attn_pos)
            t_verify = time.perf_counter() - t
            stats.t_verify += t_verify

            t = time.perf_counter()
            n_acc, y = rejection.verify_picks(picks, drafts) if graph else rejection.verify(rows, drafts)
            t_end = time.perf_counter()
            t_sample = t_end - t
            t_round, round_end = t_end - round_end, t_end  # this round, end to end (the caller's time included)
            stats.t_sample += t_sample
            # Re-read the load for the next decode here: the drafting worker and the compute threads are idle,
            # and the reader of the last yielded piece (woken a whole decode ago) is asleep again. Read just
            # after a yield, that reader is almost always running and looks like load.
            ctx.adapt_threads()
            verifier.accept(attn_pos, len(drafts), n_acc)
            h_row = verifier.hidden_row(len(drafts), n_acc)
            attn_pos += 1 + n_acc
            accepted = drafts[:n_acc] + [y]
            stats.count_round(len(drafts), n_acc)
            drafter.update(len(drafts), n_acc)
            # the next round's drafts, chosen with this round's outcome (unused when the request ends here)
            if lease:
                lease -= 1
            else:
                k_next = counts.after(len(drafts), n_acc, t_draft, t_verify, t_sample, t_round)
                lease = counts.lease
            if trace:
                tracer.event(event="mtp_accept", iter=it, n_accepted=n_acc, n_drafted_prev=len(drafts))
            it += 1

            eog = None if opts.ignore_eos else next((i for i, tok in enumerate(accepted) if model.is_eog(tok)), None)
            if eog is not None:
                accepted = accepted[:eog]
            if logprobs is not None:  # row i predicted accepted[i]; no decode since verify
                for i, tok in enumerate(accepted):
                    logprobs.record(rows[i], tok)
            history.extend(accepted)
            stats.n_generated += len(accepted)
            if eog is not None or (constraint is not None and constraint.stopped):
                stats.hit_eog = True
                if accepted:
                    yield accepted
                return
            x = y
            if stats.n_generated < max_tokens:
                k = plan(k_next, max_tokens - stats.n_generated, attn_pos, n_ctx) if k_next else 0
                t = time.perf_counter()
                h = ctx.get_embeddings(h_row) if k > 0 else None  # no decode since verify: the row is there
                drafter.prepare_next(attn_pos, x, h, k)
                t_submit = time.perf_counter() - t
            yield accepted
        stats.hit_context_limit = stats.n_generated < max_tokens
    except BaseException as e:
        if not isinstance(e, GeneratorExit):  # a failed decode or edit: what the KV holds is unknown
            attn_pos = -1
        raise
    finally:
        drafter.cancel()
        stats.draft_policy = counts.finish()
        cache.store(seq_id, history[:attn_pos + 1])  # for the next generation's prompt cache
