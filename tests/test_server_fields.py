"""Every request field llama-server reads is implemented, refused by name, or a documented no-op
hint here (issue 26, item 4).

The field list is read from the pinned llama.cpp source at test time: the completion schema
(``tools/server/server-schema.cpp``: each ``field_*("name")`` and its ``add_alias``), the OpenAI
parsers (``oaicompat_chat_params_parse`` / ``oaicompat_completion_params_parse`` in
``server-common.cpp``) and the completion handler (``handle_completions_impl`` in
``server-context.cpp``). Each of our routes' request models must implement a field, or
:mod:`mtp_bindings.server.unsupported` must refuse it or list it as a hint. The refusals are then
checked on the real server (``test_server``'s fixture).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from test_server import CHAT, Server, check_error, server

__all__ = ["server"]  # the fixture, used by name
SERVER_SRC = Path(__file__).resolve().parent.parent / "vendor" / "llama.cpp" / "tools" / "server"
pytestmark = pytest.mark.skipif(not (SERVER_SRC / "server-schema.cpp").is_file(),
                                reason="the pinned llama.cpp tree (vendor/) is not unpacked")
CHAT_OK = {"messages": CHAT, "max_tokens": 2, "temperature": 0}
DONE_OK = {"prompt": "def f(x):", "max_tokens": 2, "temperature": 0}


def _function(source: str, signature: str) -> str:
    """The body of the C++ function whose definition starts with ``signature``."""
    start = source.index(signature)
    return source[start:source.index("\n}\n", start)]


def _body_fields(code: str, var: str) -> set[str]:
    """The JSON keys ``code`` reads from the object ``var``."""
    pattern = rf'json_value\({var},\s*"([^"]+)"|\b{var}\.(?:contains|at|count)\("([^"]+)"\)'
    return {a or b for a, b in re.findall(pattern, code)}


def schema_fields() -> tuple[set[str], set[str]]:
    """llama-server's completion schema: (top-level names and aliases, ``stream_options``'s)."""
    code = re.sub(r"^\s*//.*$", "", (SERVER_SRC / "server-schema.cpp").read_text(), flags=re.M)  # not the commented out
    nested = set(re.findall(r'add_subfield\(\(new field_\w+\("([^"]+)"', code))
    names = set(re.findall(r'new field_\w+\("([^"]+)"', code)) | set(re.findall(r'add_alias\("([^"]+)"\)', code))
    return names - nested, nested


def handler_fields() -> set[str]:
    code = _function((SERVER_SRC / "server-context.cpp").read_text(), "server_routes::handle_completions_impl(")
    return _body_fields(code, "data")


def oai_fields(parser: str) -> set[str]:
    code = _function((SERVER_SRC / "server-common.cpp").read_text(), f"json {parser}(")
    return _body_fields(code, "body")


def route_models() -> dict[str, tuple[Any, set[str]]]:
    """Our routes' request models and the fields llama-server reads for the same route."""
    from mtp_bindings.server.llama_completion import NativeCompletionRequest
    from mtp_bindings.server.schemas import ChatCompletionRequest, CompletionRequest

    common = schema_fields()[0] | handler_fields()
    # a chat's prompt is rendered from its messages, in llama-server too (a client's "prompt" is overwritten)
    chat = (common | oai_fields("oaicompat_chat_params_parse")) - {"prompt"}
    return {"/v1/chat/completions": (ChatCompletionRequest, chat),
            "/v1/completions": (CompletionRequest, common | oai_fields("oaicompat_completion_params_parse")),
            "/completion": (NativeCompletionRequest, common)}


