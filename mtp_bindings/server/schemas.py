"""The request bodies the server accepts, as pydantic models, and how a body becomes one.

One job: say what a valid request is. Field names are OpenAI's, plus llama-server's extras;
types are strict (``"0.5"`` is not a number, ``true`` is not an int) so that a client bug is a
400 rather than a silently different generation, and ``null`` means "the default".
:func:`parse_body` turns bad JSON and validation errors into OpenAI-style 400s.

Bounds have one source: a field that is a library parameter takes its range from
:mod:`mtp_bindings.config.params` (:func:`library_range`), narrowed only where OpenAI documents a
narrower one (temperature 0..2, penalties -2..2). The request-only rules are here: ``-1`` for
llama.cpp's "random seed" and "the whole context" (``seed``, ``repeat_last_n``), ``logit_bias``
in OpenAI's -100..100, at most 16 stop strings, one choice. A chat's messages and tools are
:mod:`.chat_schemas`'; the strictness every model shares, :mod:`.strict`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import fields
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from ..exceptions import InvalidParameterError
from ..config.params import LOGPROBS_MAX, DraftParams, SamplingParams
from ..generation.constraint import Grammar
from .chat_schemas import ChatMessage, FunctionCall, FunctionDef, TextPart, ToolCallIn, ToolDef
from .errors import APIError
from .strict import STRICT
from .structured import JSONSchemaFormat, ResponseFormat, request_grammar
from .unsupported import refuse_unsupported

OPENAI_TEMPERATURE_MAX = 2.0  # OpenAI's documented ranges, narrower than the library's
OPENAI_PENALTY_RANGE = (-2.0, 2.0)


def library_range(cls: type, name: str, lo: float | None = None, hi: float | None = None) -> dict[str, float]:
    """pydantic bounds (``ge``/``gt``, ``le``) for a request field that is the library's parameter
    ``name`` of ``cls`` (a dataclass of :mod:`mtp_bindings.config.params`): the ``min``/``max`` of its
    metadata, with ``lo``/``hi`` narrowing them. A minimum is exclusive when the library refuses
    the minimum itself (``top_p`` 0): the library, not a second table here, says so."""
    meta = next(f.metadata for f in fields(cls) if f.name == name)
    bounds: dict[str, float] = {}
    low = meta.get("min") if lo is None else lo
    if low is not None:
        bounds["gt" if low == meta.get("min") and not _accepts(cls, name, low) else "ge"] = low
    high = meta.get("max") if hi is None else hi
    if high is not None:
        bounds["le"] = high
    return bounds


def _accepts(cls: type, name: str, value: float) -> bool:
    try:
        obj = cls(**{name: value})
        getattr(obj, "validate", lambda: None)()
    except InvalidParameterError:
        return False
    return True


def _sampling(name: str, **narrow: float) -> Any:
    bounds: dict[str, Any] = library_range(SamplingParams, name, **narrow)
    return Field(None, **bounds)


def _draft_n_max(**kwargs: Any) -> Any:
    return Field(None, **{**kwargs, **library_range(DraftParams, "draft_n_max")})


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = None


class SpeculativeOptions(BaseModel):
    """llama-server's ``speculative`` object; only ``n_max`` is used (``n_min``/``p_min`` ignored)."""

    model_config = STRICT
    n_max: int | None = _draft_n_max()


