"""llama-server's native completion endpoint, ``POST /completion`` (and its alias
``/completions``), in llama-server's request and response shapes.

One job: the request model and the bodies of this route. The request takes the generation
fields every route shares and the one prompt (:class:`~.schemas.PromptRequest`: text, token ids,
or one text in a list) plus llama-server's ``n_probs`` (alternatives per token: its
``completion_probabilities``; ``logprobs`` is its alias, as there) and ``return_tokens``. The
whole response is llama-server's final result (``content``, ``tokens``, ``id_slot``, ``stop``,
``model``, ``tokens_predicted``, ``tokens_evaluated``, ``generation_settings``, ``prompt``,
``has_new_line``, ``truncated``, ``stop_type``, ``stopping_word``, ``tokens_cached``,
``timings``); a stream is ``data: {partial}`` lines (``content``, ``tokens``, ``stop: false``, ...)
and then the final result with empty ``content``, and no ``[DONE]``, as llama-server sends them.
``tokens`` and ``completion_probabilities`` hold the tokens of the returned text
(:mod:`.accounting`); ``tokens_predicted`` counts them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from ..config.params import LOGPROBS_MAX
from .accounting import TextTokens
from .errors import generation_error
from .handlers import Server
from .prompts import completion_tokens
from .responses import timings
from .schemas import PromptRequest
from .slots import END, Job
from .streaming import JobStreamingResponse, sse

if TYPE_CHECKING:
    from ..generation.logprobs import TokenLogprob


class NativeCompletionRequest(PromptRequest):
    """``/completion``'s body (llama-server's field names)."""

    n_probs: int | None = Field(None, ge=0, le=LOGPROBS_MAX)
    logprobs: int | None = Field(None, ge=0, le=LOGPROBS_MAX)  # n_probs' alias in llama-server
    return_tokens: bool | None = None

    def requested_logprobs(self) -> int | None:
        n = self.n_probs if self.n_probs is not None else self.logprobs
        return n or None  # llama-server: 0 is none


def _token(model: Any, token: int, logprob: float) -> dict[str, Any]:
    raw = model.token_to_piece(token)
    return {"id": token, "token": raw.decode("utf-8", errors="ignore"), "bytes": list(raw), "logprob": logprob}


def probabilities(model: Any, lps: list[TokenLogprob]) -> list[dict[str, Any]]:
    """llama-server's ``completion_probabilities``: each token with its alternatives."""
    return [{**_token(model, lp.token, lp.logprob), "top_logprobs": [_token(model, t, v) for t, v in lp.top]}
            for lp in lps]


def generation_settings(server: Server, req: NativeCompletionRequest, job: Job) -> dict[str, Any]:
    """What the request was generated with, in llama-server's names."""
    kw = job.kwargs
    stop = kw["stop"]
    return {"n_predict": kw["max_tokens"], "max_tokens": kw["max_tokens"], "seed": -1 if kw["seed"] is None else
            kw["seed"], "temperature": kw["temperature"], "top_k": kw["top_k"], "top_p": kw["top_p"],
            "min_p": kw["min_p"], "repeat_last_n": kw["repeat_last_n"], "repeat_penalty": kw["repeat_penalty"],
            "presence_penalty": kw["presence_penalty"], "frequency_penalty": kw["frequency_penalty"],
            "stop": [stop] if isinstance(stop, str) else list(stop or []), "stream": bool(req.stream),
            "n_probs": req.requested_logprobs() or 0, "ignore_eos": False, "cache_prompt": kw["cache_prompt"],
            "speculative.n_max": kw["draft_n_max"] if kw["draft_n_max"] is not None else
            server.props()["default_generation_settings"]["params"]["speculative.n_max"]}


class NativeReply:
    """One ``/completion`` response under way: its request, job and token accounting."""

    def __init__(self, server: Server, req: NativeCompletionRequest, job: Job, ledger: TextTokens) -> None:
        self.server, self.req, self.job, self.ledger = server, req, job, ledger
        self.has_new_line = False  # a stream's: whether any chunk had a newline

    def _counts(self) -> dict[str, Any]:
        return {"id_slot": self.job.slot, "tokens_predicted": self.ledger.n_kept,
                "tokens_evaluated": len(self.job.tokens)}

    def partial(self, text: str, tokens: list[int], lps: list[TokenLogprob]) -> dict[str, Any]:
        body: dict[str, Any] = {"index": 0, "content": text, "tokens": tokens if self.req.return_tokens else [],
                                "stop": False, **self._counts()}
        if lps:
            body["completion_probabilities"] = probabilities(self.server.model, lps)
        return body

    def final(self, text: str, stats: Any, finish_reason: str | None, lps: list[TokenLogprob]) -> dict[str, Any]:
        """llama-server's final result (``text`` "" for a stream, whose chunks had it)."""
        stop = self.job.kwargs["stop"]
        word = self.ledger.stopping_word([stop] if isinstance(stop, str) else list(stop or []))
        stop_type = "word" if word else "limit" if finish_reason == "length" else \
            "eos" if finish_reason == "stop" else "none"
        body: dict[str, Any] = {
            "index": 0, "content": text,
            "tokens": self.ledger.tokens if self.req.return_tokens and not self.req.stream else [],
            **self._counts(), "stop": True, "model": self.server.model_name,
            "generation_settings": generation_settings(self.server, self.req, self.job),
            "prompt": self.server.model.detokenize(self.job.tokens, special=True),
            "has_new_line": "\n" in text if not self.req.stream else self.has_new_line,
            "truncated": False, "stop_type": stop_type, "stopping_word": word,
            "tokens_cached": stats.n_prompt + stats.n_generated, "timings": timings(stats),
        }
        if lps and not self.req.stream:
            body["completion_probabilities"] = probabilities(self.server.model, lps)
        return body


async def native_completion(server: Server, request: Request) -> Response:
    """``POST /completion``: generate and answer in llama-server's shape, whole or streamed."""
    req: NativeCompletionRequest = await server.read_body(request, NativeCompletionRequest)
    tokens = await server.tokens(lambda: completion_tokens(server.model, req.prompt), "prompt")
    job, first, ledger = await server.start(request, req, tokens)
    reply = NativeReply(server, req, job, ledger)
    try:
        if req.stream:
            return JobStreamingResponse(_events(reply, first), job)
        pieces, lps = await server.gather(job, request, first, ledger)
        last = pieces[-1]
        return JSONResponse(reply.final("".join(pieces), last.stats, last.finish_reason, lps))
    except BaseException:
        server.pool.cancel(job)
        raise


async def _events(reply: NativeReply, first: Any) -> AsyncIterator[bytes]:
    """``data: {partial}`` per piece, then ``data: {final}``; an error is ``data: {"error": ...}``."""
    job, ledger, item = reply.job, reply.ledger, first
    while item is not END:
        if isinstance(item, Exception):
            yield sse((job.error or generation_error(item)).body())
            return
        n_before = len(ledger.tokens)
        lps = ledger.feed(str(item), item.tokens, item.logprobs)
        if item.stats is not None:
            lps += ledger.finish()
        reply.has_new_line = reply.has_new_line or "\n" in item
        if item or lps or len(ledger.tokens) > n_before:
            yield sse(reply.partial(str(item), ledger.tokens[n_before:], lps))
        if item.stats is not None:
            if job.error is not None:
                yield sse(job.error.body())
                return
            yield sse(reply.final("", item.stats, item.finish_reason, []))
        item = await job.items.get()
