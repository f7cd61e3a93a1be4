"""An OpenAI-compatible HTTP server over the generation driver (``mtp-bindings serve``).

Why it exists: most Python LLM tooling talks to models through the OpenAI HTTP API. This module
puts one loaded :class:`~mtp_bindings.model.Model` (optionally with its MTP assistant) behind
that API, so those tools get MTP speculative decoding without code changes.

Endpoints:

* ``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI's request and response
  formats, streaming (server-sent events, ``data: {chunk}``, then ``data: [DONE]``) or not.
  Non-streaming responses and the last stream chunk carry OpenAI ``usage`` and llama-server-style
  ``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``,
  ``predicted_per_second``, ``draft_n``, ``draft_n_accepted``).
* ``GET /v1/models``, ``GET /health`` (never needs the API key), ``GET /metrics`` (Prometheus text).

Requests take the OpenAI fields that map onto :func:`~mtp_bindings.speculative.generate`
(``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``stream``,
``stream_options.include_usage``; ``n`` must be 1) and llama-server's extras (``top_k``, ``min_p``, ``repeat_penalty``,
``repeat_last_n``, ``n_predict``, ``speculative.n_max`` -- flat key or nested object -- and
``draft_n_max``). Unknown fields are ignored, since OpenAI clients send extras; a known field of
the wrong type or out of range, bad JSON, or a prompt that does not fit the context is a 400 with
OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``. User input never yields
a 5xx.

Concurrency: the server owns ``n_slots`` llama.cpp contexts on the one shared model, each served
by its own worker thread. A request is tokenized off the event loop, then queued; the first free
slot takes it (FIFO), so at most ``n_slots`` generations run at once and the rest wait in the
queue (``mtp_requests_queued`` in ``/metrics``). Workers hand pieces back to the event loop
through a per-request asyncio queue. Each slot's KV memory is cleared per request (no prompt
cache). A client that disconnects -- while queued, mid-stream, or waiting for a non-streamed
reply -- cancels its generation: the worker stops at the next round, drains any MTP draft in
flight and takes the next request.

Length: a request that sets no ``max_tokens`` (nor ``max_completion_tokens``/``n_predict``) gets
at most the server's ``n_predict`` tokens (``DEFAULT_N_PREDICT``; -1: until the context is full),
like llama-server's ``-n``: one forgotten limit must not hold a slot for many minutes.

Shutdown (Ctrl-C / SIGTERM): the server stops accepting connections, cancels every generation at
once (queued or running) and answers each open request with a 503 ``server_shutting_down`` error
-- a JSON error body, or for a stream an error event after the text sent so far -- then exits.

Security: binds 127.0.0.1 unless told otherwise; with ``api_key`` set every route but
``/health`` needs ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from .exceptions import ContextOverflowError, InvalidParameterError, MTPBindingsError, TokenizeError
from .limits import SERVER_N_PREDICT
from .presets import resolve_preset
from .speculative import GenerationStats, TextPiece, generate
from .threads import threads_per_slot

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
DISCONNECT_POLL_S = 0.2
ACCEPTANCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
PUBLIC_ROUTES = frozenset({"/health"})
DEFAULT_N_PREDICT = SERVER_N_PREDICT  # tokens of a request that sets no limit (-1: until the context is full)
# seconds uvicorn waits for open connections at shutdown (generations are cancelled at once, so
# this only bounds a client that does not read its response)
GRACEFUL_SHUTDOWN_S = 5


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------

class APIError(Exception):
    """An error answered with OpenAI's error body (``{"error": {...}}``) and ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class _ClientGone(Exception):
    """The client disconnected before the response started."""


def shutting_down_error() -> APIError:
    """What every request still open when the server stops is answered with."""
    return APIError(503, "the server is shutting down; the generation was cancelled", type="server_error",
                    code="server_shutting_down")


# ------------------------------------------------------------------------------------------------
# request models
# ------------------------------------------------------------------------------------------------

_STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = None


class SpeculativeOptions(BaseModel):
    """llama-server's ``speculative`` object; only ``n_max`` is used (``n_min``/``p_min`` ignored)."""

    model_config = _STRICT
    n_max: int | None = Field(None, ge=0, le=16)


