"""The one table of request fields this server does not implement: each is refused by name
(it would change the output) or is a documented no-op hint (issue 16, item 6; issue 26, item 4).

One job: look at a request body before it is validated and answer 400 ``unsupported_parameter``,
naming the field, when it asks for something the generation would not do (a chat message's image,
audio or file part included: the model takes text only). Every request field
llama-server reads at our pin (``tools/server/server-schema.cpp`` and the OpenAI parsers in
``server-common.cpp``) is either a field of the route's request model (:mod:`.schemas`:
implemented), in :data:`REFUSED`, or in :data:`HINTS`; ``tests/test_server_fields.py`` walks the
pinned source to keep it so. A field a route's model implements is never refused on that route
(``n_probs`` and ``return_tokens`` are llama-server's ``/completion`` fields; the OpenAI routes
have ``logprobs`` instead).

A refused field's "off" value passes, since clients send defaults: ``null`` always, and either
the entry's own ``off`` values or, without them, ``false`` / ``0`` / ``""`` / ``[]`` / ``{}``.
Any field in neither table nor a model (``user``, ``service_tier``, ``store``, ``metadata``, ...)
is an OpenAI-side hint and is ignored, since OpenAI clients send extras.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ..config.params import SAMPLER_ORDER
from .errors import APIError

_NEGATIVE_OFF = "negative"  # an ``off`` marker: any negative number asks for nothing


@dataclass(frozen=True)
class Refusal:
    """What a refused field would ask for (said in the error) and the values that ask for nothing
    (None: false / 0 / "" / [] / {}; ``null`` always passes)."""

    what: str
    off: tuple[Any, ...] | None = None
    partial: bool = False  # a route's model takes only the off values: checked on that route too


REFUSED: dict[str, Refusal] = {
    # OpenAI's
    "functions": Refusal("function calls (use tools)"),
    "function_call": Refusal("function calls (use tools)"),
    "tool_choice": Refusal("forcing a tool call (only 'auto' and 'none')", ("auto", "none"), partial=True),
    "modalities": Refusal("output other than text", (["text"], [])),
    "audio": Refusal("audio output"),
    "prediction": Refusal("predicted outputs"),
    "reasoning_effort": Refusal("a reasoning effort (use chat_template_kwargs)"),
    "echo": Refusal("echoing the prompt (text completions only)"),
    # llama-server's: samplers we do not have
    "n_probs": Refusal("token probabilities in llama-server's shape (use logprobs / top_logprobs)"),
    "post_sampling_probs": Refusal("post-sampling probabilities"),
    "mirostat": Refusal("the mirostat sampler"),
    "dynatemp_range": Refusal("dynamic temperature"),
    "adaptive_target": Refusal("the adaptive-p sampler", (_NEGATIVE_OFF,)),
    "min_keep": Refusal("a minimum of tokens kept by the samplers"),
    # llama-server's own order (the one this server runs, see params.SAMPLER_ORDER) asks for nothing else
    "samplers": Refusal("a custom sampler chain", (list(SAMPLER_ORDER),)),
    "lora": Refusal("LoRA adapters"),
    "grammar_lazy": Refusal("a lazily triggered grammar"),
    "grammar_triggers": Refusal("grammar triggers"),
    "preserved_tokens": Refusal("preserved tokens of a lazy grammar"),
    # llama-server's: length, prompt and response controls
    "n_cmpl": Refusal("several completions per request", (1,)),
    "t_max_predict_ms": Refusal("a time limit on generation", (0, -1)),
    "n_keep": Refusal("keeping prompt tokens on a context shift (this server never shifts)", (0, -1)),
    "n_indent": Refusal("a minimum line indentation"),
    "return_tokens": Refusal("token ids in the response (llama-server's /completion has them)"),
    "return_progress": Refusal("prompt progress events"),
    "timings_per_token": Refusal("timings in every chunk (the last one has them)"),
    "response_fields": Refusal("a subset of the response's fields"),
    "continue_final_message": Refusal("continuing the last assistant message"),
    "add_generation_prompt": Refusal("a prompt without the assistant's turn", (True,)),
    "reasoning_format": Refusal("a reasoning format other than the split into reasoning_content",
                                ("auto", "deepseek")),
    "reasoning_budget_tokens": Refusal("a reasoning budget", (-1,)),
    "thinking_budget_tokens": Refusal("a reasoning budget", (-1,)),
    "reasoning_control": Refusal("reasoning control"),
}

# field -> why ignoring it changes nothing in the returned text (the README's server section lists them)
HINTS: dict[str, str] = {
    "id_slot": "the slot: requests go to the free slot holding the longest prefix of their prompt",
    "verbose": "debug output",
    "sse_ping_interval": "keep-alive comments between stream events",
    "n_discard": "tokens dropped on a context shift; this server never shifts (an overflow is a 400)",
    "n_cache_reuse": "KV-shift cache reuse: speed only (the prompt cache keeps the common prefix)",
    "backend_sampling": "where sampling runs: speed only",
    "speculative.n_min": "a drafting bound: speculative decoding changes the speed, not the text",
    "speculative.p_min": "a drafting bound: speculative decoding changes the speed, not the text",
    "speculative.type": "the draft type: speculative decoding changes the speed, not the text",
    "speculative.ngram_size_n": "n-gram drafting, which this server does not use",
    "speculative.ngram_size_m": "n-gram drafting, which this server does not use",
    "speculative.ngram_min_hits": "n-gram drafting, which this server does not use",
    "mirostat_tau": "tunes mirostat, which is refused when switched on",
    "mirostat_eta": "tunes mirostat, which is refused when switched on",
    "dynatemp_exponent": "tunes dynamic temperature, which is refused when switched on",
    "adaptive_decay": "tunes adaptive-p, which is refused when switched on",
    "reasoning_budget_start_tag": "tunes the reasoning budget, which is refused when set",
    "reasoning_budget_end_tags": "tunes the reasoning budget, which is refused when set",
    "reasoning_budget_end_tag": "tunes the reasoning budget, which is refused when set",
    "reasoning_budget_message": "tunes the reasoning budget, which is refused when set",
    "chat_format": "set by llama-server's chat route from the template; this server reads the template",
    "chat_parser": "set by llama-server's chat route from the template; this server reads the template",
    "generation_prompt": "set by llama-server's chat route from the template; this server reads the template",
    "parse_tool_calls": "set by llama-server's chat route; tool calls are parsed when tools are offered",
    "message_delimiters": "set by llama-server's chat route from the template; this server reads the template",
}


def refuse_unsupported(body: Any, implemented: Collection[str] = ()) -> None:
    """Raise a 400 :class:`APIError` naming the first field of ``body`` (a decoded JSON object)
    that asks for something this server does not do; fields in ``implemented`` (the route's
    request model's) are the model's to check."""
    if not isinstance(body, dict):
        return
    for name, refusal in REFUSED.items():
        if (name in implemented and not refusal.partial) or body.get(name) is None or _off(refusal, body[name]):
            continue
        raise APIError(400, f"{name}: {refusal.what} is not supported by this server", param=name,
                       code="unsupported_parameter")
    _refuse_media(body.get("messages"))


def _refuse_media(messages: Any) -> None:
    """A chat message part that is not text (an image, audio, a file): this model reads text only."""
    if not isinstance(messages, list):
        return
    for i, msg in enumerate(messages):
        parts = msg.get("content") if isinstance(msg, dict) else None
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                where = f"messages.{i}.content.{j}"
                raise APIError(400, f"{where}: this model takes text only (a {kind!r} part cannot be read)",
                               param=where, code="unsupported_parameter")


def _off(refusal: Refusal, value: Any) -> bool:
    if refusal.off is None:
        return value is False or value == "" or value == [] or value == {} or \
            (type(value) in (int, float) and value == 0)
    if _NEGATIVE_OFF in refusal.off and type(value) in (int, float) and value < 0:
        return True
    return any(_same(value, v) for v in refusal.off if v != _NEGATIVE_OFF)


def _same(value: Any, off: Any) -> bool:
    """JSON equality: ``1`` is ``1.0``, but ``true`` is not ``1``."""
    numbers = (int, float)
    if type(value) in numbers and type(off) in numbers:
        return value == off
    return type(value) is type(off) and value == off
