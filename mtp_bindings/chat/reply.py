"""A Gemma 4 reply split into what OpenAI's API returns: ``content``, ``reasoning_content`` (the
thinking channel) and ``tool_calls``, whole (:func:`parse_reply`) or while it streams
(:class:`ReplyStream`).

The syntax (Gemma 4's, as its chat template writes it and llama.cpp's Gemma 4 parser reads it):

* thinking: ``<|channel>thought\\n ... <channel|>``; a channel with another name (or none) is
  read as thinking too; an unmatched ``<channel|>`` in the answer is dropped;
* a tool call: ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, the arguments in Gemma's
  value syntax (:func:`gemma_value`): strings in ``<|"|>`` quotes, bare keys, JSON numbers,
  ``true``/``false``/``null``, ``[...]`` and ``{...}``; they come out as a JSON object text.
  Tool calls are read only when the request offered tools; a call that does not parse stays in
  the content, as written.

The reply is parsed from the end of the prompt's generation prompt on (:func:`reply_prefix`):
Gemma 4's generation prompt may already close an empty thought channel, and a template may open
one, so what the model writes is only known with it.

Streaming holds back text that may be the start of a marker (``<``, ``<|chan``, ...) until the
next piece tells, so a marker is never sent as content; the stream's parts joined equal
:func:`parse_reply` of the whole text. Pure Python.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

OPEN_CHANNEL, CLOSE_CHANNEL = "<|channel>", "<channel|>"
OPEN_CALL, CLOSE_CALL = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
MODEL_TURN = "<|turn>model\n"
MARKERS = (OPEN_CHANNEL, CLOSE_CHANNEL, OPEN_CALL, CLOSE_CALL, QUOTE, "<|turn>")  # the text a reply must keep
_CHANNEL_NAME = re.compile(r"[A-Za-z_]*\s?")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


@dataclass
class ToolCall:
    """One call, in OpenAI's terms: ``arguments`` is a JSON object's text."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """OpenAI's ``tool_calls[]`` entry (with ``index`` for a stream delta)."""
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


@dataclass
class ReplyDelta:
    """What one streamed piece adds: text of each kind and the tool calls completed by it."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass
class Reply:
    """A whole reply: the answer, the thinking and the tool calls."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        """OpenAI's assistant ``message`` (``content`` None when the reply is only tool calls;
        ``reasoning_content`` only when there was thinking)."""
        msg: dict[str, Any] = {"role": "assistant",
                               "content": self.content if self.content or not self.tool_calls else None}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.openai() for c in self.tool_calls]
        return msg


def reply_prefix(with_prompt: str, without_prompt: str) -> str:
    """The part of the generation prompt the reply's parse starts with: what rendering with
    ``add_generation_prompt`` added after its opening ``<|turn>model`` line (Gemma 4's generation
    prompt may close an empty thought channel there, a template may open one). Empty when the
    generation prompt opens no Gemma 4 model turn (another format, or a model turn going on after
    tool responses) or is not an addition at the end."""
    if not with_prompt.startswith(without_prompt):
        return ""
    added = with_prompt[len(without_prompt):]
    at = added.rfind(MODEL_TURN)
    return added[at + len(MODEL_TURN):] if at >= 0 else ""


class ValueSyntaxError(ValueError):
    """Text that is not a value in Gemma's syntax."""


def gemma_value(text: str) -> Any:
    """A whole value in Gemma's syntax as Python (dicts, lists, str, numbers, bools, None)."""
    value, end = _value(text, 0)
    if text[end:].strip():
        raise ValueSyntaxError(f"unexpected text after the value: {text[end:end + 20]!r}")
    return value


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _value(text: str, i: int) -> tuple[Any, int]:
    i = _skip(text, i)
    if text.startswith(QUOTE, i):
        end = text.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise ValueSyntaxError("an unterminated <|\"|> string")
        return text[i + len(QUOTE):end], end + len(QUOTE)
    if text.startswith("{", i):
        return _dict(text, i + 1)
    if text.startswith("[", i):
        return _list(text, i + 1)
    for word, value in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, i):
            return value, i + len(word)
    m = _NUMBER.match(text, i)
    if m:
        return json.loads(m.group()), m.end()
    raise ValueSyntaxError(f"no value at {text[i:i + 20]!r}")


def _next_item(text: str, i: int, close: str) -> tuple[int, bool]:
    """After an item of a dict or list: past its ``,`` (False) or past the ``close`` (True)."""
    i = _skip(text, i)
    if text.startswith(",", i):
        return i + 1, False
    if text.startswith(close, i):
        return i + 1, True
    raise ValueSyntaxError(f"expected ',' or {close!r} at {text[i:i + 20]!r}")