def test_the_source_walk_finds_llama_servers_fields() -> None:
    names, nested = schema_fields()
    assert {"temperature", "n_predict", "max_tokens", "n_cmpl", "n", "n_keep", "t_max_predict_ms",
            "return_tokens", "speculative.n_max"} <= names
    assert nested == {"include_usage"}
    assert {"prompt", "id_slot"} <= handler_fields()
    assert {"tools", "tool_choice", "messages", "add_generation_prompt"} <= oai_fields("oaicompat_chat_params_parse")


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/completion"])
def test_every_llama_server_field_is_implemented_refused_or_a_hint(route: str) -> None:
    from mtp_bindings.server.schemas import StreamOptions, request_field_names
    from mtp_bindings.server.unsupported import HINTS, REFUSED

    model, fields = route_models()[route]
    implemented = request_field_names(model)
    missing = sorted(f for f in fields if f not in implemented and f not in REFUSED and f not in HINTS)
    assert not missing, f"{route}: llama-server reads {missing}, which this server neither implements, " \
                        f"refuses nor lists as a hint (mtp_bindings/server/unsupported.py)"
    assert schema_fields()[1] <= set(StreamOptions.model_fields)


def test_no_field_is_both_refused_and_a_hint_or_a_hint_and_implemented() -> None:
    from mtp_bindings.server.schemas import request_field_names
    from mtp_bindings.server.unsupported import HINTS, REFUSED

    assert not set(REFUSED) & set(HINTS)
    for route, (model, _) in route_models().items():
        assert not set(HINTS) & request_field_names(model), route


# ------------------------------------------------------------------------------------------------
# the refusals, on the real server
# ------------------------------------------------------------------------------------------------

ISSUE_FIELDS = [("n_cmpl", 2), ("t_max_predict_ms", 500), ("n_keep", 8), ("n_indent", 4), ("return_tokens", True),
                ("modalities", ["text", "audio"]), ("prediction", {"type": "content", "content": "x"})]


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", CHAT_OK), ("/v1/completions", DONE_OK)],
                         ids=["chat", "completions"])
@pytest.mark.parametrize("field,value", ISSUE_FIELDS, ids=[f for f, _ in ISSUE_FIELDS])
def test_a_field_llama_server_reads_but_we_lack_is_refused_by_name(server: Server, path: str, body: dict[str, Any],
                                                                   field: str, value: Any) -> None:
    with server.client() as c:
        err = check_error(c.post(path, json={**body, field: value}), 400, "unsupported_parameter", field)
    assert err["message"].startswith(f"{field}: ") and "not supported" in err["message"]


def test_the_off_values_of_refused_fields_pass(server: Server) -> None:
    body = {**CHAT_OK, "n_cmpl": 1, "t_max_predict_ms": -1, "n_keep": 0, "n_indent": 0, "return_tokens": False,
            "modalities": ["text"], "prediction": None, "add_generation_prompt": True,
            "reasoning_budget_tokens": -1}
    with server.client() as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def test_a_hint_field_is_accepted_and_changes_nothing(server: Server) -> None:
    body = {**DONE_OK, "max_tokens": 6}
    with server.client() as c:
        plain = c.post("/v1/completions", json=body)
        hinted = c.post("/v1/completions", json={**body, "id_slot": 1, "n_discard": 4, "speculative.p_min": 0.5,
                                                 "mirostat_tau": 3.0, "verbose": True})
    assert plain.status_code == hinted.status_code == 200, hinted.text
    assert hinted.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]


def test_native_completion_implements_return_tokens_and_n_probs(server: Server) -> None:
    with server.client() as c:
        r = c.post("/completion", json={**DONE_OK, "n_predict": 4, "return_tokens": True, "n_probs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["tokens"]) == body["tokens_predicted"] == len(body["completion_probabilities"]) == 4
    assert [p["id"] for p in body["completion_probabilities"]] == body["tokens"]
    assert all(len(p["top_logprobs"]) == 2 for p in body["completion_probabilities"])


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                  {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}],
                         ids=["image", "audio"])
def test_a_chat_part_that_is_not_text_is_refused_as_text_only(server: Server, part: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    with server.client() as c:
        err = check_error(c.post("/v1/chat/completions", json={**CHAT_OK, "messages": messages}), 400,
                          "unsupported_parameter", "messages.0.content.1")
    assert "this model takes text only" in err["message"]
