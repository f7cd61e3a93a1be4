"""The generation driver: plain or MTP-speculative decoding, lossless at any temperature.

One loop serves both: each round drafts ``k`` tokens (``k = 0`` without an assistant, with
``draft_n_max=0``, or on a skip-streak round), verifies ``[last token] + drafts`` in one target
decode, keeps the accepted prefix (exact speculative sampling, see :mod:`.sampling`), rolls the
KV back past it, and continues from the hidden state of the *last accepted* token (the design's
``h_idx`` correction). With ``depth2`` the next round's MTP request is submitted right after
accept/rollback and waited for lazily at the next draft, so drafting overlaps whatever the caller
does with the tokens in between (detokenizing, stop strings, streaming).

Drafters follow one small protocol (:class:`Drafter`), like transformers' candidate generators.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np

from .exceptions import ContextOverflowError, InvalidParameterError
from .presets import resolve_preset
from .sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from .context import Context
    from .model import Model

ENV_DEPTH2 = "LLAMA_PIPELINE_DEPTH2"
ENV_SKIP_STREAK = "LLAMA_MTP_SKIP_STREAK_THRESHOLD"
ENV_TRACE = "LLAMA_MTP_ACC_TRACE"


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------

@dataclass
class GenerationStats:
    """What one generation did and how long it took (seconds)."""

    n_prompt: int = 0
    n_generated: int = 0
    n_rounds: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    n_skipped_rounds: int = 0
    hit_eog: bool = False
    hit_context_limit: bool = False  # stopped because the context was full, before max_tokens
    t_prompt: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_sample: float = 0.0
    t_total: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per verify round (accepted drafts + the one sampled token)."""
        return (self.n_generated - 1) / self.n_rounds if self.n_rounds else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def tokens_per_second(self) -> float:
        t = self.t_total - self.t_prompt
        return self.n_generated / t if t > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 acceptance_per_position=self.acceptance_per_position, tokens_per_second=self.tokens_per_second)
        return d


@dataclass
class GenerationResult:
    """The outcome of :func:`generate`: ``finish_reason`` is ``stop`` (EOS or stop string),
    ``length`` (max_tokens or context full) or ``cancelled``."""

    text: str
    tokens: list[int]
    stats: GenerationStats
    finish_reason: str


class TextPiece(str):
    """A streamed piece of text (always whole UTF-8 characters). The last piece of a stream
    carries ``stats`` and ``finish_reason``; earlier ones have them ``None``."""

    tokens: list[int]
    stats: GenerationStats | None
    finish_reason: str | None

    def __new__(cls, text: str, tokens: list[int], stats: GenerationStats | None = None,
                finish_reason: str | None = None) -> TextPiece:
        obj = super().__new__(cls, text)
        obj.tokens = tokens
        obj.stats = stats
        obj.finish_reason = finish_reason
        return obj


# ------------------------------------------------------------------------------------------------
# tracing
# ------------------------------------------------------------------------------------------------

