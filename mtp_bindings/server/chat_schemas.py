"""The chat messages and tools a chat completion request carries, as pydantic models.

One job: say what a valid message (text parts, earlier tool calls) and a valid tool definition are,
and hand them to the chat template in its shape (:meth:`ChatMessage.as_template_message`). The
request around them is :class:`~mtp_bindings.server.schemas.ChatCompletionRequest`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from .strict import STRICT


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = STRICT
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(BaseModel):
    """An assistant message's earlier tool call, as OpenAI sends it back."""

    model_config = STRICT
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall

    def as_template_call(self) -> dict[str, Any]:
        """The call with its arguments as an object when they are JSON object text (templates,
        HF's and Gemma 4's, write arguments from an object)."""
        args: Any = self.function.arguments
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            args = parsed if isinstance(parsed, dict) else args
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": args}}


class FunctionDef(BaseModel):
    model_config = STRICT
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    """One entry of ``tools``: a function the model may call."""

    model_config = STRICT
    type: Literal["function"]
    function: FunctionDef


class ChatMessage(BaseModel):
    model_config = STRICT
    role: str = Field(min_length=1)
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def as_template_message(self) -> dict[str, Any]:
        """The message for the chat template: ``{"role", "content"}`` (text parts joined; OpenAI's
        newer ``developer`` role is the template's ``system``), with ``tool_calls``,
        ``tool_call_id``, ``name`` and ``reasoning_content`` when given. An assistant message with
        only tool calls keeps ``content`` None."""
        content = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(p.text for p in self.content)
        if content is None and not self.tool_calls:
            content = ""
        msg: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:
            msg["tool_calls"] = [c.as_template_call() for c in self.tool_calls]
        for key in ("tool_call_id", "name", "reasoning_content"):
            if getattr(self, key) is not None:
                msg[key] = getattr(self, key)
        return msg
