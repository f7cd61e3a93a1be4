"""The API key: with one set, every route but ``/health`` needs ``Authorization: Bearer <key>``
or, as llama-server also takes it, ``X-Api-Key: <key>``.

One job: a FastAPI dependency that lets a request through or answers 401 in OpenAI's error shape
(``invalid_api_key``; ``missing API key`` when no key came, ``incorrect API key`` when a wrong one
did). The headers are read by FastAPI's :class:`~fastapi.security.HTTPBearer` and
:class:`~fastapi.security.APIKeyHeader` (without their own 403, so that the messages stay ours);
as in llama-server, the bearer token is looked at first. The key is compared in constant time, so
response timing does not leak how much of a guess was right. CORS preflights (``OPTIONS``) never
reach this: the CORS middleware answers them, as browsers send no key with them.
"""

from __future__ import annotations

import hmac

from fastapi import Request
from fastapi.security import APIKeyHeader, HTTPBearer

from .errors import APIError


class BearerKey:
    """A dependency (``Depends(BearerKey(key))``) requiring ``key`` as the bearer token or the
    ``X-Api-Key`` header; with ``key`` None every request passes."""

    def __init__(self, key: str | None) -> None:
        self.key = key.encode() if key is not None else None
        self._bearer = HTTPBearer(auto_error=False)
        self._header = APIKeyHeader(name="X-Api-Key", auto_error=False)

    async def __call__(self, request: Request) -> None:
        if self.key is None:
            return
        credentials = await self._bearer(request)
        given = credentials.credentials if credentials is not None else await self._header(request)
        if not given:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'",
                           code="invalid_api_key")
        if not hmac.compare_digest(given.encode(), self.key):
            raise APIError(401, "incorrect API key", code="invalid_api_key")
