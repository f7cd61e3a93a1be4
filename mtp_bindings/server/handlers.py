"""What each route does: the state behind the routes (model, slots, metrics, settings) and the
request handling of every endpoint.

One job: from an HTTP request to a response. A generation request is read and validated
(:mod:`.schemas`), tokenized off the event loop (:mod:`.prompts`), turned into generation
arguments (:mod:`.params`) and queued on the slot pool (:mod:`.slots`); the handler waits for the
first piece (so errors before any output still get their proper status), then answers whole or
streamed (:mod:`.streaming`). A client that disconnects -- while queued, mid-stream, or waiting
for a whole reply -- cancels its generation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from ..chat.template import ChatOptions, reply_markers
from ..exceptions import InvalidParameterError, TokenizeError
from ..config.limits import SERVER_N_PREDICT
from .accounting import TextTokens, token_renderer
from .errors import APIError, ClientGone, generation_error, shutting_down_error
from .metrics import ServerMetrics
from .native_routes import DetokenizeRequest, TokenizeRequest, detokenize_body, props_body, tokenize_body
from .params import DraftDefaults, generation_kwargs
from .prompts import chat_prompt, chat_prompt_tokens, completion_tokens
from .responses import Reply
from .schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest, parse_body
from .slots import END, Job, SlotPool
from .streaming import JobStreamingResponse, events

MAX_BODY_BYTES = 8 * 1024 * 1024
DISCONNECT_POLL_S = 0.2


class Server:
    """The state behind the routes: the model, the slots, the metrics and the settings."""

    def __init__(self, model: Any, *, model_name: str, n_slots: int, n_ctx: int, context_kwargs: Mapping[str, Any],
                 draft: DraftDefaults, n_predict: int = SERVER_N_PREDICT,
                 chat_template: str | None = None) -> None:
        self.model = model
        self.chat_template = chat_template  # overrides the GGUF's (serve --chat-template FILE)
        self.model_name = model_name
        self.n_ctx = n_ctx
        self.n_predict = n_predict
        self.draft = draft
        self.metrics = ServerMetrics(n_slots, model_name)
        self.pool = SlotPool(model, n_slots, context_kwargs, self.metrics)
        self.created = int(time.time())
        self._eog_bias: dict[int, float] | None = None

    # --- helpers --------------------------------------------------------------------------------

    def abort_requests(self) -> None:
        """The server is stopping: cancel every generation and answer every open request with
        :func:`~.errors.shutting_down_error` (called on the event loop, before uvicorn waits for
        them)."""
        self.pool.abort_all(shutting_down_error())

    async def read_body(self, request: Request, model: type[BaseModel]) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")
        return parse_body(raw, model)

    def eog_bias(self) -> dict[int, float]:
        """-inf for every end-of-generation token (looked up once: a scan of the vocabulary)."""
        if self._eog_bias is None:
            self._eog_bias = {t: float("-inf") for t in range(self.model.n_vocab) if self.model.is_eog(t)}
        return self._eog_bias

    async def tokens(self, fn: Callable[[], list[int]], param: str) -> list[int]:
        """Tokenize off the event loop; too long for the context is ``context_length_exceeded``."""
        try:
            toks = await anyio.to_thread.run_sync(fn)
        except (InvalidParameterError, TokenizeError) as e:
            raise APIError(400, str(e), param=param, code="invalid_value") from None
        if not toks:
            raise APIError(400, "the prompt is empty", param=param, code="invalid_value")
        if len(toks) >= self.n_ctx:
            raise APIError(400, f"This model's maximum context length is {self.n_ctx} tokens. However, your "
                                f"prompt has {len(toks)} tokens (and at least one must be generated).",
                           param=param, code="context_length_exceeded")
        return toks

    async def next_item(self, job: Job, request: Request) -> Any:
        """The job's next item, checking every ``DISCONNECT_POLL_S`` (whether or not items keep
        coming) that the client is still there while no response has started."""
        while True:
            now = time.monotonic()
            if now - job.checked_at >= DISCONNECT_POLL_S:
                job.checked_at = now
                if await request.is_disconnected():
                    raise ClientGone
            try:
                return await asyncio.wait_for(job.items.get(), timeout=DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                continue

    # --- the generation endpoints ---------------------------------------------------------------

    async def start(self, request: Request, req: GenerationRequest, tokens: list[int],
                    special: frozenset[int] | tuple[()] = ()) -> tuple[Job, Any, TextTokens]:
        """Queue the generation and wait for its first piece (so errors before any output still
        get their proper status); ``special``: tokens whose text is kept (a chat's markers). A
        client gone before it cancels the job (:class:`ClientGone`, answered 499)."""
        kwargs = generation_kwargs(req, self.draft, len(tokens), self.n_ctx, self.model.n_vocab, self.n_predict)
        grammar = await anyio.to_thread.run_sync(req.requested_grammar)  # compiling a schema can take a while
        if grammar is not None:
            kwargs["grammar"] = grammar
        if special:
            kwargs["special_tokens"] = special
        if req.ignore_eos:  # as llama-server: its logit_bias gets -inf for every end-of-generation token
            kwargs["logit_bias"] = {**(kwargs["logit_bias"] or {}), **await anyio.to_thread.run_sync(self.eog_bias)}
        job = Job(tokens, kwargs, asyncio.get_running_loop())
        self.pool.submit(job)
        try:
            first = await self.next_item(job, request)
            if job.error is not None and (first is END or isinstance(first, Exception)):
                raise job.error
            if isinstance(first, Exception):
                raise generation_error(first)
            if first is END:  # only a job dropped from the queue ends without a piece carrying stats
                raise APIError(500, "the generation produced nothing", type="server_error")
        except BaseException:
            self.pool.cancel(job)
            raise
        return job, first, TextTokens(token_renderer(self.model, special))

    async def run(self, request: Request, req: GenerationRequest, tokens: list[int], reply: Reply,
                  echo: str = "") -> Response:
        """Generate for an OpenAI route and answer streamed or whole."""
        if req.requested_logprobs() is not None:
            reply.piece, reply.offset = self.model.token_to_piece, len(echo)
        # as Model.chat: the reply's control-token markers as text, to be parsed
        special = frozenset(reply_markers(self.model)) if reply.chat else ()
        job, first, ledger = await self.start(request, req, tokens, special)
        try:
            if req.stream:
                return JobStreamingResponse(events(job, first, reply, req.include_usage, echo, ledger), job)
            return await self.collect(job, request, first, reply, echo, ledger)
        except BaseException:
            self.pool.cancel(job)
            raise

    async def gather(self, job: Job, request: Request, first: Any, ledger: TextTokens) -> tuple[list[Any], list[Any]]:
        """Every piece of a whole (non-streamed) reply, and the logprobs of the tokens its text holds."""
        pieces, lps = [], []
        item = first
        while item is not END:
            if isinstance(item, Exception):
                raise job.error or generation_error(item)
            pieces.append(item)
            lps += ledger.feed(str(item), item.tokens, item.logprobs)
            item = await self.next_item(job, request)
        if job.error is not None:
            raise job.error
        lps += ledger.finish()
        assert pieces[-1].stats is not None
        return pieces, lps

    async def collect(self, job: Job, request: Request, first: Any, reply: Reply, echo: str,
                      ledger: TextTokens) -> JSONResponse:
        pieces, lps = await self.gather(job, request, first, ledger)
        last = pieces[-1]
        text = echo + "".join(pieces)
        return JSONResponse(reply.complete(text, last.stats, last.finish_reason,
                                           None if reply.piece is None else lps, ledger.n_kept))

    async def chat_completions(self, request: Request) -> Response:
        req: ChatCompletionRequest = await self.read_body(request, ChatCompletionRequest)
        messages = [m.as_template_message() for m in req.messages]
        options = ChatOptions(req.template_tools(), self.chat_template, req.chat_template_kwargs or {})
        prefix: list[str] = []

        def render() -> list[int]:
            tokens, reply_prefix = chat_prompt_tokens(self.model, messages, options)
            prefix.append(reply_prefix)
            return tokens

        tokens = await self.tokens(render, "messages")
        reply = Reply(chat=True, model_name=self.model_name, tools=req.reads_tool_calls, prefix=prefix[0])
        return await self.run(request, req, tokens, reply)

    async def apply_template(self, request: Request) -> dict[str, Any]:
        """llama-server's ``/apply-template``: a chat request's prompt as the server renders it."""
        req: ChatCompletionRequest = await self.read_body(request, ChatCompletionRequest)
        messages = [m.as_template_message() for m in req.messages]
        options = ChatOptions(req.template_tools(), self.chat_template, req.chat_template_kwargs or {})
        try:
            prompt = await anyio.to_thread.run_sync(lambda: chat_prompt(self.model, messages, options))
        except InvalidParameterError as e:
            raise APIError(400, str(e), param="messages", code="invalid_value") from None
        return {"prompt": prompt.text}

    async def completions(self, request: Request) -> Response:
        req: CompletionRequest = await self.read_body(request, CompletionRequest)
        tokens = await self.tokens(lambda: completion_tokens(self.model, req.prompt), "prompt")
        echo = ""
        if req.echo:
            echo = req.prompt if isinstance(req.prompt, str) else \
                req.prompt[0] if isinstance(req.prompt[0], str) else self.model.detokenize(req.prompt)
        return await self.run(request, req, tokens, Reply(chat=False, model_name=self.model_name), echo)

    # --- the others -----------------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        """OpenAI's model list (with llama-server's ``models`` entry beside ``data``)."""
        m = self.model
        meta = {"n_ctx": self.n_ctx, "n_ctx_train": m.n_ctx_train, "n_vocab": m.n_vocab, "n_params": m.n_params,
                "size": m.size, "mtp_assistant": m.has_assistant}
        ollama = {"name": self.model_name, "model": self.model_name, "type": "model", "capabilities": ["completion"],
                  "details": {"format": "gguf"}}
        return {"object": "list", "models": [ollama], "data": [{**self.model_info(self.model_name), "meta": meta}]}

    def model_info(self, model_id: str) -> dict[str, Any]:
        """OpenAI's ``GET /v1/models/{id}``; an unknown id is a 404 in OpenAI's shape."""
        if model_id != self.model_name:
            raise APIError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "mtp-bindings"}

    def slots(self, fail_on_no_slot: bool = False) -> list[dict[str, Any]]:
        """llama-server's ``GET /slots``: each slot's state and its latest task (``fail_on_no_slot``:
        a 503 when none is idle)."""
        pool = self.pool
        if fail_on_no_slot and len(pool.active) >= pool.n_slots:
            raise APIError(503, "no slot available", type="unavailable_error", code="unavailable")
        speculative = self.props()["default_generation_settings"]["speculative"]
        out = []
        for i in range(pool.n_slots):
            slot: dict[str, Any] = {"id": i, "n_ctx": self.n_ctx, "speculative": speculative,
                                    "is_processing": i in pool.active}
            job = pool.last.get(i)
            if job is not None:
                slot.update(id_task=job.id, n_prompt_tokens=len(job.tokens))
            out.append(slot)
        return out

    async def tokenize(self, request: Request) -> dict[str, Any]:
        req: TokenizeRequest = await self.read_body(request, TokenizeRequest)
        return await self.vocab_call(lambda: tokenize_body(self.model, req), "content")

    async def detokenize(self, request: Request) -> dict[str, Any]:
        req: DetokenizeRequest = await self.read_body(request, DetokenizeRequest)
        return await self.vocab_call(lambda: detokenize_body(self.model, req), "tokens")

    async def vocab_call(self, fn: Callable[[], dict[str, Any]], param: str) -> dict[str, Any]:
        """Run a vocabulary lookup off the event loop; bad input is a 400 naming ``param``."""
        try:
            return await anyio.to_thread.run_sync(fn)
        except (InvalidParameterError, TokenizeError) as e:
            raise APIError(400, str(e), param=param, code="invalid_value") from None

    def props(self) -> dict[str, Any]:
        return props_body(self.model, model_name=self.model_name, n_slots=self.metrics.n_slots, n_ctx=self.n_ctx,
                          n_predict=self.n_predict, draft=self.draft, chat_template=self.chat_template)

    def health(self) -> dict[str, Any]:
        mt = self.metrics
        return {"status": "ok", "slots_idle": mt.n_slots - mt.processing, "slots_processing": mt.processing,
                "requests_queued": mt.queued}