def _dict(text: str, i: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    i = _skip(text, i)
    if text.startswith("}", i):
        return out, i + 1
    while True:
        i = _skip(text, i)
        if text.startswith(QUOTE, i):  # a quoted key, as tool declarations write them
            key, i = _value(text, i)
        else:
            m = re.compile(r"[^:}]+").match(text, i)
            if not m:
                raise ValueSyntaxError(f"no key at {text[i:i + 20]!r}")
            key, i = m.group().strip(), m.end()
        i = _skip(text, i)
        if not text.startswith(":", i):
            raise ValueSyntaxError(f"no ':' after the key {key!r}")
        out[str(key)], i = _value(text, i + 1)
        i, done = _next_item(text, i, "}")
        if done:
            return out, i


def _list(text: str, i: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    i = _skip(text, i)
    if text.startswith("]", i):
        return out, i + 1
    while True:
        item, i = _value(text, i)
        out.append(item)
        i, done = _next_item(text, i, "]")
        if done:
            return out, i


def parse_call(body: str) -> ToolCall | None:
    """``call:NAME{...}`` (the text between the call markers) as a :class:`ToolCall`, or None."""
    m = re.compile(r"\s*call:([^{\s]+)\s*(?=\{)").match(body)
    if not m:
        return None
    try:
        args = gemma_value(body[m.end():])
    except (ValueSyntaxError, RecursionError):
        return None
    if not isinstance(args, dict):
        return None
    return ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))


def _held(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` may be the start of one of ``markers``."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[-n:]):
                best = n
                break
    return best


class ReplyStream:
    """Splits a reply as it streams: :meth:`feed` each piece of text, then :meth:`finish`.
    ``tools``: whether tool calls are read (the request offered tools)."""

    def __init__(self, tools: bool = False, prefix: str = "") -> None:
        self.tools = tools
        self.state = "content"  # content | header (channel name) | reasoning | call
        self.buf = ""
        self.n_calls = 0
        self._pending = ReplyDelta()
        if prefix:
            self._pending = self.feed(prefix)

    def _markers(self) -> tuple[str, ...]:
        if self.state == "reasoning":
            return (CLOSE_CHANNEL,)
        if self.state == "call":
            return (CLOSE_CALL,)
        return (OPEN_CHANNEL, CLOSE_CHANNEL, OPEN_CALL) if self.tools else (OPEN_CHANNEL, CLOSE_CHANNEL)

    def feed(self, text: str) -> ReplyDelta:
        """The parts ``text`` completes (what may still be a marker's start is held back)."""
        out, self._pending = self._pending, ReplyDelta()
        self.buf += text
        while self._step(out):
            pass
        return out

    def _step(self, out: ReplyDelta) -> bool:
        """Consume what can be decided in the buffer; True when the state changed."""
        if self.state == "header":  # after <|channel>: a name (thought) and one whitespace
            m = _CHANNEL_NAME.match(self.buf)
            assert m is not None
            if m.end() == len(self.buf) and not self.buf.endswith(("\n", " ")):
                return False
            self.buf, self.state = self.buf[m.end():], "reasoning"
            return True
        if self.state == "call":
            end = self.buf.find(CLOSE_CALL)
            if end < 0:
                return False
            body, self.buf = self.buf[:end], self.buf[end + len(CLOSE_CALL):]
            call = parse_call(body)
            if call is None:
                out.content += OPEN_CALL + body + CLOSE_CALL
            else:
                out.tool_calls.append(call)
            self.state = "content"
            return True
        markers = self._markers()
        hits = [(self.buf.find(mk), mk) for mk in markers if self.buf.find(mk) >= 0]
        if not hits:
            keep = _held(self.buf, markers)
            self._emit(out, self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        at, marker = min(hits)
        self._emit(out, self.buf[:at])
        self.buf = self.buf[at + len(marker):]
        self.state = {OPEN_CHANNEL: "header", CLOSE_CHANNEL: "content", OPEN_CALL: "call"}[marker]
        return True

    def _emit(self, out: ReplyDelta, text: str) -> None:
        if self.state == "reasoning":
            out.reasoning += text
        else:
            out.content += text

    def finish(self) -> ReplyDelta:
        """What is left at the end: held-back text as it is, an unterminated call as content."""
        out, self._pending = self._pending, ReplyDelta()
        rest, self.buf = self.buf, ""
        if self.state == "call":
            out.content += OPEN_CALL + rest
        elif self.state == "reasoning" or self.state == "header":
            out.reasoning += rest
        else:
            out.content += rest
        self.state = "content"
        return out


def parse_reply(text: str, *, tools: bool = False, prefix: str = "") -> Reply:
    """``prefix + text`` (see :func:`reply_prefix`) split into a :class:`Reply`."""
    stream = ReplyStream(tools, prefix)
    reply = Reply()
    for delta in (stream.feed(text), stream.finish()):
        reply.content += delta.content
        reply.reasoning += delta.reasoning
        reply.tool_calls += delta.tool_calls
    return reply
