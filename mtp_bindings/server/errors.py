"""Errors the server answers with, all in OpenAI's shape: ``{"error": {"message", "type", "param",
"code"}}``.

One job: turn every way a request can fail (bad input, a library error, the server stopping)
into an :class:`APIError` carrying its HTTP status and body. Pydantic's validation errors are
turned into ``APIError`` in :mod:`.schemas`, next to the models they come from.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ..exceptions import ContextOverflowError, InvalidParameterError, NoAssistantError, TokenizeError


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


class ClientGone(Exception):
    """The client disconnected before the response started."""


def shutting_down_error() -> APIError:
    """What every request still open when the server stops is answered with."""
    return APIError(503, "the server is shutting down; the generation was cancelled", type="server_error",
                    code="server_shutting_down")


def generation_error(e: Exception) -> APIError:
    """An exception from tokenizing or generating, as the response it deserves."""
    if isinstance(e, ContextOverflowError):
        return APIError(400, str(e), code="context_length_exceeded")
    if isinstance(e, (InvalidParameterError, TokenizeError)):
        return APIError(400, str(e), code="invalid_value")
    if isinstance(e, NoAssistantError):  # drafting asked for of a server started without an assistant
        return APIError(400, str(e), code="invalid_value")
    return APIError(500, f"generation failed: {e}", type="server_error", code=None)
