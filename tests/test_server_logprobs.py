"""OpenAI ``logprobs`` on the real server (issue 16, item 4): chat's ``logprobs``/``top_logprobs``
and text completions' ``logprobs`` (the number of alternatives), streamed and not.

The server drafts (when this build can attach the assistant); the reference is the same model
in-process decoding plainly (``draft_n_max=0``): one computation (a verify batch's rows are one-token
decodes' rows; JSON carries a float exactly), so the logprobs are compared with ``==``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from test_server import CHAT, Server, check_error, ref_chat, ref_generate, reference, server

__all__ = ["reference", "server"]  # fixtures used by name
PROMPT = "def parse_args(argv):\n"
N = 16
K = 3


def post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as c:
        r = c.post(path, json={"max_tokens": N, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream(server: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream's chunks that have a choice."""
    chunks = []
    with server.client() as c:
        with c.stream("POST", path, json={"max_tokens": N, "temperature": 0, "stream": True, **body}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk["choices"]:
                        chunks.append(chunk)
    return chunks


def check_chat_entries(entries: list[dict[str, Any]], ref: Any, k: int) -> None:
    assert len(entries) == len(ref.tokens)
    for e, lp in zip(entries, ref.logprobs):
        assert e["logprob"] == lp.logprob
        assert bytes(e["bytes"]).decode("utf-8", errors="replace") == e["token"]
        assert len(e["top_logprobs"]) == k
        assert [t["logprob"] for t in e["top_logprobs"]] == [v for _, v in lp.top]


def test_chat_logprobs_equal_plain_decoding(server: Server, reference: Any) -> None:
    body = post(server, "/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": K})
    ref = ref_chat(reference, CHAT, max_tokens=N, draft_n_max=0, logprobs=K)
    assert body["choices"][0]["message"]["content"] == ref.text
    check_chat_entries(body["choices"][0]["logprobs"]["content"], ref, K)


def test_chat_stream_logprobs_equal_plain_decoding(server: Server, reference: Any) -> None:
    chunks = stream(server, "/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": K})
    entries = [e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    check_chat_entries(entries, ref_chat(reference, CHAT, max_tokens=N, draft_n_max=0, logprobs=K), K)


def test_completion_logprobs_equal_plain_decoding(server: Server, reference: Any) -> None:
    body = post(server, "/v1/completions", {"prompt": PROMPT, "logprobs": K})
    ref = ref_generate(reference, PROMPT, max_tokens=N, draft_n_max=0, logprobs=K)
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ref.tokens) and "".join(lp["tokens"]) == body["choices"][0]["text"]
    assert lp["token_logprobs"] == [b.logprob for b in ref.logprobs]
    assert all(len(top) == K for top in lp["top_logprobs"])
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]


def test_completion_stream_logprobs_equal_plain_decoding(server: Server, reference: Any) -> None:
    chunks = stream(server, "/v1/completions", {"prompt": PROMPT, "logprobs": K})
    values = [v for c in chunks if c["choices"][0]["logprobs"] for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    ref = ref_generate(reference, PROMPT, max_tokens=N, draft_n_max=0, logprobs=K)
    assert len(values) == len(ref.tokens)
    assert values == [b.logprob for b in ref.logprobs]


def test_no_logprobs_unless_asked(server: Server) -> None:
    assert post(server, "/v1/completions", {"prompt": PROMPT})["choices"][0]["logprobs"] is None
    assert post(server, "/v1/chat/completions", {"messages": CHAT})["choices"][0]["logprobs"] is None


def test_top_logprobs_without_logprobs_is_400(server: Server) -> None:
    with server.client() as c:
        check_error(c.post("/v1/chat/completions", json={"messages": CHAT, "top_logprobs": 2}), 400,
                    "invalid_value", "top_logprobs")


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": -1}, "logprobs"),
], ids=["chat-top-21", "text-21", "text-negative"])
def test_too_many_alternatives_is_400(server: Server, path: str, body: dict[str, Any], param: str) -> None:
    with server.client() as c:
        check_error(c.post(path, json=body), 400, "invalid_value", param)


def test_openai_client_reads_chat_logprobs(server: Server) -> None:
    reply = server.openai().chat.completions.create(model="m", messages=CHAT, max_tokens=4, temperature=0,
                                                     logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
