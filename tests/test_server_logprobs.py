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


# ------------------------------------------------------------------------------------------------
# a stop string: its tokens are in neither the logprobs nor the usage (issue 26, item 10)
# ------------------------------------------------------------------------------------------------

def stop_at_a_token(reference: Any) -> tuple[str, str, int]:
    """A stop string that starts exactly at a generated token's text (its first occurrence), the
    text before it, and how many tokens that text holds."""
    ref = ref_generate(reference, PROMPT, max_tokens=N, draft_n_max=0)
    start = 0
    for j, t in enumerate(ref.tokens):
        piece = reference.token_to_piece(t)
        text = ref.text.encode()[:start].decode("utf-8", errors="strict") if j else ""
        if j >= 3 and piece.strip() and piece.isascii() and ref.text.find(piece.decode()) == len(text):
            return piece.decode(), text, j
        start += len(piece)
    pytest.fail(f"no token of {ref.text!r} starts a first occurrence of its own text")


def test_a_stop_strings_tokens_leave_the_logprobs_and_the_usage(server: Server, reference: Any) -> None:
    stop, text, n = stop_at_a_token(reference)
    body = post(server, "/v1/completions", {"prompt": PROMPT, "logprobs": 1, "stop": [stop]})
    choice = body["choices"][0]
    assert choice["text"] == text and choice["finish_reason"] == "stop"
    assert len(choice["logprobs"]["tokens"]) == n and "".join(choice["logprobs"]["tokens"]) == text
    assert body["usage"]["completion_tokens"] == n


def test_a_streamed_stop_strings_tokens_leave_the_logprobs_and_the_usage(server: Server, reference: Any) -> None:
    stop, text, n = stop_at_a_token(reference)
    with server.client() as c:
        with c.stream("POST", "/v1/completions",
                      json={"prompt": PROMPT, "max_tokens": N, "temperature": 0, "stream": True, "logprobs": 0,
                            "stop": stop}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
    tokens = [t for ch in chunks for t in (ch["choices"][0]["logprobs"] or {}).get("tokens", [])]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == text
    assert len(tokens) == n and "".join(tokens) == text
    assert chunks[-1]["usage"]["completion_tokens"] == n


def test_a_chat_stop_strings_tokens_leave_the_logprobs_and_the_usage(server: Server, reference: Any) -> None:
    ref = ref_chat(reference, CHAT, max_tokens=N, draft_n_max=0)
    stop = ref.text[len(ref.text) // 2:][:3]
    kept = ref.text[:ref.text.index(stop)]
    body = post(server, "/v1/chat/completions", {"messages": CHAT, "logprobs": True, "stop": stop})
    entries = body["choices"][0]["logprobs"]["content"]
    assert body["choices"][0]["message"]["content"] == kept
    assert b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", errors="replace").startswith(kept)
    assert body["usage"]["completion_tokens"] == len(entries) < len(ref.tokens)
    assert not b"".join(bytes(e["bytes"]) for e in entries[:-1]).decode("utf-8", errors="replace") \
        .endswith(stop) and len(b"".join(bytes(e["bytes"]) for e in entries[:-1])) < len(kept.encode())