class GenerationRequest(BaseModel):
    """Fields shared by chat and text completions (OpenAI names plus llama-server extras).

    Strict types (``"0.5"`` is not a number, ``true`` is not an int) so that a client bug is a
    400 rather than a silently different generation; ``null`` means "the default"."""

    model_config = _STRICT

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    n_predict: int | None = Field(None, ge=-1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=100.0)
    repeat_last_n: int | None = Field(None, ge=-1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=-1, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    logit_bias: dict[str, float] | None = None
    draft_n_max: int | None = Field(None, ge=0, le=16)
    speculative: SpeculativeOptions | None = None
    speculative_n_max: int | None = Field(None, alias="speculative.n_max", ge=0, le=16)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("this server generates one choice per request: n must be 1")
        return v

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for tok, bias in (v or {}).items():
            if not tok.isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {tok!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias!r} for token {tok}")
        return v

    def token_bias(self, n_vocab: int) -> dict[int, float] | None:
        """``logit_bias`` with int keys, or an :class:`APIError` for ids outside the vocabulary."""
        if not self.logit_bias:
            return None
        bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        bad = [k for k in bias if k >= n_vocab]
        if bad:
            raise APIError(400, f"logit_bias: token id {bad[0]} is outside the vocabulary [0, {n_vocab})",
                           param="logit_bias", code="invalid_value")
        return bias

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        """``max_tokens`` (or llama-server's ``n_predict``; -1 = unbounded); None = until the
        context is full."""
        if self.max_tokens is not None:
            return self.max_tokens
        if self.n_predict is not None and self.n_predict >= 0:
            return self.n_predict
        return None

    def requested_draft_n_max(self) -> int | None:
        if self.draft_n_max is not None:
            return self.draft_n_max
        if self.speculative is not None and self.speculative.n_max is not None:
            return self.speculative.n_max
        return self.speculative_n_max


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: str = Field(min_length=1)
    content: str | list[TextPart] | None = None

    def as_template_message(self) -> dict[str, str]:
        """``{"role", "content"}`` for the chat template (text parts joined; OpenAI's newer
        ``developer`` role is the template's ``system``)."""
        content = self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("logprobs are not supported by this server")
        return v

    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return super().requested_max_tokens()


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int]
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list) and not v:
            raise ValueError("the prompt is empty")
        if isinstance(v, list) and isinstance(v[0], str) and len(v) != 1:
            raise ValueError("this server takes one prompt per request (a string, a list of one string, "
                             "or a list of token ids)")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: int | None) -> int | None:
        if v:
            raise ValueError("logprobs are not supported by this server")
        return v

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("best_of must be 1")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (insertion) is not supported by this server")
        return v


def _field_names(*models: type[BaseModel]) -> frozenset[str]:
    """Every field name and alias of the request models (to tell them from pydantic's union tags
    in an error location)."""
    names: set[str] = set()
    for m in models:
        for name, f in m.model_fields.items():
            names.add(name)
            if f.alias:
                names.add(f.alias)
    return frozenset(names)


_FIELD_NAMES = _field_names(ChatCompletionRequest, CompletionRequest, ChatMessage, TextPart, StreamOptions,
                            SpeculativeOptions)


def _error_param(loc: Iterable[Any]) -> str | None:
    parts = [str(p) for p in loc if isinstance(p, int) or p in _FIELD_NAMES]
    return ".".join(parts) or None


def _error_code(kind: str) -> str:
    if kind == "missing":
        return "missing_required_parameter"
    if kind.endswith("_type") or kind.endswith("_parsing") or kind in ("int_from_float", "union_tag_invalid"):
        return "invalid_type"
    return "invalid_value"


