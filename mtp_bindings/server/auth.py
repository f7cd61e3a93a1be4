"""The API key: with one set, every route but ``/health`` needs ``Authorization: Bearer <key>``.

One job: a FastAPI dependency that lets a request through or answers 401 in OpenAI's error shape
(``invalid_api_key``; ``missing API key`` when no bearer token came, ``incorrect API key`` when a
wrong one did). The header is read by FastAPI's :class:`~fastapi.security.HTTPBearer` (without its
own 403, so that the messages stay ours); the key is compared in constant time, so response timing
does not leak how much of a guess was right.
"""

from __future__ import annotations

import hmac

from fastapi import Request
from fastapi.security import HTTPBearer

from .errors import APIError


class BearerKey:
    """A dependency (``Depends(BearerKey(key))``) requiring ``key`` as the bearer token; with
    ``key`` None every request passes."""

    def __init__(self, key: str | None) -> None:
        self.key = key.encode() if key is not None else None
        self._bearer = HTTPBearer(auto_error=False)

    async def __call__(self, request: Request) -> None:
        if self.key is None:
            return
        credentials = await self._bearer(request)
        if credentials is None:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        if not hmac.compare_digest(credentials.credentials.encode(), self.key):
            raise APIError(401, "incorrect API key", code="invalid_api_key")