class GenerationRequest(BaseModel):
    """Fields shared by chat and text completions (OpenAI names plus llama-server extras).

    Strict types (``"0.5"`` is not a number, ``true`` is not an int) so that a client bug is a
    400 rather than a silently different generation; ``null`` means "the default"."""

    model_config = STRICT

    model: str | None = None
    # llama-server's bounds for all three (its n_predict and the two aliases): -1 is the server's limit,
    # 0 generates nothing (the prompt is still decoded into the slot's cache)
    max_tokens: int | None = Field(None, ge=-1)
    max_completion_tokens: int | None = Field(None, ge=-1)  # OpenAI's newer name; llama-server takes it everywhere
    n_predict: int | None = Field(None, ge=-1)
    temperature: float | None = _sampling("temperature", hi=OPENAI_TEMPERATURE_MAX)
    top_p: float | None = _sampling("top_p")
    top_k: int | None = _sampling("top_k")
    min_p: float | None = _sampling("min_p")
    repeat_penalty: float | None = _sampling("repeat_penalty")
    repeat_last_n: int | None = _sampling("repeat_last_n", lo=-1)  # -1: the whole context
    presence_penalty: float | None = _sampling("presence_penalty", lo=OPENAI_PENALTY_RANGE[0],
                                               hi=OPENAI_PENALTY_RANGE[1])
    frequency_penalty: float | None = _sampling("frequency_penalty", lo=OPENAI_PENALTY_RANGE[0],
                                                hi=OPENAI_PENALTY_RANGE[1])
    seed: int | None = _sampling("seed", lo=-1, hi=2**63 - 1)  # -1: a random seed; at most int64's
    typical_p: float | None = _sampling("typical_p")
    top_n_sigma: float | None = _sampling("top_n_sigma")
    xtc_probability: float | None = _sampling("xtc_probability")
    xtc_threshold: float | None = _sampling("xtc_threshold")
    dry_multiplier: float | None = _sampling("dry_multiplier")
    dry_base: float | None = _sampling("dry_base")  # below 1: the default, as llama-server (see params.py)
    dry_allowed_length: int | None = _sampling("dry_allowed_length")
    dry_penalty_last_n: int | None = _sampling("dry_penalty_last_n")  # -1: the whole context
    dry_sequence_breakers: list[str] | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    logit_bias: dict[str, float] | None = None
    draft_n_max: int | None = _draft_n_max()
    speculative: SpeculativeOptions | bool | None = None  # false: plain decoding for this request
    speculative_n_max: int | None = _draft_n_max(alias="speculative.n_max")
    response_format: ResponseFormat | None = None  # structured output (see structured.py)
    grammar: str | None = None  # llama-server's: GBNF (or Lark)
    json_schema: dict[str, Any] | None = None  # llama-server's: a JSON schema
    ignore_eos: bool | None = None  # llama-server's: end-of-generation tokens banned (a logit bias, as there)
    cache_prompt: bool | None = None  # llama-server's: reuse the slot's KV of the common prefix (None: the server's)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("this server generates one choice per request: n must be 1")
        return v

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    @field_validator("dry_sequence_breakers")
    @classmethod
    def _breakers(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or not all(v)):  # llama-server's rule: a non-empty array of strings
            raise ValueError("dry_sequence_breakers must be a non-empty array of non-empty strings")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for tok, bias in (v or {}).items():
            if not tok.isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {tok!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias!r} for token {tok}")
        return v

    def token_bias(self, n_vocab: int) -> dict[int, float] | None:
        """``logit_bias`` with int keys, or an :class:`APIError` for ids outside the vocabulary."""
        if not self.logit_bias:
            return None
        bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        bad = [k for k in bias if k >= n_vocab]
        if bad:
            raise APIError(400, f"logit_bias: token id {bad[0]} is outside the vocabulary [0, {n_vocab})",
                           param="logit_bias", code="invalid_value")
        return bias

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        """The first given of ``n_predict``, ``max_completion_tokens``, ``max_tokens`` (llama-server's
        order); None (nothing given, or -1): the server's limit."""
        for limit in (self.n_predict, self.max_completion_tokens, self.max_tokens):
            if limit is not None:
                return None if limit < 0 else limit
        return None

    def requested_logprobs(self) -> int | None:
        """Alternatives per token to report with its logprob; None: no logprobs."""
        return None

    def requested_draft_n_max(self) -> int | None:
        """The request's drafts per round: 0 for ``speculative: false``, else ``draft_n_max``,
        ``speculative.n_max`` (nested or flat); None: the server's default."""
        if self.speculative is False:
            return 0
        if self.draft_n_max is not None:
            return self.draft_n_max
        if isinstance(self.speculative, SpeculativeOptions) and self.speculative.n_max is not None:
            return self.speculative.n_max
        return self.speculative_n_max

    def requested_grammar(self) -> Grammar | None:
        """The grammar the output must follow (``response_format``, ``grammar`` or
        ``json_schema``), or None; a 400 naming the field when it does not compile."""
        return request_grammar(self.response_format, self.grammar, self.json_schema)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=LOGPROBS_MAX)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto"] | None = None  # "required" / a named function: refused (unsupported.py)
    parallel_tool_calls: bool | None = None  # a hint: every call the model writes is returned
    chat_template_kwargs: dict[str, Any] | None = None

    def requested_logprobs(self) -> int | None:
        if self.logprobs:
            return self.top_logprobs or 0
        if self.top_logprobs:
            raise APIError(400, "top_logprobs: needs logprobs set to true", param="top_logprobs",
                           code="invalid_value")
        return None

    def template_tools(self) -> list[dict[str, Any]] | None:
        """``tools`` for the chat template (None when there are none)."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    @property
    def reads_tool_calls(self) -> bool:
        """Whether the reply's tool calls are parsed: tools offered and ``tool_choice`` not none."""
        return bool(self.tools) and self.tool_choice != "none"