class Tracer:
    """NDJSON acceptance trace (design section 10): ``mtp_draft`` and ``mtp_accept`` events."""

    def __init__(self, sink: IO[str] | None) -> None:
        self.sink = sink
        self._owned = False

    @classmethod
    def open(cls, trace: str | os.PathLike[str] | IO[str] | None) -> Tracer:
        if trace is None:
            trace = os.environ.get(ENV_TRACE) or None
        if trace is None:
            return cls(None)
        if hasattr(trace, "write"):
            return cls(trace)  # type: ignore[arg-type]
        if str(trace) == "1":
            return cls(sys.stderr)
        t = cls(open(trace, "a", encoding="utf-8"))  # noqa: SIM115 (closed in close())
        t._owned = True
        return t

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def event(self, **fields: Any) -> None:
        if self.sink is not None:
            self.sink.write(json.dumps(fields, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self.sink is not None:
            self.sink.flush()
            if self._owned:
                self.sink.close()
        self.sink = None


# ------------------------------------------------------------------------------------------------
# drafters
# ------------------------------------------------------------------------------------------------

class Drafter(Protocol):
    """What the loop needs of a drafting strategy."""

    def propose(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> tuple[list[int], str]:
        """Up to ``n`` draft tokens following ``last_token`` and the path taken (for the trace)."""

    def prepare_next(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> None:
        """Start drafting the next round ahead of time (depth-2); a no-op where unsupported."""

    def cancel(self) -> None:
        """Drop any work in flight (before destructive KV edits, at the end of a request)."""


class NoDrafter:
    """Plain decoding: never drafts."""

    def propose(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> tuple[list[int], str]:
        return [], "none"

    def prepare_next(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> None:
        pass

    def cancel(self) -> None:
        pass


class MTPDrafter:
    """Drafts with the model's MTP assistant through the async C API."""

    def __init__(self, ctx: Context, seq_id: int = 0, depth2: bool = True) -> None:
        from .mtp import state_of

        self.state = state_of(ctx)
        self.seq_id = seq_id
        self.depth2 = depth2
        self.pending: Any = None
        self.pending_key: tuple[int, int, int] | None = None

    def propose(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> tuple[list[int], str]:
        assert h is not None
        if self.pending is not None:
            if self.pending_key == (attn_pos, last_token, n):
                drafts, _ = self.pending.wait()
                self.pending = None
                return drafts.tolist(), "lazy"
            self.cancel()  # n_steps (or the round) changed: drain and draft synchronously
        drafts, _ = self.state.submit(self.seq_id, attn_pos, last_token, h, n).wait()
        return drafts.tolist(), "sync"

    def prepare_next(self, attn_pos: int, last_token: int, h: np.ndarray | None, n: int) -> None:
        if not self.depth2 or n <= 0 or h is None:
            return
        self.cancel()
        self.pending = self.state.submit(self.seq_id, attn_pos, last_token, h, n)
        self.pending_key = (attn_pos, last_token, n)

    def cancel(self) -> None:
        if self.pending is not None:
            self.state.discard()
            self.pending = None
            self.pending_key = None


class SkipStreak:
    """Adaptive skip (design section 9): after ``threshold`` rounds in a row with zero accepted
    drafts, skip drafting for one round. A skipped round never counts towards the next streak
    (``last_was_skip``), so threshold 1 alternates instead of skipping forever."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.streak = 0
        self.last_was_skip = False

    def will_skip(self) -> bool:
        """Whether the next round skips (without changing state)."""
        return self.threshold > 0 and not self.last_was_skip and self.streak >= self.threshold

    def should_skip(self) -> bool:
        """Decide the round about to start: True means draft nothing this round."""
        skip = self.will_skip()
        if skip:
            self.streak = 0
        self.last_was_skip = skip
        return skip

    def record(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted == 0:
            return
        self.streak = self.streak + 1 if n_accepted == 0 else 0


# ------------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------------

@dataclass
class DriverOptions:
    """Knobs of the speculative loop (see the README's table)."""

    draft_n_max: int = 3
    depth2: bool = True
    skip_streak: int = 0
    h_idx: str = "accepted"  # "last" reproduces the design's regression (tests only)
    ignore_eos: bool = False

    def validate(self) -> None:
        if isinstance(self.draft_n_max, bool) or not isinstance(self.draft_n_max, int) or not 0 <= self.draft_n_max <= 16:
            raise InvalidParameterError(f"draft_n_max must be an int in 0..16, got {self.draft_n_max!r}")
        if isinstance(self.skip_streak, bool) or not isinstance(self.skip_streak, int) or not 0 <= self.skip_streak <= 32:
            raise InvalidParameterError(f"skip_streak threshold must be an int in 0..32, got {self.skip_streak!r}")
        if self.h_idx not in ("accepted", "last"):
            raise InvalidParameterError(f"h_idx must be 'accepted' or 'last', got {self.h_idx!r}")


PromptProgress = Callable[[int, int], "bool | None"]


def token_rounds(ctx: Context, prompt: Sequence[int], sampler: Sampler, max_tokens: int, opts: DriverOptions,
                 stats: GenerationStats, tracer: Tracer, seq_id: int = 0,
                 prompt_progress: PromptProgress | None = None) -> Iterator[list[int]]:
    """Yield the tokens each round produces (first the token sampled after the prompt).

    Stops at ``max_tokens``, at an end-of-generation token (not yielded) or when the context is
    full (``stats.hit_context_limit``); the caller may stop early by closing the generator. Any
    MTP work is drained on exit. ``prompt_progress(done, total)`` is called after each batch of the
    prompt; returning False stops before anything is generated.
    """
    model = ctx.model
    drafting = opts.draft_n_max > 0 and model.has_assistant
    drafter: Drafter = MTPDrafter(ctx, seq_id, opts.depth2) if drafting else NoDrafter()
    skip = SkipStreak(opts.skip_streak)
    history = list(prompt)
    n_ctx = ctx.n_ctx
    try:
        t0 = time.perf_counter()
        ctx.adapt_threads()
        ctx.seq_rm(seq_id, 0, -1)
        # With embeddings on, llama.cpp outputs every row of a batch: only the last prompt token's h is
        # needed, so the rest of the prompt is processed without them. Plain decoding splits the prompt
        # the same way: a batch and a single-token decode may round a near-tie differently, and greedy
        # output must not depend on whether drafting is on.
        if len(history) > 1:
            ctx.set_embeddings(False)
            if not _decode_prompt(ctx, history[:-1], seq_id, prompt_progress):
                return
        ctx.set_embeddings(drafting)
        ctx.decode(history[-1:], pos=len(history) - 1, seq_id=seq_id)
        stats.t_prompt = time.perf_counter() - t0
        t = time.perf_counter()
        x = sampler.sample(ctx.logits_view(-1), history)
        stats.t_sample += time.perf_counter() - t
        h = ctx.get_embeddings(-1) if drafting else None
        attn_pos = len(history) - 1
        if model.is_eog(x) and not opts.ignore_eos:
            stats.hit_eog = True
            return
        history.append(x)
        stats.n_generated = 1
        k_next = _plan(opts.draft_n_max if drafting else 0, max_tokens - 1, attn_pos, n_ctx)
        drafter.prepare_next(attn_pos, x, h, k_next)
        yield [x]
        it = 0
        while stats.n_generated < max_tokens and attn_pos + 2 <= n_ctx:
            k = _plan(opts.draft_n_max if drafting else 0, max_tokens - stats.n_generated, attn_pos, n_ctx)
            path = "none"
            drafts: list[int] = []
            t = time.perf_counter()
            if k > 0 and skip.should_skip():
                drafter.cancel()
                path = "skip-streak"
                stats.n_skipped_rounds += 1
            elif k > 0:
                drafts, path = drafter.propose(attn_pos, x, h, k)
            elif drafting:
                drafter.cancel()
                path = "skip-nsteps"
            stats.t_draft += time.perf_counter() - t
            if tracer.enabled and drafting:
                tracer.event(event="mtp_draft", iter=it, path=path, seq_id=seq_id, id_last=x,
                             h_idx=opts.h_idx, attn_pos=attn_pos, n_steps=len(drafts),
                             h_l2=float(np.linalg.norm(h)) if h is not None else 0.0, drafts=drafts)

            t = time.perf_counter()
            batch = [x] + drafts
            ctx.decode(batch, pos=attn_pos + 1, seq_id=seq_id, logits="all")
            rows = [ctx.logits_view(i) for i in range(len(batch))]  # no copies: read before the next decode
            stats.t_verify += time.perf_counter() - t

            t = time.perf_counter()
            n_acc, y = sampler.verify(rows, drafts, history)
            stats.t_sample += time.perf_counter() - t
            # Re-read the load for the next decode here: the drafting worker and the compute threads are idle,
            # and the reader of the last yielded piece (woken a whole decode ago) is asleep again. Read just
            # after a yield, that reader is almost always running and looks like load.
            ctx.adapt_threads()
            if n_acc < len(drafts):
                ctx.seq_rm(seq_id, attn_pos + 2 + n_acc, -1)
            if drafting:
                h = ctx.get_embeddings(n_acc if opts.h_idx == "accepted" else len(batch) - 1)
            attn_pos += 1 + n_acc
            accepted = drafts[:n_acc] + [y]
            _count(stats, len(drafts), n_acc)
            skip.record(len(drafts), n_acc)
            if tracer.enabled and drafting:
                tracer.event(event="mtp_accept", iter=it, n_accepted=n_acc, n_drafted_prev=len(drafts))
            it += 1

            eog = None if opts.ignore_eos else next((i for i, tok in enumerate(accepted) if model.is_eog(tok)), None)
            if eog is not None:
                accepted = accepted[:eog]
            history.extend(accepted)
            stats.n_generated += len(accepted)
            if eog is not None:
                stats.hit_eog = True
                if accepted:
                    yield accepted
                return
            x = y
            if stats.n_generated < max_tokens:
                k_next = _plan(opts.draft_n_max if drafting else 0, max_tokens - stats.n_generated, attn_pos, n_ctx)
                if not skip.will_skip():
                    drafter.prepare_next(attn_pos, x, h, k_next)
            yield accepted
        stats.hit_context_limit = stats.n_generated < max_tokens
    finally:
        drafter.cancel()


def _decode_prompt(ctx: Context, tokens: list[int], seq_id: int, progress: PromptProgress | None) -> bool:
    """Decode the prompt (no outputs) batch by batch, as :meth:`Context.decode` splits it, telling
    ``progress`` after each batch: a long prompt takes a while, and a caller may show it or stop.
    False when ``progress`` asked to stop."""
    if progress is None:
        ctx.decode(tokens, pos=0, seq_id=seq_id, logits="none")
        return True
    step = ctx.n_batch
    for start in range(0, len(tokens), step):
        ctx.decode(tokens[start:start + step], pos=start, seq_id=seq_id, logits="none")
        if progress(min(start + step, len(tokens)), len(tokens)) is False:
            return False
    return True


def _plan(draft_n_max: int, remaining: int, attn_pos: int, n_ctx: int) -> int:
    """Drafts for the next round: never past max_tokens (the round adds k + 1) or the context."""
    return max(0, min(draft_n_max, remaining - 1, n_ctx - attn_pos - 2))


def _count(stats: GenerationStats, n_drafted: int, n_acc: int) -> None:
    stats.n_rounds += 1
    stats.n_drafted += n_drafted
    stats.n_accepted += n_acc
    while len(stats.drafted_per_position) < n_drafted:
        stats.drafted_per_position.append(0)
        stats.accepted_per_position.append(0)
    for i in range(n_drafted):
        stats.drafted_per_position[i] += 1
        if i < n_acc:
            stats.accepted_per_position[i] += 1


# ------------------------------------------------------------------------------------------------
# text assembly (UTF-8 boundaries, stop strings)
# ------------------------------------------------------------------------------------------------

class TextAssembler:
    """Turns tokens into text pieces: whole UTF-8 characters only, and text that could be the
    start of a stop string is held back until it is known not to be one."""

    def __init__(self, model: Model, stop: Sequence[str]) -> None:
        self.model = model
        self.stop = [s for s in stop if s]
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""
        self.text = ""
        self.stopped = False

    def feed(self, tokens: Sequence[int]) -> str:
        """Add tokens; returns the text now safe to emit (may be empty)."""
        raw = b"".join(self.model.token_to_piece(t) for t in tokens)
        self.pending += self.decoder.decode(raw)
        if self.stop:
            hits = [(self.pending.find(s), s) for s in self.stop]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                i = min(hits)[0]
                out = self.pending[:i]
                self.pending = ""
                self.stopped = True
                self.text += out
                return out
            keep = max((_overlap(self.pending, s) for s in self.stop), default=0)
        else:
            keep = 0
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        self.text += out
        return out

    def flush(self) -> str:
        if self.stopped:
            return ""
        out = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        self.text += out
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


# ------------------------------------------------------------------------------------------------
# public entry points
# ------------------------------------------------------------------------------------------------

def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise InvalidParameterError(f"{name}={v!r} is not an integer") from None


def _driver_options(model: Model, draft_n_max: int | None, depth2: bool | None, skip_streak: int | None,
                    preset: str | None, h_idx: str) -> DriverOptions:
    base = resolve_preset(preset)
    opts = DriverOptions(
        draft_n_max=base.draft_n_max if draft_n_max is None else draft_n_max,
        depth2=(os.environ.get(ENV_DEPTH2, "1") != "0") if depth2 is None else bool(depth2),
        skip_streak=_env_int(ENV_SKIP_STREAK, base.skip_streak) if skip_streak is None else skip_streak,
        h_idx=h_idx,
    )
    opts.validate()
    return opts


def generate(
    model: Model,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 40,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repeat_penalty: float = 1.0,
    repeat_last_n: int = 64,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    seed: int | None = None,
    logit_bias: dict[int, float] | None = None,
    stop: str | Sequence[str] | None = None,
    draft_n_max: int | None = None,
    preset: str | None = None,
    depth2: bool | None = None,
    skip_streak: int | None = None,
    trace: str | os.PathLike[str] | IO[str] | None = None,
    stream: bool = False,
    cancel: Callable[[], bool] | None = None,
    prompt_progress: Callable[[int, int], None] | None = None,
    context: Context | None = None,
    add_special: bool = True,
    parse_special: bool = False,
    h_idx: str = "accepted",
    ignore_eos: bool = False,
) -> GenerationResult | Iterator[TextPiece]:
    """Generate a continuation of ``prompt`` (text or token ids).

    Sampling: ``temperature`` (0 = greedy), ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``
    over the last ``repeat_last_n`` tokens, ``presence_penalty``, ``frequency_penalty``, ``seed``,
    ``logit_bias`` (token id -> added logit).
    Drafting: ``draft_n_max`` tokens per round (0 = plain decoding; default from ``preset``,
    see :mod:`.presets`), ``depth2`` overlap (default on; ``LLAMA_PIPELINE_DEPTH2=0`` turns it
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
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidParameterError(f"max_tokens must be a non-negative int, got {max_tokens!r}")
    if not isinstance(prompt, (str, Sequence, np.ndarray)) or isinstance(prompt, (bytes, bytearray)):
        raise InvalidParameterError(f"prompt must be a str or a sequence of token ids, got {type(prompt).__name__}")
    sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed,
                        logit_bias=logit_bias)
    opts = _driver_options(model, draft_n_max, depth2, skip_streak, preset, h_idx)
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) for s in stops):
        raise InvalidParameterError("stop must be a string or a list of strings")
    if logit_bias and any(isinstance(t, int) and not 0 <= t < model.n_vocab for t in logit_bias):
        raise InvalidParameterError(f"logit_bias token ids must be in [0, {model.n_vocab})")
    opts.ignore_eos = bool(ignore_eos)
    if isinstance(prompt, str):
        tokens = model.tokenize(prompt, add_special=add_special, parse_special=parse_special)
    else:
        tokens = model.check_tokens(list(prompt)).tolist()
    if not tokens:
        raise InvalidParameterError("the prompt is empty")
    ctx = context if context is not None else model.generation_context()
    if len(tokens) >= ctx.n_ctx:
        raise ContextOverflowError(f"the prompt has {len(tokens)} tokens; the context holds {ctx.n_ctx}")
    it = _pieces(model, ctx, tokens, sp, max_tokens, stops, opts, trace, cancel, prompt_progress)
    if stream:
        return it
    pieces = list(it)
    last = pieces[-1]
    assert last.stats is not None and last.finish_reason is not None
    return GenerationResult(text="".join(pieces), tokens=[t for p in pieces for t in p.tokens],
                            stats=last.stats, finish_reason=last.finish_reason)


def _pieces(model: Model, ctx: Context, prompt: list[int], sp: SamplingParams, max_tokens: int,
            stops: list[str], opts: DriverOptions, trace: Any, cancel: Callable[[], bool] | None,
            prompt_progress: Callable[[int, int], None] | None = None) -> Iterator[TextPiece]:
    stats = GenerationStats(n_prompt=len(prompt))
    tracer = Tracer.open(trace)
    text = TextAssembler(model, stops)
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
    with ctx._lock:
        rounds = token_rounds(ctx, prompt, Sampler(sp), max_tokens, opts, stats, tracer,
                              prompt_progress=watch) if max_tokens > 0 else iter(())
        try:
            for toks in rounds:
                piece = text.feed(toks)
                if text.stopped:
                    finish = "stop"
                    yield TextPiece(piece, toks)
                    break
                if cancel is not None and cancel():
                    finish = "cancelled"
                    yield TextPiece(piece, toks)
                    break
                if piece or toks:
                    yield TextPiece(piece, toks)
            else:
                if stopped_in_prompt:
                    finish = "cancelled"
                elif stats.hit_eog:
                    finish = "stop"
        except GeneratorExit:
            finish = "cancelled"
            raise
        finally:
            if hasattr(rounds, "close"):
                rounds.close()
            tracer.close()
            stats.t_total = time.perf_counter() - t0
    yield TextPiece(text.flush(), [], stats, finish)


def chat(model: Model, messages: Sequence[dict[str, str]], **kwargs: Any) -> GenerationResult | Iterator[TextPiece]:
    """Apply the model's chat template (jinja2) to ``messages`` and generate the reply."""
    from .chat_template import render_chat

    prompt = render_chat(model, messages)
    kwargs.setdefault("add_special", False)
    kwargs.setdefault("parse_special", True)
    return generate(model, prompt, **kwargs)

