"""The entry point ``generate`` (``chat``, in :mod:`.chat`, renders a chat and calls it): check the
arguments, resolve the defaults (the preset, then the environment -- read here, at the library's
edge, and nowhere below), run the round loop and assemble its tokens into a result or a stream of
text pieces.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Any, Literal, overload

import numpy as np

from ..chat.template import TEXT_TOKENIZE
from ..llama_context import LlamaContext
from ..config.env import env_depth2, env_graph_greedy, env_skip_streak, env_trace
from ..exceptions import ContextOverflowError, InvalidParameterError, NoAssistantError
from ..llama_model import LlamaModel
from ..config.limits import UNTIL_FULL
from ..config.params import DraftParams, SamplingParams, SpeculativeParams
from ..config.presets import resolve_preset
from .logprobs import TOP_LOGPROBS_MAX, LogprobRecorder
from .constraint import Grammar, TokenConstraint, as_grammar
from .pieces import generation_pieces
from .results import GenerationResult, TextPiece


_H_IDX: ContextVar[str] = ContextVar("mtp_bindings_h_idx", default="accepted")


@contextmanager
def h_idx_for_tests(h_idx: str) -> Generator[None, None, None]:
    """Generations started in the ``with`` block use ``h_idx`` (``DraftParams.h_idx``: ``"last"``
    reproduces the design's regression), a switch for tests, so not a parameter of ``generate``."""
    token = _H_IDX.set(h_idx)
    try:
        yield
    finally:
        _H_IDX.reset(token)


def draft_params(draft_n_max: int | None = None, depth2: bool | None = None, skip_streak: int | None = None,
                 preset: str | None = None, h_idx: str = "accepted", ignore_eos: bool = False,
                 cache_prompt: bool = DraftParams.cache_prompt) -> DraftParams:
    """The drafting settings of a generation: what is given, else the environment's
    (``LLAMA_PIPELINE_DEPTH2``, ``LLAMA_MTP_SKIP_STREAK_THRESHOLD``), else the preset's. A
    ``draft_n_max`` given without a preset is a fixed count; with the ``auto`` preset, its ceiling."""
    base = resolve_preset(preset)
    opts = DraftParams(
        draft_n_max=base.draft_n_max if draft_n_max is None else draft_n_max,
        auto=base.auto and (draft_n_max is None or preset is not None),
        depth2=env_depth2() if depth2 is None else bool(depth2),
        graph_greedy=env_graph_greedy(),
        skip_streak=env_skip_streak(base.skip_streak) if skip_streak is None else skip_streak,
        h_idx=h_idx,
        ignore_eos=bool(ignore_eos),
        cache_prompt=bool(cache_prompt),
    )
    opts.validate()
    return opts


def sampling_params(base: SamplingParams | None = None, **given: Any) -> SamplingParams:
    """``base`` (default: :class:`SamplingParams`' defaults) with the settings in ``given`` that
    are not None."""
    chosen = {name: value for name, value in given.items() if value is not None}
    # without a base, one object built and checked, not the defaults' and then their copy
    return SamplingParams(**chosen) if base is None else dataclasses.replace(base, **chosen)


# generate's typed faces: stream=False gives a result, stream=True a stream of pieces, a bool either
# (the implementation, with the documentation, follows them)
@overload
def generate(
    model: LlamaModel, prompt: str | Sequence[int], *, max_tokens: int = 128, temperature: float | None = None,
    top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
    repeat_penalty: float | None = None, repeat_last_n: int | None = None, presence_penalty: float | None = None,
    frequency_penalty: float | None = None, seed: int | None = None, logit_bias: dict[int, float] | None = None,
    typical_p: float | None = None, top_n_sigma: float | None = None, xtc_probability: float | None = None,
    xtc_threshold: float | None = None, dry_multiplier: float | None = None, dry_base: float | None = None,
    dry_allowed_length: int | None = None, dry_penalty_last_n: int | None = None,
    dry_sequence_breakers: Sequence[str] | None = None, sampling: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None, speculative: SpeculativeParams | None = None,
    draft_n_max: int | None = None, preset: str | None = None, depth2: bool | None = None,
    skip_streak: int | None = None, trace: str | os.PathLike[str] | IO[str] | None = None,
    cancel: Callable[[], bool] | None = None, prompt_progress: Callable[[int, int], None] | None = None,
    context: LlamaContext | None = None, add_special: bool = TEXT_TOKENIZE["add_special"],
    parse_special: bool = TEXT_TOKENIZE["parse_special"], ignore_eos: bool = False, logprobs: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt, grammar: Grammar | str | None = None,
    json_schema: dict[str, Any] | str | None = None, special_tokens: Collection[int] = (),
    stream: Literal[False] = False,
) -> GenerationResult: ...


@overload
def generate(
    model: LlamaModel, prompt: str | Sequence[int], *, max_tokens: int = 128, temperature: float | None = None,
    top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
    repeat_penalty: float | None = None, repeat_last_n: int | None = None, presence_penalty: float | None = None,
    frequency_penalty: float | None = None, seed: int | None = None, logit_bias: dict[int, float] | None = None,
    typical_p: float | None = None, top_n_sigma: float | None = None, xtc_probability: float | None = None,
    xtc_threshold: float | None = None, dry_multiplier: float | None = None, dry_base: float | None = None,
    dry_allowed_length: int | None = None, dry_penalty_last_n: int | None = None,
    dry_sequence_breakers: Sequence[str] | None = None, sampling: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None, speculative: SpeculativeParams | None = None,
    draft_n_max: int | None = None, preset: str | None = None, depth2: bool | None = None,
    skip_streak: int | None = None, trace: str | os.PathLike[str] | IO[str] | None = None,
    cancel: Callable[[], bool] | None = None, prompt_progress: Callable[[int, int], None] | None = None,
    context: LlamaContext | None = None, add_special: bool = TEXT_TOKENIZE["add_special"],
    parse_special: bool = TEXT_TOKENIZE["parse_special"], ignore_eos: bool = False, logprobs: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt, grammar: Grammar | str | None = None,
    json_schema: dict[str, Any] | str | None = None, special_tokens: Collection[int] = (), stream: Literal[True],
) -> Iterator[TextPiece]: ...


@overload
def generate(
    model: LlamaModel, prompt: str | Sequence[int], *, max_tokens: int = 128, temperature: float | None = None,
    top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
    repeat_penalty: float | None = None, repeat_last_n: int | None = None, presence_penalty: float | None = None,
    frequency_penalty: float | None = None, seed: int | None = None, logit_bias: dict[int, float] | None = None,
    typical_p: float | None = None, top_n_sigma: float | None = None, xtc_probability: float | None = None,
    xtc_threshold: float | None = None, dry_multiplier: float | None = None, dry_base: float | None = None,
    dry_allowed_length: int | None = None, dry_penalty_last_n: int | None = None,
    dry_sequence_breakers: Sequence[str] | None = None, sampling: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None, speculative: SpeculativeParams | None = None,
    draft_n_max: int | None = None, preset: str | None = None, depth2: bool | None = None,
    skip_streak: int | None = None, trace: str | os.PathLike[str] | IO[str] | None = None,
    cancel: Callable[[], bool] | None = None, prompt_progress: Callable[[int, int], None] | None = None,
    context: LlamaContext | None = None, add_special: bool = TEXT_TOKENIZE["add_special"],
    parse_special: bool = TEXT_TOKENIZE["parse_special"], ignore_eos: bool = False, logprobs: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt, grammar: Grammar | str | None = None,
    json_schema: dict[str, Any] | str | None = None, special_tokens: Collection[int] = (), stream: bool,
) -> GenerationResult | Iterator[TextPiece]: ...


def generate(
    model: LlamaModel,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 128,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repeat_penalty: float | None = None,
    repeat_last_n: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    seed: int | None = None,
    logit_bias: dict[int, float] | None = None,
    typical_p: float | None = None,
    top_n_sigma: float | None = None,
    xtc_probability: float | None = None,
    xtc_threshold: float | None = None,
    dry_multiplier: float | None = None,
    dry_base: float | None = None,
    dry_allowed_length: int | None = None,
    dry_penalty_last_n: int | None = None,
    dry_sequence_breakers: Sequence[str] | None = None,
    sampling: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None,
    speculative: SpeculativeParams | None = None,
    draft_n_max: int | None = None,
    preset: str | None = None,
    depth2: bool | None = None,
    skip_streak: int | None = None,
    trace: str | os.PathLike[str] | IO[str] | None = None,
    cancel: Callable[[], bool] | None = None,
    prompt_progress: Callable[[int, int], None] | None = None,
    context: LlamaContext | None = None,
    add_special: bool = TEXT_TOKENIZE["add_special"],
    parse_special: bool = TEXT_TOKENIZE["parse_special"],
    ignore_eos: bool = False,
    logprobs: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt,
    grammar: Grammar | str | None = None,
    json_schema: dict[str, Any] | str | None = None,
    special_tokens: Collection[int] = (),
    stream: bool = False,
) -> GenerationResult | Iterator[TextPiece]:
    """Generate a continuation of ``prompt`` (text or token ids).

    ``max_tokens``: at most this many tokens (-1: until end of text or a full context, llama.cpp's ``-n -1``).
    Sampling: ``temperature`` (0 = greedy), ``top_k`` (0 or -1: all), ``top_p``, ``min_p``,
    ``repeat_penalty`` over the last ``repeat_last_n`` tokens (-1: the whole context),
    ``presence_penalty``, ``frequency_penalty``, ``seed`` (None or -1: a fresh one), ``logit_bias``
    (token id -> added logit), ``typical_p``, ``top_n_sigma``, XTC (``xtc_probability``,
    ``xtc_threshold``) and DRY (``dry_multiplier``, ``dry_base``, ``dry_allowed_length``,
    ``dry_penalty_last_n``, -1: the whole context, ``dry_sequence_breakers``), run in llama-server's
    order through llama.cpp's sampler chain (:mod:`.chain`); each left None takes :class:`~mtp_bindings.config.params.SamplingParams`'
    default -- llama-server's, the same in every front end: temperature 0.8, top_k 40, top_p 0.95,
    min_p 0.05, no penalties; pass ``temperature=0`` for greedy decoding -- or ``sampling``'s value
    when a whole ``SamplingParams`` is given.
    Drafting: ``speculative``, a :class:`~mtp_bindings.config.params.SpeculativeParams` (the four
    settings below in one object; a flat keyword given as well overrides its field), or flat:
    ``preset`` (default ``auto``: each round drafts the count, up to ``draft_n_max``,
    with the most expected tokens/s on this context, see :mod:`.controller`; the others are fixed
    counts, see :mod:`mtp_bindings.config.presets`), or ``draft_n_max`` alone, a fixed count of tokens
    per round (0 = plain decoding; a model without an assistant decodes plainly by default, and a
    ``preset`` or ``draft_n_max > 0`` asked of it raises :class:`NoAssistantError`), ``depth2`` overlap (default on; ``LLAMA_PIPELINE_DEPTH2=0`` turns it
    off), ``skip_streak`` threshold (``LLAMA_MTP_SKIP_STREAK_THRESHOLD``), ``trace`` (a path, a
    file, or ``LLAMA_MTP_ACC_TRACE``). Output is lossless: the same distribution as plain
    sampling, and at temperature 0 the same tokens as plain greedy decoding.

    Returns a :class:`GenerationResult`, or with ``stream=True`` an iterator of
    :class:`TextPiece` whose last item carries the stats. ``cancel()`` returning True stops the
    generation (finish_reason ``cancelled``, checked between rounds and between batches of the
    prompt); so does closing the stream. ``prompt_progress(done, total)`` is called after each
    batch of the prompt (tokens processed, prompt tokens). ``ignore_eos`` keeps generating through
    end-of-generation tokens (benchmarks, load tests). A generation that stops because the context
    is full has finish_reason ``length`` and ``stats.hit_context_limit`` set.
    ``logprobs=k`` (0..20) adds each token's log-probability and its ``k`` most likely
    alternatives (:class:`~.logprobs.TokenLogprob`: the target's own distribution, before
    ``logit_bias``, penalties and temperature; the same with and without drafting) to the result's
    and each piece's ``logprobs``; None (default) computes none.
    ``cache_prompt`` (default on, as llama-server's): on a kept ``context``, keep the KV of the
    longest common token prefix with what its last generation left there and decode only the rest
    (always at least the prompt's last token); ``stats.n_prompt_cached`` says how many were kept.
    Structured output (needs ``llguidance``, the ``structured`` extra): ``json_schema`` (a dict or
    a JSON string) or ``grammar`` (GBNF or Lark text, or a :class:`~.constraint.Grammar`, e.g.
    ``Grammar.json_object()``) constrains every token, drafted or not, so the text follows it;
    the generation stops (finish_reason ``stop``) when it is complete. Exact: a constrained
    generation with drafting gives what it gives without (at temperature 0 the same tokens).
    An invalid schema or grammar raises :class:`InvalidParameterError` naming the problem.
    Contexts: ``context`` (one of ``model.create_context()``) is used by this generation alone from
    its first token to its end, a stream suspended between pieces included; another generation asked
    of it meanwhile waits its turn if the owner is another thread's whole (non-stream) generation, and
    raises :class:`~mtp_bindings.exceptions.ContextBusyError` at once if the owner is a stream or on
    the same thread (a wait there could be endless). Without ``context`` the model lends one of its pool (an idle one, else a fresh one; see
    :meth:`~mtp_bindings.llama_model.LlamaModel.generation_context`), so overlapping generations -- two
    streams zipped, a stream kept in a variable while another thread generates -- each get their
    own, neither waits nor disturbs the other. Its size is the model's ``n_ctx`` setting
    (``Model(path, n_ctx=8192)``); a prompt that does not fit raises :class:`ContextOverflowError`.
    ``special_tokens``: token ids whose text the output shows even when they are control tokens
    (which render as nothing otherwise); ``chat`` passes a chat format's markers.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < UNTIL_FULL:
        raise InvalidParameterError(f"max_tokens must be a non-negative int or -1 (until the context is full), "
                                    f"got {max_tokens!r}")
    if not isinstance(prompt, (str, Sequence, np.ndarray)) or isinstance(prompt, (bytes, bytearray)):
        raise InvalidParameterError(f"prompt must be a str or a sequence of token ids, got {type(prompt).__name__}")
    sp = sampling_params(sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                         repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                         presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed,
                         logit_bias=logit_bias, typical_p=typical_p, top_n_sigma=top_n_sigma,
                         xtc_probability=xtc_probability, xtc_threshold=xtc_threshold,
                         dry_multiplier=dry_multiplier, dry_base=dry_base, dry_allowed_length=dry_allowed_length,
                         dry_penalty_last_n=dry_penalty_last_n,
                         dry_sequence_breakers=dry_sequence_breakers)
    logit_bias = sp.logit_bias
    spec = speculative or SpeculativeParams()
    draft_n_max = spec.draft_n_max if draft_n_max is None else draft_n_max
    preset = spec.preset if preset is None else preset
    opts = draft_params(draft_n_max, spec.depth2 if depth2 is None else depth2,
                        spec.skip_streak if skip_streak is None else skip_streak, preset, _H_IDX.get(), ignore_eos,
                        cache_prompt)
    if ((draft_n_max or 0) > 0 or (preset is not None and draft_n_max != 0)) and not model.has_assistant:
        # asked for by name: decoding plainly instead would hide a missing or forgotten assistant
        raise NoAssistantError(f"drafting was asked for ({'preset=' + repr(preset) if preset is not None else ''}"
                               f"{'draft_n_max=' + str(draft_n_max) if preset is None else ''}) but {model.path.name} "
                               "has no MTP assistant: load it with Model(target, assistant=...), or leave preset "
                               "and draft_n_max out (or draft_n_max=0) to decode plainly")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or not 0 <= logprobs <= TOP_LOGPROBS_MAX):
        raise InvalidParameterError(f"logprobs must be an int in 0..{TOP_LOGPROBS_MAX} or None, got {logprobs!r}")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) for s in stops):
        raise InvalidParameterError("stop must be a string or a list of strings")
    if logit_bias and any(isinstance(t, int) and not 0 <= t < model.n_vocab for t in logit_bias):
        raise InvalidParameterError(f"logit_bias token ids must be in [0, {model.n_vocab})")
    if isinstance(prompt, str):
        tokens = model.tokenize(prompt, add_special=add_special, parse_special=parse_special)
    else:
        tokens = model.check_tokens(list(prompt)).tolist()
    if not tokens:
        raise InvalidParameterError("the prompt is empty")
    compiled = as_grammar(grammar, json_schema)
    n_ctx = model.generation_n_ctx if context is None else context.n_ctx
    if len(tokens) >= n_ctx:
        more = f"Model(..., n_ctx=...) sets the contexts generate and chat make (the model was trained on " \
               f"{model.n_ctx_train})" if context is None else "model.create_context(n_ctx=...) makes a longer one"
        raise ContextOverflowError(f"the prompt has {len(tokens)} tokens; the context holds {n_ctx}: {more}")
    sp = sp.resolved(n_ctx)
    if max_tokens == UNTIL_FULL:
        max_tokens = n_ctx - len(tokens)
    it = generation_pieces(model, context, tokens, sp, max_tokens, stops, opts,
                           env_trace() if trace is None else trace, cancel, prompt_progress,
                           None if logprobs is None else LogprobRecorder(logprobs, model.token_to_piece),
                           None if compiled is None else TokenConstraint(model, compiled), special_tokens, stream)
    if stream:
        return it
    pieces = list(it)
    last = pieces[-1]
    assert last.stats is not None and last.finish_reason is not None
    return GenerationResult(text="".join(pieces), tokens=[t for p in pieces for t in p.tokens],
                            stats=last.stats, finish_reason=last.finish_reason,
                            logprobs=None if logprobs is None else [lp for p in pieces for lp in p.logprobs or []])