class PromptRequest(GenerationRequest):
    """A request with one prompt: a string, a list of one string, or token ids (OpenAI's
    ``/v1/completions`` and llama-server's ``/completion``)."""

    prompt: str | list[str] | list[int]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list) and not v:
            raise ValueError("the prompt is empty")
        if isinstance(v, list) and isinstance(v[0], str) and len(v) != 1:
            raise ValueError("this server takes one prompt per request (a string, a list of one string, "
                             "or a list of token ids)")
        return v


class CompletionRequest(PromptRequest):
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=LOGPROBS_MAX)  # alternatives per token (0: the token's only)
    best_of: int | None = None
    suffix: str | None = None

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("best_of must be 1")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (insertion) is not supported by this server")
        return v


@functools.cache
def request_field_names(model: type[BaseModel]) -> frozenset[str]:
    """The top-level fields (names and aliases) a request model implements."""
    return frozenset(n for name, f in model.model_fields.items() for n in (name, f.alias) if n)


def _field_names(*models: type[BaseModel]) -> frozenset[str]:
    """Every field name and alias of the request models (to tell them from pydantic's union tags
    in an error location)."""
    names: set[str] = set()
    for m in models:
        for name, f in m.model_fields.items():
            names.add(name)
            if f.alias:
                names.add(f.alias)
    return frozenset(names)


_FIELD_NAMES = _field_names(ChatCompletionRequest, CompletionRequest, ChatMessage, TextPart, StreamOptions,
                            SpeculativeOptions, ToolDef, FunctionDef, ToolCallIn, FunctionCall)

_FIELD_NAMES |= _field_names(ResponseFormat, JSONSchemaFormat)


def _error_param(loc: Iterable[Any]) -> str | None:
    parts = [str(p) for p in loc if isinstance(p, int) or p in _FIELD_NAMES]
    return ".".join(parts) or None


def _error_code(kind: str) -> str:
    if kind == "missing":
        return "missing_required_parameter"
    if kind.endswith("_type") or kind.endswith("_parsing") or kind in ("int_from_float", "union_tag_invalid"):
        return "invalid_type"
    return "invalid_value"


def validation_error(e: ValidationError) -> APIError:
    """The first problem of a pydantic error, as an OpenAI-style 400."""
    err = e.errors(include_url=False)[0]
    param = _error_param(err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "model_type" and not param:
        msg = "the request body must be a JSON object"
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code=_error_code(err["type"]))


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """The request body as ``model``, or an :class:`APIError` 400 (bad JSON, a field we do not
    implement that would change the output, wrong types)."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"could not parse the request body as JSON: {e}", code="invalid_json") from None
    refuse_unsupported(data, request_field_names(model))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")
