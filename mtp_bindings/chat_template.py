"""Prompts to tokens: render a list of messages with the GGUF's own jinja2 chat template, and the
one rule for tokenizing each kind of prompt (:data:`CHAT_TOKENIZE` / :func:`chat_tokens` for chats,
:data:`TEXT_TOKENIZE` / :func:`text_tokens` for plain text) that ``generate`` / ``chat`` and the
server's endpoints share."""

from __future__ import annotations

from typing import Sequence

from .exceptions import InvalidParameterError
from .model import LlamaModel

# A rendered chat prompt already holds its BOS and turn markers as text: add nothing, and parse the
# control-token text into control tokens.
CHAT_TOKENIZE = {"add_special": False, "parse_special": True}
# Plain text: BOS as the model wants it; control-token text stays text (user input cannot forge turns).
TEXT_TOKENIZE = {"add_special": True, "parse_special": False}

# Gemma's turn format, for models whose GGUF carries no template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def validate_messages(messages: Sequence[dict[str, str]]) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidParameterError("messages must be a non-empty list of {'role', 'content'} dicts")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidParameterError(f"each message needs string 'role' and 'content', got {m!r}")


def render_chat(model: LlamaModel, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The prompt text for ``messages`` (control tokens as text: tokenize with parse_special)."""
    import jinja2
    import jinja2.sandbox

    validate_messages(messages)
    source = model.chat_template or GEMMA_TEMPLATE
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg: str) -> None:
        raise InvalidParameterError(f"chat template: {msg}")

    env.globals["raise_exception"] = raise_exception
    bos = model.token_to_piece(model.token_bos, special=True).decode("utf-8", errors="replace") if model.add_bos else ""
    eos = model.token_to_piece(model.token_eos, special=True).decode("utf-8", errors="replace")
    try:
        tmpl = env.from_string(source)
    except jinja2.TemplateError as e:
        raise InvalidParameterError(f"the model's chat template does not parse: {e}") from e
    return tmpl.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                       bos_token=bos, eos_token=eos)


def chat_tokens(model: LlamaModel, messages: Sequence[dict[str, str]]) -> list[int]:
    """The prompt tokens of ``messages``: rendered with the model's template, tokenized with
    :data:`CHAT_TOKENIZE`. A template that fails on these messages is an :class:`InvalidParameterError`."""
    import jinja2

    try:
        text = render_chat(model, messages)
    except jinja2.TemplateError as e:
        raise InvalidParameterError(f"the chat template failed on these messages: {e}") from e
    return model.tokenize(text, **CHAT_TOKENIZE)


def text_tokens(model: LlamaModel, text: str) -> list[int]:
    """The prompt tokens of plain ``text`` (:data:`TEXT_TOKENIZE`)."""
    return model.tokenize(text, **TEXT_TOKENIZE)
