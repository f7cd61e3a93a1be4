"""Structured output in a request: OpenAI's ``response_format`` and llama-server's ``grammar`` /
``json_schema`` fields, turned into the one :class:`~mtp_bindings.generation.constraint.Grammar`
the generation follows (issue 16, item 3).

One job: read what the request asks for and compile it, or answer a 400 naming the field and
the problem. What is honoured:

* ``response_format: {"type": "text"}`` (or absent): no constraint;
* ``{"type": "json_object"}``: any JSON object (with llama-server's extension ``"schema"``, that
  schema instead);
* ``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``: JSON
  valid under ``schema`` (none: any JSON value, as llama-server). The schema is always enforced,
  ``strict`` true or false: enforcing is what ``strict: true`` asks, and with ``strict: false``
  (OpenAI's best effort) an enforced schema is still an answer the client asked for;
* ``grammar``: a GBNF grammar (llama.cpp's, start rule ``root``) or a Lark grammar (llguidance's);
* ``json_schema``: llama-server's top-level schema field.

At most one of them may ask for a constraint. A schema or grammar the engine cannot compile is
a 400 whose message names the problem.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..exceptions import InvalidParameterError
from ..generation.constraint import Grammar
from .errors import APIError

_CONFIG = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False, populate_by_name=False)


class JSONSchemaFormat(BaseModel):
    """OpenAI's ``response_format.json_schema`` object."""

    model_config = _CONFIG
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format`` (``schema``: llama-server's schema for ``json_object``)."""

    model_config = _CONFIG
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")


def request_grammar(response_format: ResponseFormat | None, grammar: str | None,
                    json_schema: dict[str, Any] | None) -> Grammar | None:
    """The grammar a request's structured-output fields ask for, or None; an :class:`APIError`
    400 (naming the field) when more than one asks for one, or when one does not compile."""
    asked = [name for name, on in (("response_format", response_format is not None and response_format.type != "text"),
                                   ("grammar", bool(grammar)), ("json_schema", json_schema is not None)) if on]
    if len(asked) > 1:
        raise APIError(400, f"{asked[0]} and {asked[1]} both ask for structured output: give one",
                       param=asked[1], code="invalid_value")
    if not asked:
        return None
    if asked[0] == "grammar":
        assert grammar is not None
        return _compiled(lambda: Grammar.from_gbnf(grammar), "grammar")
    if asked[0] == "json_schema":
        assert json_schema is not None
        return _compiled(lambda: Grammar.from_json_schema(json_schema), "json_schema")
    assert response_format is not None
    if response_format.type == "json_object":
        schema = response_format.schema_
        if schema is None:
            return _compiled(Grammar.json_object, "response_format")
        return _compiled(lambda: Grammar.from_json_schema(schema), "response_format.schema")
    spec = response_format.json_schema
    if spec is None:
        raise APIError(400, "response_format: type json_schema needs a json_schema object",
                       param="response_format.json_schema", code="missing_required_parameter")
    schema = {} if spec.schema_ is None else spec.schema_
    return _compiled(lambda: Grammar.from_json_schema(schema), "response_format.json_schema.schema")


def _compiled(build: Any, param: str) -> Grammar:
    try:
        return build()  # type: ignore[no-any-return]
    except InvalidParameterError as e:
        raise APIError(400, f"{param}: {e}", param=param, code="invalid_value") from None
