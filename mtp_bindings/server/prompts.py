"""Prompts as tokens: how a chat's messages or a completion's prompt becomes the token ids a
slot generates from.

One job: tokenize exactly as :func:`~mtp_bindings.speculative.chat` and
:func:`~mtp_bindings.speculative.generate` do in-process, so the server's output equals the
library's for the same request.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import InvalidParameterError


def chat_tokens(model: Any, messages: list[dict[str, str]]) -> list[int]:
    """Render with the GGUF's chat template and tokenize as :func:`speculative.chat` does."""
    import jinja2

    from ..chat_template import render_chat

    try:
        text = render_chat(model, messages)
    except jinja2.TemplateError as e:
        raise InvalidParameterError(f"the chat template failed on these messages: {e}") from e
    return model.tokenize(text, add_special=False, parse_special=True)


def completion_tokens(model: Any, prompt: str | list[str] | list[int]) -> list[int]:
    """Tokenize as :func:`generate` does for a text prompt; token-id prompts are checked."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return model.check_tokens(prompt).tolist()
    text = prompt if isinstance(prompt, str) else prompt[0]
    return model.tokenize(text, add_special=True, parse_special=False)
