"""Structured output on the real server (issue 16, item 3): OpenAI's ``response_format``
(``json_object``, ``json_schema``, the ``openai`` client's ``parse`` with a pydantic model) and
llama-server's ``grammar`` / ``json_schema`` fields, over loopback, streamed and not; a schema
or grammar that does not compile is a 400 naming the field.

The server drafts (when this build can attach the assistant); the reference is the same model
in-process decoding plainly with the same constraint: the texts must be equal at temperature 0.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from test_server import CHAT, PROMPTS, Server, check_error, ref_chat, ref_generate, reference, server

pytest.importorskip("llguidance")

__all__ = ["reference", "server"]  # fixtures used by name
N = 200
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "admin"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "admin": {"type": "boolean"}}}


def _valid(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert isinstance(value, dict) and set(value) == {"name", "age", "admin"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 8
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 150 and isinstance(value["admin"], bool)
    return value


def test_chat_json_schema_with_the_openai_client(server: Server, reference: Any) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}
    resp = server.openai().chat.completions.create(model="any", messages=CHAT, max_tokens=N, temperature=0,
                                                   response_format=fmt)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    _valid(choice.message.content)
    # exact: the server's drafting and the in-process plain run are one computation (tests/numerics.py)
    assert choice.message.content == ref_chat(reference, CHAT, max_tokens=N, draft_n_max=0, json_schema=SCHEMA).text


def test_chat_parse_into_a_pydantic_model(server: Server) -> None:
    from pydantic import BaseModel

    class User(BaseModel):
        name: str
        age: int
        admin: bool

    resp = server.openai().chat.completions.parse(model="any", messages=CHAT, max_tokens=N, temperature=0,
                                                  response_format=User)
    user = resp.choices[0].message.parsed
    assert isinstance(user, User)


def test_streamed_json_object(server: Server) -> None:
    chunks = list(server.openai().chat.completions.create(
        model="any", messages=CHAT, max_tokens=N, temperature=0, stream=True,
        response_format={"type": "json_object"}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_completion_grammar_and_json_schema_fields(server: Server, reference: Any) -> None:
    grammar = 'root ::= "yes" | "no" | "maybe"'
    resp = server.openai().completions.create(model="any", prompt=PROMPTS[0], max_tokens=N, temperature=0,
                                              extra_body={"grammar": grammar})
    assert resp.choices[0].text == ref_generate(reference, PROMPTS[0], max_tokens=N, grammar=grammar).text
    assert resp.choices[0].text in ("yes", "no", "maybe")
    resp = server.openai().completions.create(model="any", prompt=PROMPTS[0], max_tokens=N, temperature=0,
                                              extra_body={"json_schema": SCHEMA})
    _valid(resp.choices[0].text)


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object", "schema": {"type": "object", "required": 3}}},
     "response_format.schema"),
    ({"grammar": 'root ::= "a" ('}, "grammar"),
    ({"json_schema": {"type": "string", "format": "no-such-format"}}, "json_schema"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
])
def test_an_invalid_constraint_is_a_400_naming_the_field(server: Server, body: dict[str, Any], param: str) -> None:
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4, **body})
    err = check_error(r, 400, param=param)
    assert err["code"] in ("invalid_value", "missing_required_parameter")


def test_an_unknown_response_format_type_is_a_400(server: Server) -> None:
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4,
                                                 "response_format": {"type": "yaml"}})
    check_error(r, 400, param="response_format.type")


def test_the_text_response_format_asks_for_nothing(server: Server, reference: Any) -> None:
    resp = server.openai().chat.completions.create(model="any", messages=CHAT, max_tokens=16, temperature=0,
                                                   response_format={"type": "text"})
    assert resp.choices[0].message.content == ref_chat(reference, CHAT, max_tokens=16).text