def validation_error(e: ValidationError) -> APIError:
    """The first problem of a pydantic error, as an OpenAI-style 400."""
    err = e.errors(include_url=False)[0]
    param = _error_param(err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "model_type" and not param:
        msg = "the request body must be a JSON object"
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code=_error_code(err["type"]))


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """The request body as ``model``, or an :class:`APIError` 400 (bad JSON, wrong types)."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"could not parse the request body as JSON: {e}", code="invalid_json") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


# ------------------------------------------------------------------------------------------------
# metrics
# ------------------------------------------------------------------------------------------------

class ServerMetrics:
    """Counters for ``/metrics`` (Prometheus text format), updated from the event loop and the
    slot workers alike (hence the lock)."""

    def __init__(self, n_slots: int) -> None:
        self._lock = threading.Lock()
        self.n_slots = n_slots
        self.requests: dict[tuple[str, int], int] = {}
        self.queued = 0
        self.processing = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.generations = 0
        self.cancelled = 0
        self.drafted = 0
        self.accepted = 0
        self.drafted_pos: list[int] = []
        self.accepted_pos: list[int] = []
        self.hist_counts = [0] * len(ACCEPTANCE_BUCKETS)
        self.hist_sum = 0.0
        self.hist_n = 0

    def count_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            key = (endpoint, status)
            self.requests[key] = self.requests.get(key, 0) + 1

    def job_queued(self) -> None:
        with self._lock:
            self.queued += 1

    def job_started(self) -> None:
        with self._lock:
            self.queued -= 1
            self.processing += 1

    def job_skipped(self) -> None:
        """A request cancelled while still queued."""
        with self._lock:
            self.queued -= 1
            self.cancelled += 1

    def job_finished(self) -> None:
        with self._lock:
            self.processing -= 1

    def record_generation(self, stats: GenerationStats, finish_reason: str) -> None:
        with self._lock:
            self.generations += 1
            self.cancelled += finish_reason == "cancelled"
            self.prompt_tokens += stats.n_prompt
            self.generated_tokens += stats.n_generated
            self.drafted += stats.n_drafted
            self.accepted += stats.n_accepted
            _add_into(self.drafted_pos, stats.drafted_per_position)
            _add_into(self.accepted_pos, stats.accepted_per_position)
            if stats.n_drafted:
                rate = stats.acceptance_rate
                self.hist_sum += rate
                self.hist_n += 1
                for i, le in enumerate(ACCEPTANCE_BUCKETS):
                    if rate <= le:
                        self.hist_counts[i] += 1

    def render(self) -> str:
        with self._lock:
            return "".join(self._lines())

    def _lines(self) -> Iterable[str]:
        def family(name: str, kind: str, help_: str) -> str:
            return f"# HELP {name} {help_}\n# TYPE {name} {kind}\n"

        yield family("mtp_http_requests_total", "counter", "HTTP requests by endpoint and status code.")
        for (endpoint, status), n in sorted(self.requests.items()):
            yield f'mtp_http_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}\n'
        for name, kind, help_, value in (
            ("mtp_slots", "gauge", "Generation slots (contexts).", self.n_slots),
            ("mtp_requests_processing", "gauge", "Generations running in a slot.", self.processing),
            ("mtp_requests_queued", "gauge", "Generation requests waiting for a slot.", self.queued),
            ("mtp_generations_total", "counter", "Generations run (finished or cancelled).", self.generations),
            ("mtp_generations_cancelled_total", "counter", "Generations cancelled by a client disconnect.",
             self.cancelled),
            ("mtp_prompt_tokens_total", "counter", "Prompt tokens processed.", self.prompt_tokens),
            ("mtp_generated_tokens_total", "counter", "Tokens generated.", self.generated_tokens),
            ("mtp_draft_tokens_total", "counter", "Tokens drafted by the MTP assistant.", self.drafted),
            ("mtp_draft_accepted_tokens_total", "counter", "Drafted tokens the target accepted.", self.accepted),
        ):
            yield family(name, kind, help_) + f"{name} {value}\n"
        yield family("mtp_draft_position_drafted_total", "counter", "Drafted tokens by draft position (1-based).")
        for i, n in enumerate(self.drafted_pos):
            yield f'mtp_draft_position_drafted_total{{position="{i + 1}"}} {n}\n'
        yield family("mtp_draft_position_accepted_total", "counter", "Accepted drafts by draft position (1-based).")
        for i, n in enumerate(self.accepted_pos):
            yield f'mtp_draft_position_accepted_total{{position="{i + 1}"}} {n}\n'
        yield family("mtp_draft_position_acceptance_ratio", "gauge", "Accepted / drafted by draft position.")
        for i, (a, d) in enumerate(zip(self.accepted_pos, self.drafted_pos)):
            yield f'mtp_draft_position_acceptance_ratio{{position="{i + 1}"}} {a / d if d else 0.0}\n'
        yield family("mtp_request_acceptance_rate", "histogram",
                     "Per-request draft acceptance rate (requests that drafted).")
        for le, n in zip(ACCEPTANCE_BUCKETS, self.hist_counts):
            yield f'mtp_request_acceptance_rate_bucket{{le="{le}"}} {n}\n'
        yield f'mtp_request_acceptance_rate_bucket{{le="+Inf"}} {self.hist_n}\n'
        yield f"mtp_request_acceptance_rate_sum {self.hist_sum}\n"
        yield f"mtp_request_acceptance_rate_count {self.hist_n}\n"


def _add_into(total: list[int], values: list[int]) -> None:
    total.extend([0] * (len(values) - len(total)))
    for i, v in enumerate(values):
        total[i] += v


class _RequestCounter:
    """ASGI middleware counting every HTTP response by endpoint (known routes, else ``other``,
    to bound the label set) and status code."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def capture(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            path = scope.get("path", "")
            self.metrics.count_request(path if path in ROUTES else "other", status[0])


