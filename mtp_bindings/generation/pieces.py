"""One generation's text pieces: own the context (a pool's or the caller's) for the generation, run
the round loop (:func:`.loop.token_rounds`) one round at a time under the context's lock -- never
across a ``yield``, so a suspended stream keeps no one waiting -- and turn its tokens into
:class:`~.results.TextPiece` s (stop strings, cancellation, logprobs), the last one carrying the
stats and the finish reason."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, cast

from ..config.params import DraftParams, SamplingParams
from ..llama_context import LlamaContext
from ..llama_model import LlamaModel
from .chain import sampler_for
from .constraint import TokenConstraint
from .logprobs import LogprobRecorder
from .loop import token_rounds
from .results import TextPiece
from .stats import GenerationStats
from .text import TextAssembler
from .trace import Tracer


def generation_pieces(model: LlamaModel, context: LlamaContext | None, prompt: list[int], sp: SamplingParams, max_tokens: int,
            stops: list[str], opts: DraftParams, trace: Any, cancel: Callable[[], bool] | None,
            prompt_progress: Callable[[int, int], None] | None = None,
            recorder: LogprobRecorder | None = None,
            constraint: TokenConstraint | None = None, special_tokens: Collection[int] = (),
            stream: bool = True) -> Iterator[TextPiece]:
    stats = GenerationStats(n_prompt=len(prompt))
    tracer = Tracer.open(trace)
    text = TextAssembler(model, stops, special_tokens)
    finish = "length"
    stopped_in_prompt = False

    def on_prompt(done: int, total: int) -> bool:
        nonlocal stopped_in_prompt
        if prompt_progress is not None:
            prompt_progress(done, total)
        stopped_in_prompt = cancel is not None and bool(cancel())
        return not stopped_in_prompt

    watch = on_prompt if prompt_progress is not None or cancel is not None else None
    t0 = time.perf_counter()
    # the generation owns its context from here to its end (a suspended stream included): a fresh or
    # idle one of the model's pool, or the caller's, refused with ContextBusyError if another owns it
    lease = model.generation_context() if context is None else context.generation_claim(stream)
    with lease as leased, sampler_for(sp, model.n_vocab, model.vocab) as sampler:
        ctx = cast(LlamaContext, leased if context is None else context)  # the pool's lease yields one, a claim None
        rounds = token_rounds(ctx, prompt, sampler, max_tokens, opts, stats, tracer,
                              prompt_progress=watch, logprobs=recorder,
                              constraint=constraint) if max_tokens > 0 else iter(())
        try:
            while True:
                # the context's lock for one round, not across the yield: a caller suspending the
                # stream must not keep others' plain calls on this context waiting
                with ctx.generation_round():
                    toks = next(rounds, None)
                if toks is None:
                    if stopped_in_prompt:
                        finish = "cancelled"
                    elif stats.hit_eog:
                        finish = "stop"
                    break
                piece = text.feed(toks)
                lps = None if recorder is None else recorder.take(len(toks))
                if text.stopped:
                    finish = "stop"
                    yield TextPiece(piece, toks, logprobs=lps)
                    break
                if cancel is not None and cancel():
                    finish = "cancelled"
                    yield TextPiece(piece, toks, logprobs=lps)
                    break
                if piece or toks:
                    yield TextPiece(piece, toks, logprobs=lps)
        except GeneratorExit:
            finish = "cancelled"
            raise
        finally:
            if hasattr(rounds, "close"):
                with ctx.generation_round():
                    rounds.close()
            tracer.close()
            stats.t_total = time.perf_counter() - t0
    yield TextPiece(text.flush(), [], stats, finish, logprobs=None if recorder is None else [])
