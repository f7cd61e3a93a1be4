"""The FastAPI app: settings checked, routes wired to their handlers, errors in OpenAI's shape.

One job: assemble the app from the server's parts -- :class:`~.handlers.Server` (the state and
what each route does), the API key dependency (:mod:`.auth`), the request counter
(:mod:`.metrics`), CORS as llama-server does it (Starlette's middleware: any origin unless
``cors_origins`` names some, credentials allowed, preflights answered without the key) -- and tie
the slot pool's life to the app's (contexts created at startup, freed at shutdown). Routes have
llama-server's paths and aliases: the OpenAI ones with and without ``/v1``, ``/health`` and
``/v1/health``, llama-server's native ``/completion`` (alias ``/completions``, its shape, not
OpenAI's, as there).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..chat.template import check_template
from ..exceptions import InvalidParameterError
from ..config.limits import SERVER_N_PREDICT
from ..config.params import EMBD_NORMALIZE, EMBED_POOLING, ContextParams, DraftParams
from ..config.threads import threads_per_slot
from .auth import BearerKey
from .embeddings import EMBEDDING_ROUTES, add_embedding_routes
from .errors import APIError, ClientGone
from .handlers import Server
from .llama_completion import native_completion
from .metrics import CONTENT_TYPE, RequestCounter
from .slot_state import add_slot_state_routes
from .params import DraftDefaults

logger = logging.getLogger(__name__)

ROUTES = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completion", "/completions",
          "/v1/models", "/models", "/health", "/v1/health", "/metrics", "/slots",
          "/tokenize", "/detokenize", "/props", "/apply-template")
CORS_METHODS = ["GET", "POST", "DELETE", "OPTIONS"]  # llama-server's --cors-methods default
DEFAULT_N_PREDICT = SERVER_N_PREDICT  # tokens of a request that sets no limit (-1: until the context is full)
_CONTEXT = ContextParams()  # the library's context defaults


def create_app(
    model: Any,
    *,
    model_name: str,
    api_key: str | None = None,
    n_slots: int = 1,
    n_ctx: int = _CONTEXT.n_ctx,
    n_predict: int = DEFAULT_N_PREDICT,
    n_threads: int | None = None,
    n_threads_batch: int | None = None,
    type_k: str = _CONTEXT.type_k,
    type_v: str = _CONTEXT.type_v,
    type_k_swa: str | None = _CONTEXT.type_k_swa,
    type_v_swa: str | None = _CONTEXT.type_v_swa,
    flash_attn: str = _CONTEXT.flash_attn,
    chat_template: str | None = None,  # a Jinja chat template's source, used instead of the GGUF's
    draft_n_max: int | None = None,
    preset: str | None = None,
    depth2: bool | None = None,
    skip_streak: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt,
    cors_origins: str = "*",
    embeddings: bool = False,  # serve /v1/embeddings, /embedding(s) (llama-server's --embeddings), pooled so:
    pooling: str = EMBED_POOLING,
    embd_normalize: int = EMBD_NORMALIZE,  # what an embedding request that sets none gets
    slot_save_path: str | None = None,  # llama-server's --slot-save-path: POST /slots/{id}?action=save|restore
) -> FastAPI:
    """The FastAPI app serving ``model`` (already loaded, assistant attached or not) as
    ``model_name``. A request that sets no length limit gets at most ``n_predict`` tokens (-1:
    until the context is full). ``n_slots`` contexts of ``n_ctx`` tokens (KV types and flash attention as in
    :class:`~mtp_bindings.llama_context.ContextParams`; ``n_threads`` is the budget all slots share,
    default the usable CPUs, see :func:`~mtp_bindings.config.threads.threads_per_slot`; ``n_threads_batch``, the
    prompt's budget, is shared the same way, default as ``n_threads``) are created when the app starts
    and freed when it stops; the model stays the caller's. Drafting defaults (``draft_n_max``,
    ``preset``, ``depth2``, ``skip_streak``) are :func:`generate`'s; requests may override
    ``draft_n_max``. ``cache_prompt`` (default on; a request's ``cache_prompt`` overrides it): each
    slot keeps its last request's KV and decodes only what follows the common prefix.
    ``cors_origins``: llama-server's ``--cors-origins``, comma-separated (``*``: any)."""
    if isinstance(n_slots, bool) or not isinstance(n_slots, int) or not 1 <= n_slots <= 64:
        raise InvalidParameterError(f"n_slots must be an int in 1..64, got {n_slots!r}")
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 2:
        raise InvalidParameterError(f"n_ctx must be an int >= 2, got {n_ctx!r}")
    if isinstance(n_predict, bool) or not isinstance(n_predict, int) or not (n_predict >= 1 or n_predict == -1):
        raise InvalidParameterError(f"n_predict must be a positive int or -1 (until the context is full), "
                                    f"got {n_predict!r}")
    if chat_template is not None:
        check_template(chat_template)
    if api_key is not None and not api_key:
        raise InvalidParameterError("api_key must be a non-empty string or None")
    draft = DraftDefaults(draft_n_max, preset, depth2, skip_streak, bool(cache_prompt))
    draft.validate()
    for name, value in (("n_threads", n_threads), ("n_threads_batch", n_threads_batch)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidParameterError(f"{name} must be a positive int or None, got {value!r}")
    # each slot gets its share of the budget(s); without explicit counts it also adapts to the load
    batch_threads = None if n_threads_batch is None else threads_per_slot(n_slots, n_threads_batch)
    context_kwargs = dict(n_ctx=n_ctx, n_threads=threads_per_slot(n_slots, n_threads), n_threads_batch=batch_threads,
                          adapt_threads=n_threads is None and n_threads_batch is None, type_k=type_k, type_v=type_v,
                          type_k_swa=type_k_swa, type_v_swa=type_v_swa, flash_attn=flash_attn,
                          embeddings=model.has_assistant)
    server = Server(model, model_name=model_name, n_slots=n_slots, n_ctx=n_ctx, context_kwargs=context_kwargs,
                    draft=draft, n_predict=n_predict, chat_template=chat_template)

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
    _add_routes(app, server, BearerKey(api_key))
    add_embedding_routes(app, server, BearerKey(api_key), enabled=embeddings, pooling=pooling,
                         embd_normalize=embd_normalize)
    add_slot_state_routes(app, server, BearerKey(api_key), save_path=slot_save_path)
    app.add_middleware(RequestCounter, metrics=server.metrics, routes=ROUTES + EMBEDDING_ROUTES)
    origins = [o.strip() for o in cors_origins.split(",") if o.strip()]
    if not origins:
        raise InvalidParameterError(f"cors_origins must name at least one origin (or '*'), got {cors_origins!r}")
    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_credentials=True, allow_methods=CORS_METHODS,
                       allow_headers=["*"])
    return app


def _add_routes(app: FastAPI, server: Server, key: BearerKey) -> None:
    """Every route but ``/health`` depends on the API key."""
    keyed = [Depends(key)]

    @app.post("/v1/chat/completions", dependencies=keyed)
    @app.post("/chat/completions", dependencies=keyed)
    async def chat_completions(request: Request) -> Response:
        return await server.chat_completions(request)

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(request: Request) -> Response:
        return await server.completions(request)

    @app.post("/completion", dependencies=keyed)
    @app.post("/completions", dependencies=keyed)
    async def completion(request: Request) -> Response:
        return await native_completion(server, request)

    @app.get("/v1/models", dependencies=keyed)
    @app.get("/models", dependencies=keyed)
    async def models() -> dict[str, Any]:
        return server.models()

    @app.get("/v1/models/{model_id:path}", dependencies=keyed)
    async def model_info(model_id: str) -> dict[str, Any]:
        return server.model_info(model_id)

    @app.get("/slots", dependencies=keyed)
    async def slots(fail_on_no_slot: str | None = None) -> list[dict[str, Any]]:
        return server.slots(bool(fail_on_no_slot))

    @app.post("/tokenize", dependencies=keyed)
    async def tokenize(request: Request) -> dict[str, Any]:
        return await server.tokenize(request)

    @app.post("/detokenize", dependencies=keyed)
    async def detokenize(request: Request) -> dict[str, Any]:
        return await server.detokenize(request)

    @app.post("/apply-template", dependencies=keyed)
    async def apply_template(request: Request) -> dict[str, Any]:
        return await server.apply_template(request)

    @app.get("/props", dependencies=keyed)
    async def props() -> dict[str, Any]:
        return server.props()

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/metrics", dependencies=keyed)
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves in OpenAI's shape: ours, routing's (404/405), and anything unexpected
    (500, logged)."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request"

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
