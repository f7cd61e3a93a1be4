"""Server-sent events: a generation streamed as ``data: {chunk}`` lines, then ``data: [DONE]``.

One job: turn a job's pieces into SSE bytes (a chat's split into content, reasoning and tool-call
deltas by :class:`~mtp_bindings.chat.reply.ReplyStream`), and make sure a stream that ends for any
reason (finished, client gone, server error) cancels its job, so a slot never generates for nobody.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from .accounting import TextTokens
from .errors import generation_error
from .responses import Reply
from .slots import END, Job


def sse(payload: dict[str, Any] | str) -> bytes:
    """One event: ``payload`` as compact JSON (or as is, for ``[DONE]``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def events(job: Job, first: Any, reply: Reply, include_usage: bool, echo: str,
                 ledger: TextTokens) -> AsyncIterator[bytes]:
    """SSE chunks: the opening (role / echoed prompt), text deltas, the close and ``[DONE]``.
    An error after the stream started is sent as an error event after the text so far. A token's
    logprob goes out with the chunk after its text has (``ledger``): one holding a stop string
    never does."""
    splitter = reply.stream()
    if reply.chat:
        yield sse(reply.chunk("", role=True))
    elif echo:
        yield sse(reply.chunk(echo))
    item = first
    while item is not END:
        if isinstance(item, Exception):
            yield sse((job.error or generation_error(item)).body())
            return
        released = ledger.feed(str(item), item.tokens, item.logprobs)
        if item.stats is not None:
            released += ledger.finish()
        lps = released if reply.piece is not None else None
        if splitter is None:
            if item or released:
                yield sse(reply.chunk(str(item), lps=lps))
        else:  # content, reasoning and tool calls; text that may start a marker waits for the next piece
            delta = splitter.feed(str(item))
            if item.stats is not None:
                end = splitter.finish()
                delta.content, delta.reasoning = delta.content + end.content, delta.reasoning + end.reasoning
                delta.tool_calls += end.tool_calls
            if delta or released:
                yield sse(reply.chunk(delta.content, lps=lps, reasoning=delta.reasoning,
                                      tool_calls=delta.tool_calls))
        if item.stats is not None:
            if job.error is not None:  # stopped by the server: say why instead of a normal end
                yield sse(job.error.body())
                return
            for chunk in reply.final_chunks(item.stats, item.finish_reason, include_usage, ledger.n_kept):
                yield sse(chunk)
        item = await job.items.get()
    yield sse("[DONE]")


class JobStreamingResponse(StreamingResponse):
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
