"""Request fields this server does not implement but that would change the output: refused by
name, never silently ignored (issue 16, item 6).

One job: look at a request body before it is validated and answer 400 ``unsupported_parameter``,
naming the field, when it asks for something the generation would not do -- forced tool calls
(``tool_choice`` other than ``auto``/``none``), llama-server's ``n_probs``, llama.cpp samplers we
do not have.
A value that asks for nothing (``null``, ``false``, ``0``, an empty list or object, the sampler's
own "off" value) passes, since clients send defaults. Structured output (``response_format``,
``grammar``, ``json_schema``) is implemented: :mod:`.structured` reads it.
Any other unknown field is a hint (``user``, ``service_tier``, ``store``, ``metadata``,
``id_slot``, ...) and is ignored; the README's server section lists them.
"""

from __future__ import annotations

from typing import Any

from .errors import APIError

# field -> what it would ask for (said in the error)
UNSUPPORTED: dict[str, str] = {
    "functions": "function calls",
    "function_call": "function calls",
    "n_probs": "token probabilities",
    "mirostat": "the mirostat sampler",
    "typical_p": "locally typical sampling",
    "dynatemp_range": "dynamic temperature",
    "xtc_probability": "the XTC sampler",
    "dry_multiplier": "the DRY sampler",
    "top_n_sigma": "top-n-sigma sampling",
    "samplers": "a custom sampler chain",
    "ignore_eos": "generating past end-of-text",
    "lora": "LoRA adapters",
}
# the value of a field that asks for nothing, beyond null / false / 0 / [] / {}
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "typical_p": (1.0,),
    "top_n_sigma": (-1.0,),
    "tool_choice": ("none", "auto"),
}


def refuse_unsupported(body: Any) -> None:
    """Raise a 400 :class:`APIError` naming the first field of ``body`` (a decoded JSON object)
    that asks for something this server does not do."""
    if not isinstance(body, dict):
        return
    for name, what in UNSUPPORTED.items():
        value = body.get(name)
        if _asks_for_something(name, value):
            raise APIError(400, f"{name}: {what} is not supported by this server", param=name,
                           code="unsupported_parameter")
    if body.get("tool_choice") is not None and not _neutral("tool_choice", body["tool_choice"]):
        raise APIError(400, "tool_choice: forcing a tool call is not supported by this server (only 'auto' and "
                            "'none')", param="tool_choice", code="unsupported_parameter")


def _asks_for_something(name: str, value: Any) -> bool:
    return value is not None and not _neutral(name, value)


def _neutral(name: str, value: Any) -> bool:
    if value is False or (type(value) in (int, float) and value == 0) or value == [] or value == {}:
        return True
    return value in NEUTRAL.get(name, ())