# ------------------------------------------------------------------------------------------------
# slots: contexts with worker threads
# ------------------------------------------------------------------------------------------------

_END = object()


class Job:
    """One generation request: prompt tokens and ``generate`` arguments in, pieces out (through
    an asyncio queue on the server's event loop), and a cancel flag the worker polls each round."""

    def __init__(self, tokens: list[int], kwargs: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.tokens = tokens
        self.kwargs = kwargs
        self.loop = loop
        self.items: asyncio.Queue[Any] = asyncio.Queue()
        self._cancel = threading.Event()
        self.checked_at = time.monotonic()  # when the handler last checked the client was there
        self.error: APIError | None = None  # why the server (not the client) stopped it

    def cancel(self) -> None:
        """Stop the generation at its next round (idempotent; a no-op once it has finished)."""
        self._cancel.set()

    def abort(self, error: APIError) -> None:
        """Stop the generation and answer its client with ``error`` instead of its text."""
        self.error = error
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def put(self, item: Any) -> None:
        """Hand ``item`` to the event loop (from a worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is shutting down
            pass


class SlotPool:
    """``n_slots`` contexts on one model, each driven by its own worker thread, and the FIFO queue
    of jobs they take from."""

    def __init__(self, model: Any, n_slots: int, context_kwargs: Mapping[str, Any], metrics: ServerMetrics) -> None:
        self.model = model
        self.n_slots = n_slots
        self.context_kwargs = dict(context_kwargs)
        self.metrics = metrics
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.contexts: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.active: dict[int, Job] = {}
        self.closing: APIError | None = None  # set when the server stops: new jobs are refused with it

    def start(self) -> None:
        """Create the contexts (so a bad n_ctx fails at startup, not on the first request) and
        start their workers."""
        for i in range(self.n_slots):
            ctx = self.model.create_context(**self.context_kwargs)
            self.contexts.append(ctx)
            t = threading.Thread(target=self._worker, args=(i, ctx), name=f"mtp-slot-{i}", daemon=True)
            self.threads.append(t)
            t.start()

    def submit(self, job: Job) -> None:
        if self.closing is not None:
            raise self.closing
        self.metrics.job_queued()
        self.jobs.put(job)

    def abort_all(self, error: APIError) -> None:
        """The server is stopping: refuse new jobs, answer the queued ones with ``error`` now and
        stop the running ones at their next round (their handlers answer with ``error`` too)."""
        self.closing = error
        for job in self._drain_queue():
            job.abort(error)
        for job in list(self.active.values()):
            job.abort(error)

    def _drain_queue(self) -> list[Job]:
        """Take every queued job off the queue, counted as skipped and told it has ended."""
        drained = []
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return drained
            if job is not None:
                job.cancel()
                self.metrics.job_skipped()
                job.put(_END)
                drained.append(job)

    def stop(self, timeout: float = 10.0) -> None:
        """Drop what is queued, cancel what runs, stop the workers, and free the contexts whose
        worker has exited."""
        self._drain_queue()
        for job in list(self.active.values()):
            job.cancel()
        for _ in self.threads:
            self.jobs.put(None)
        deadline = time.monotonic() + timeout
        for t, ctx in zip(self.threads, self.contexts):
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                logger.warning("slot worker %s did not stop; leaving its context open", t.name)
            else:
                ctx.close()
        self.threads.clear()
        self.contexts.clear()

    def _worker(self, slot: int, ctx: Any) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if job.cancelled:  # the client left while the job was queued
                self.metrics.job_skipped()
                job.put(_END)
                continue
            self.metrics.job_started()
            self.active[slot] = job
            try:
                self._execute(ctx, job)
            finally:
                self.active.pop(slot, None)
                self.metrics.job_finished()
                job.put(_END)

    def _execute(self, ctx: Any, job: Job) -> None:
        try:
            for piece in generate(self.model, job.tokens, context=ctx, stream=True,
                                  cancel=lambda: job.cancelled, **job.kwargs):
                if piece.stats is not None:
                    self.metrics.record_generation(piece.stats, piece.finish_reason or "stop")
                    _log_generation(piece.stats, piece.finish_reason)
                job.put(piece)
        except Exception as e:  # handed to the request handler, which answers with it
            if not isinstance(e, MTPBindingsError):
                logger.exception("generation failed")
            job.put(e)


def _log_generation(stats: GenerationStats, finish_reason: str | None) -> None:
    acc = f", acceptance {stats.acceptance_rate:.1%} of {stats.n_drafted} drafted" if stats.n_drafted else ""
    logger.info("generated %d tokens (prompt %d) at %.1f tokens/s, finish %s%s", stats.n_generated,
                stats.n_prompt, stats.tokens_per_second, finish_reason, acc)


# ------------------------------------------------------------------------------------------------
# response bodies
# ------------------------------------------------------------------------------------------------

def timings(stats: GenerationStats) -> dict[str, Any]:
    """llama-server's ``timings`` object, with its draft counters."""
    gen_s = max(stats.t_total - stats.t_prompt, 0.0)
    prompt_ms, gen_ms = stats.t_prompt * 1e3, gen_s * 1e3
    return {
        "prompt_n": stats.n_prompt,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / stats.n_prompt if stats.n_prompt else 0.0,
        "prompt_per_second": stats.n_prompt / stats.t_prompt if stats.t_prompt > 0 else 0.0,
        "predicted_n": stats.n_generated,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": gen_ms / stats.n_generated if stats.n_generated else 0.0,
        "predicted_per_second": stats.n_generated / gen_s if gen_s > 0 else 0.0,
        "draft_n": stats.n_drafted,
        "draft_n_accepted": stats.n_accepted,
    }


def usage(stats: GenerationStats) -> dict[str, int]:
    return {"prompt_tokens": stats.n_prompt, "completion_tokens": stats.n_generated,
            "total_tokens": stats.n_prompt + stats.n_generated}


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


@dataclass
class _Reply:
    """What one response is about: its id, kind (chat or text) and the served model's name."""

    chat: bool
    model_name: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_name,
                "system_fingerprint": _FINGERPRINT, "choices": choices}

    def complete(self, text: str, stats: GenerationStats, finish_reason: str | None) -> dict[str, Any]:
        """The non-streaming response."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": _finish(finish_reason)}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish(finish_reason)}
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body.update(usage=usage(stats), timings=timings(stats))
        return body

    def chunk(self, text: str | None, *, role: bool = False, finish_reason: str | None = None) -> dict[str, Any]:
        """One stream chunk: a text delta, the opening role delta, or (``finish_reason``) the end."""
        finish = _finish(finish_reason) if finish_reason is not None else None
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def final_chunks(self, stats: GenerationStats, finish_reason: str | None,
                     include_usage: bool) -> list[dict[str, Any]]:
        """The closing chunk(s): with ``include_usage``, OpenAI's extra usage chunk (no choices)
        follows the finish chunk; either way the last chunk carries ``usage`` and ``timings``."""
        last = self.chunk(None if self.chat else "", finish_reason=finish_reason)
        if not include_usage:
            last.update(usage=usage(stats), timings=timings(stats))
            return [last]
        tail = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        tail.update(usage=usage(stats), timings=timings(stats))
        return [last, tail]


def _fingerprint() -> str:
    from . import __version__

    return f"mtp-bindings-{__version__}"


_FINGERPRINT = _fingerprint()


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class _JobStreamingResponse(StreamingResponse):
    """A streaming response that cancels its job however the response ends (finished, client
    gone, server error), so a slot is never left generating for nobody."""

    def __init__(self, content: AsyncIterator[bytes], job: Job) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


# ------------------------------------------------------------------------------------------------
# the app
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftDefaults:
    """Server-wide drafting defaults (a request may override ``draft_n_max``)."""

    draft_n_max: int | None = None
    preset: str | None = None
    depth2: bool | None = None
    skip_streak: int | None = None

    def validate(self) -> None:
        resolve_preset(self.preset)
        for name, hi in (("draft_n_max", 16), ("skip_streak", 32)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi):
                raise InvalidParameterError(f"{name} must be an int in 0..{hi}, got {v!r}")


def generation_kwargs(req: GenerationRequest, draft: DraftDefaults, n_prompt: int, n_ctx: int,
                      n_vocab: int, n_predict: int = -1) -> dict[str, Any]:
    """The :func:`generate` arguments for ``req``; OpenAI's defaults where it says nothing
    (temperature 1), llama.cpp's for the extras, the server's ``n_predict`` (-1: none) as the
    length of a request that sets no limit."""
    max_tokens = req.requested_max_tokens()
    if max_tokens is None and n_predict >= 0:
        max_tokens = n_predict
    room = max(n_ctx - n_prompt, 0)
    seed = None if req.seed is None or req.seed < 0 else req.seed
    return dict(
        max_tokens=room if max_tokens is None else min(max_tokens, room),
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=40 if req.top_k is None else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        repeat_penalty=1.0 if req.repeat_penalty is None else req.repeat_penalty,
        repeat_last_n=64 if req.repeat_last_n is None else (n_ctx if req.repeat_last_n < 0 else req.repeat_last_n),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        seed=seed,
        logit_bias=req.token_bias(n_vocab),
        stop=req.stop,
        draft_n_max=req.requested_draft_n_max() if req.requested_draft_n_max() is not None else draft.draft_n_max,
        preset=draft.preset,
        depth2=draft.depth2,
        skip_streak=draft.skip_streak,
    )


def _chat_tokens(model: Any, messages: list[dict[str, str]]) -> list[int]:
    """Render with the GGUF's chat template and tokenize as :func:`speculative.chat` does."""
    import jinja2

    from .chat_template import render_chat

    try:
        text = render_chat(model, messages)
    except jinja2.TemplateError as e:
        raise InvalidParameterError(f"the chat template failed on these messages: {e}") from e
    return model.tokenize(text, add_special=False, parse_special=True)


