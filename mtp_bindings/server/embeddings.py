"""Embedding routes: OpenAI's ``POST /v1/embeddings`` and llama-server's ``POST /embedding`` /
``/embeddings``, in their request and response shapes (``serve --embeddings --pooling ...``).

One job: these routes' bodies, over :mod:`mtp_bindings.embeddings` (a context of its own, never a
generation slot's). As llama-server: without ``--embeddings`` they answer 501 ``not_supported_error``;
``/v1/embeddings`` refuses pooling ``none`` (one vector per token is not OpenAI's shape), the native
routes return it; pooled vectors are normalised with the request's ``embd_normalize`` (default
:data:`~mtp_bindings.config.params.EMBD_NORMALIZE`, L2), per-token ones are not. ``input`` (or the native
``content``) is a string, a token list, or a list of either. ``dimensions`` (which would change the
vectors) is refused; ``user`` and other unknown fields are hints and are ignored.
"""

from __future__ import annotations

import base64
from typing import Any

import anyio
import numpy as np
from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel

from ..embeddings import Embedder, as_token_lists, check_norm, embedder_for, normalize_vector
from ..exceptions import ContextOverflowError, InvalidParameterError, TokenizeError
from ..config.params import EMBD_NORMALIZE, EMBED_POOLING
from .auth import BearerKey
from .errors import APIError
from .handlers import Server
from .strict import STRICT

NOT_ENABLED = "This server does not support embeddings. Start it with `--embeddings`"  # llama-server's words
NOT_OAI = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"
EMBEDDING_ROUTES = ("/v1/embeddings", "/embeddings", "/embedding")  # the last: llama-server's legacy spelling

class EmbeddingRequest(BaseModel):
    """The body of every embedding route: OpenAI's fields, and llama-server's ``content`` and
    ``embd_normalize``. ``input`` / ``content`` and ``embd_normalize`` are checked by the library
    (:func:`~mtp_bindings.embeddings.as_token_lists`, :func:`~mtp_bindings.embeddings.check_norm`), so
    that the error names them."""

    model_config = STRICT
    input: Any = None  # noqa: A003 (OpenAI's name)
    content: Any = None
    model: str | None = None
    encoding_format: str | None = None  # None: "float"
    embd_normalize: Any = EMBD_NORMALIZE
    dimensions: Any = None

    def inputs(self) -> Any:
        if self.input is None and self.content is None:
            raise APIError(400, '"input" or "content" must be provided', param="input", code="invalid_value")
        if self.encoding_format not in (None, "float", "base64"):
            raise APIError(400, "The format to return the embeddings in. Can be either float or base64",
                           param="encoding_format", code="invalid_value")
        if self.dimensions is not None:
            raise APIError(400, "dimensions: shortening embeddings is not supported by this server",
                           param="dimensions", code="unsupported_parameter")
        try:
            check_norm(self.embd_normalize)
        except InvalidParameterError as e:
            raise APIError(400, str(e), param="embd_normalize", code="invalid_value") from None
        return self.input if self.input is not None else self.content


def add_embedding_routes(app: FastAPI, server: Server, key: BearerKey, *, enabled: bool,
                         pooling: str = EMBED_POOLING, embd_normalize: int = EMBD_NORMALIZE) -> None:
    """Wire the three embedding routes into ``app``; with ``enabled`` the embedding context is
    created now (a bad setting fails at startup, not on the first request). ``embd_normalize`` is
    what a request that sets none gets (llama-server's ``--embd-normalize``)."""
    check_norm(embd_normalize)
    embedder = embedder_for(server.model, pooling) if enabled else None
    keyed = [Depends(key)]

    @app.post(EMBEDDING_ROUTES[0], dependencies=keyed)
    async def embeddings_oai(request: Request) -> dict[str, Any]:
        return await _embed(server, _enabled(embedder), request, embd_normalize, oai=True)

    @app.post(EMBEDDING_ROUTES[1], dependencies=keyed)
    async def embeddings_native(request: Request) -> list[dict[str, Any]]:
        return await _embed(server, _enabled(embedder), request, embd_normalize, oai=False)

    @app.post(EMBEDDING_ROUTES[2], dependencies=keyed)
    async def embedding_native(request: Request) -> list[dict[str, Any]]:
        return await _embed(server, _enabled(embedder), request, embd_normalize, oai=False)


def _enabled(embedder: Embedder | None) -> Embedder:
    if embedder is None:
        raise APIError(501, NOT_ENABLED, type="not_supported_error", code="not_supported")
    return embedder


async def _embed(server: Server, embedder: Embedder, request: Request, default_norm: int, *, oai: bool) -> Any:
    req: EmbeddingRequest = await server.read_body(request, EmbeddingRequest)
    if "embd_normalize" not in req.model_fields_set:
        req.embd_normalize = default_norm
    if oai and embedder.pooling == "none":
        raise APIError(400, NOT_OAI, param="input", code="invalid_value")
    inputs = req.inputs()
    try:
        vectors, n_tokens = await anyio.to_thread.run_sync(_vectors, embedder, inputs, req.embd_normalize)
    except ContextOverflowError as e:
        raise APIError(400, str(e), param="input", code="context_length_exceeded") from None
    except (InvalidParameterError, TokenizeError) as e:
        raise APIError(400, str(e), param="input", code="invalid_value") from None
    if not oai:
        # llama-server: each input's list of vectors (one when pooled, one per token when not)
        return [{"index": i, "embedding": (v if v.ndim == 2 else v[None, :]).tolist()} for i, v in enumerate(vectors)]
    data = [{"embedding": _encoded(v, req.encoding_format), "index": i, "object": "embedding"}
            for i, v in enumerate(vectors)]
    total = sum(n_tokens)
    return {"model": req.model or server.model_name, "object": "list", "data": data,
            "usage": {"prompt_tokens": total, "total_tokens": total}}


def _vectors(embedder: Embedder, inputs: Any, norm: int) -> tuple[list[np.ndarray], list[int]]:
    """Each input's vector(s), pooled ones normalised with ``norm``, and each input's token count."""
    lists, _ = as_token_lists(embedder.model, inputs)
    raw = [embedder.embed_tokens(toks) for toks in lists]
    out = raw if embedder.pooling == "none" else [normalize_vector(v, norm) for v in raw]
    return out, [len(toks) for toks in lists]


def _encoded(vec: np.ndarray, encoding_format: str | None) -> list[float] | str:
    """A vector as OpenAI sends it: floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
    return vec.tolist()