def _completion_tokens(model: Any, prompt: str | list[str] | list[int]) -> list[int]:
    """Tokenize as :func:`generate` does for a text prompt; token-id prompts are checked."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return model.check_tokens(prompt).tolist()
    text = prompt if isinstance(prompt, str) else prompt[0]
    return model.tokenize(text, add_special=True, parse_special=False)


def _generation_error(e: Exception) -> APIError:
    """An exception from tokenizing or generating, as the response it deserves."""
    if isinstance(e, ContextOverflowError):
        return APIError(400, str(e), code="context_length_exceeded")
    if isinstance(e, (InvalidParameterError, TokenizeError)):
        return APIError(400, str(e), code="invalid_value")
    return APIError(500, f"generation failed: {e}", type="server_error", code=None)


class _Server:
    """The state behind the routes: the model, the slots, the metrics and the settings."""

    def __init__(self, model: Any, *, model_name: str, api_key: str | None, n_slots: int, n_ctx: int,
                 context_kwargs: Mapping[str, Any], draft: DraftDefaults, n_predict: int = DEFAULT_N_PREDICT) -> None:
        self.model = model
        self.model_name = model_name
        self.api_key = api_key
        self.n_ctx = n_ctx
        self.n_predict = n_predict
        self.draft = draft
        self.metrics = ServerMetrics(n_slots)
        self.pool = SlotPool(model, n_slots, context_kwargs, self.metrics)
        self.created = int(time.time())

    # --- helpers --------------------------------------------------------------------------------

    def abort_requests(self) -> None:
        """The server is stopping: cancel every generation and answer every open request with
        :func:`shutting_down_error` (called on the event loop, before uvicorn waits for them)."""
        self.pool.abort_all(shutting_down_error())

    def check_key(self, request: Request) -> None:
        if self.api_key is None or request.url.path in PUBLIC_ROUTES:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        if not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "incorrect API key", code="invalid_api_key")

    async def read_body(self, request: Request, model: type[BaseModel]) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")
        return parse_body(raw, model)

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
                    raise _ClientGone
            try:
                return await asyncio.wait_for(job.items.get(), timeout=DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                continue

    # --- the generation endpoints ---------------------------------------------------------------

    async def run(self, request: Request, req: GenerationRequest, tokens: list[int], reply: _Reply,
                  echo: str = "") -> Response:
        """Queue the generation, wait for its first piece (so errors before any output still get
        their proper status), then answer streamed or whole."""
        kwargs = generation_kwargs(req, self.draft, len(tokens), self.n_ctx, self.model.n_vocab, self.n_predict)
        job = Job(tokens, kwargs, asyncio.get_running_loop())
        self.pool.submit(job)
        try:
            first = await self.next_item(job, request)
            if job.error is not None and (first is _END or isinstance(first, Exception)):
                raise job.error
            if isinstance(first, Exception):
                raise _generation_error(first)
            if first is _END:  # only a job dropped from the queue ends without a piece carrying stats
                raise APIError(500, "the generation produced nothing", type="server_error")
            if req.stream:
                return _JobStreamingResponse(self.stream(job, first, reply, req.include_usage, echo), job)
            return await self.collect(job, request, first, reply, echo)
        except _ClientGone:
            job.cancel()
            return Response(status_code=499)
        except BaseException:
            job.cancel()
            raise

    async def collect(self, job: Job, request: Request, first: Any, reply: _Reply, echo: str) -> JSONResponse:
        pieces: list[TextPiece] = []
        item = first
        while item is not _END:
            if isinstance(item, Exception):
                raise job.error or _generation_error(item)
            pieces.append(item)
            item = await self.next_item(job, request)
        if job.error is not None:
            raise job.error
        last = pieces[-1]
        assert last.stats is not None
        text = echo + "".join(pieces)
        return JSONResponse(reply.complete(text, last.stats, last.finish_reason))

    async def stream(self, job: Job, first: Any, reply: _Reply, include_usage: bool,
                     echo: str) -> AsyncIterator[bytes]:
        """SSE chunks: the opening (role / echoed prompt), text deltas, the close and ``[DONE]``."""
        if reply.chat:
            yield _sse(reply.chunk("", role=True))
        elif echo:
            yield _sse(reply.chunk(echo))
        item = first
        while item is not _END:
            if isinstance(item, Exception):
                yield _sse((job.error or _generation_error(item)).body())
                return
            if item:
                yield _sse(reply.chunk(str(item)))
            if item.stats is not None:
                if job.error is not None:  # stopped by the server: say why instead of a normal end
                    yield _sse(job.error.body())
                    return
                for chunk in reply.final_chunks(item.stats, item.finish_reason, include_usage):
                    yield _sse(chunk)
            item = await job.items.get()
        yield _sse("[DONE]")

    async def chat_completions(self, request: Request) -> Response:
        req: ChatCompletionRequest = await self.read_body(request, ChatCompletionRequest)
        messages = [m.as_template_message() for m in req.messages]
        tokens = await self.tokens(lambda: _chat_tokens(self.model, messages), "messages")
        return await self.run(request, req, tokens, _Reply(chat=True, model_name=self.model_name))

    async def completions(self, request: Request) -> Response:
        req: CompletionRequest = await self.read_body(request, CompletionRequest)
        tokens = await self.tokens(lambda: _completion_tokens(self.model, req.prompt), "prompt")
        echo = ""
        if req.echo:
            echo = req.prompt if isinstance(req.prompt, str) else \
                req.prompt[0] if isinstance(req.prompt[0], str) else self.model.detokenize(req.prompt)
        return await self.run(request, req, tokens, _Reply(chat=False, model_name=self.model_name), echo)

    # --- the others -----------------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        m = self.model
        meta = {"n_ctx": self.n_ctx, "n_ctx_train": m.n_ctx_train, "n_vocab": m.n_vocab, "n_params": m.n_params,
                "size": m.size, "mtp_assistant": m.has_assistant}
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "mtp-bindings", "meta": meta}]}

    def health(self) -> dict[str, Any]:
        mt = self.metrics
        return {"status": "ok", "slots_idle": mt.n_slots - mt.processing, "slots_processing": mt.processing,
                "requests_queued": mt.queued}


def create_app(
    model: Any,
    *,
    model_name: str,
    api_key: str | None = None,
    n_slots: int = 1,
    n_ctx: int = 4096,
    n_predict: int = DEFAULT_N_PREDICT,
    n_threads: int | None = None,
    type_k: str = "f16",
    type_v: str = "f16",
    flash_attn: str = "auto",
    draft_n_max: int | None = None,
    preset: str | None = None,
    depth2: bool | None = None,
    skip_streak: int | None = None,
) -> FastAPI:
    """The FastAPI app serving ``model`` (already loaded, assistant attached or not) as
    ``model_name``. A request that sets no length limit gets at most ``n_predict`` tokens (-1:
    until the context is full). ``n_slots`` contexts of ``n_ctx`` tokens (KV types and flash attention as in
    :class:`~mtp_bindings.context.ContextParams`; ``n_threads`` is the budget all slots share,
    default the usable CPUs, see :func:`~mtp_bindings.threads.threads_per_slot`) are created when the app starts
    and freed when it stops; the model stays the caller's. Drafting defaults (``draft_n_max``,
    ``preset``, ``depth2``, ``skip_streak``) are :func:`generate`'s; requests may override
    ``draft_n_max``."""
    if isinstance(n_slots, bool) or not isinstance(n_slots, int) or not 1 <= n_slots <= 64:
        raise InvalidParameterError(f"n_slots must be an int in 1..64, got {n_slots!r}")
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 2:
        raise InvalidParameterError(f"n_ctx must be an int >= 2, got {n_ctx!r}")
    if isinstance(n_predict, bool) or not isinstance(n_predict, int) or not (n_predict >= 1 or n_predict == -1):
        raise InvalidParameterError(f"n_predict must be a positive int or -1 (until the context is full), "
                                    f"got {n_predict!r}")
    if api_key is not None and not api_key:
        raise InvalidParameterError("api_key must be a non-empty string or None")
    draft = DraftDefaults(draft_n_max, preset, depth2, skip_streak)
    draft.validate()
    if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1):
        raise InvalidParameterError(f"n_threads must be a positive int or None, got {n_threads!r}")
    # each slot gets its share of the budget; without an explicit n_threads it also adapts to the load
    context_kwargs = dict(n_ctx=n_ctx, n_threads=threads_per_slot(n_slots, n_threads),
                          adapt_threads=n_threads is None, type_k=type_k, type_v=type_v, flash_attn=flash_attn,
                          embeddings=model.has_assistant)
    server = _Server(model, model_name=model_name, api_key=api_key, n_slots=n_slots, n_ctx=n_ctx,
                     context_kwargs=context_kwargs, draft=draft, n_predict=n_predict)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(server.pool.start)
        logger.info("serving %s: %d slot(s) of %d tokens, %d compute thread(s) each, MTP %s", model_name, n_slots,
                    n_ctx, context_kwargs["n_threads"], "on" if model.has_assistant else "off (no assistant)")
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(server.pool.stop)

    app = FastAPI(title="mtp-bindings", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    _add_error_handlers(app)
    _add_routes(app, server)
    app.add_middleware(_RequestCounter, metrics=server.metrics)
    return app


def _add_routes(app: FastAPI, server: _Server) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        server.check_key(request)
        return await server.chat_completions(request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        server.check_key(request)
        return await server.completions(request)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        server.check_key(request)
        return server.models()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        server.check_key(request)
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves in OpenAI's shape: ours, routing's (404/405), and anything unexpected
    (500, logged)."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err = APIError(404, f"unknown route: {request.method} {request.url.path}", code="not_found")
        elif exc.status_code == 405:
            err = APIError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
        else:
            err = APIError(exc.status_code, str(exc.detail), code=None)
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return APIError(400, str(exc), code="invalid_value").response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        return APIError(500, "internal server error", type="server_error").response()


def serve(
    model: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    model_name: str | None = None,
    log_level: str = "info",
    access_log: bool = False,
    **app_kwargs: Any,
) -> None:
    """Serve ``model`` until interrupted (blocking; Ctrl-C or SIGTERM stops it, answering open
    requests with a 503 error, see the module's docstring). ``app_kwargs`` go to
    :func:`create_app`; ``model_name`` defaults to the target file's stem. Binds loopback unless
    ``host`` says otherwise."""
    import uvicorn

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidParameterError(f"port must be an int in 0..65535, got {port!r}")
    name = model_name or model.path.stem
    app = create_app(model, model_name=name, **app_kwargs)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = _stopping_server_class()(config, app.state.server.abort_requests)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the signal that stopped it, once it has stopped
        pass
    if not server.started:
        raise MTPBindingsError(f"the server did not start on {host}:{port} (see the log above)")


def _stopping_server_class() -> type:
    """uvicorn's ``Server``, made to cancel the generations before it waits for their connections
    (uvicorn would wait up to its graceful timeout, then cut them with a bare 500)."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        def __init__(self, config: Any, on_shutdown: Callable[[], None]) -> None:
            super().__init__(config)
            self._on_shutdown = on_shutdown

        async def shutdown(self, sockets: Any = None) -> None:
            self._on_shutdown()
            await super().shutdown(sockets=sockets)

    return StoppingServer
