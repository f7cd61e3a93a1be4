"""Prompts as tokens: how a chat's messages or a completion's prompt becomes the token ids a
slot generates from.

One job: tokenize exactly as :func:`~mtp_bindings.generation.chat.chat` and
:func:`~mtp_bindings.generation.driver.generate` do in-process, so the server's output equals the
library's for the same request: chats by the library's one rule
(:func:`mtp_bindings.chat.template.chat_tokens`), text prompts as ``generate`` tokenizes them.
"""

from __future__ import annotations

from typing import Any

from ..chat.template import CHAT_TOKENIZE, ChatOptions, chat_prompt, chat_tokens

__all__ = ["chat_prompt", "chat_prompt_tokens", "chat_tokens", "completion_tokens"]


def chat_prompt_tokens(model: Any, messages: list[dict[str, Any]], options: ChatOptions) -> tuple[list[int], str]:
    """A chat's prompt tokens (the library's one rule) and the prefix its reply is parsed from."""
    prompt = chat_prompt(model, messages, options)
    return model.tokenize(prompt.text, **CHAT_TOKENIZE), prompt.reply_prefix


def completion_tokens(model: Any, prompt: str | list[str] | list[int]) -> list[int]:
    """Tokenize as :func:`generate` does for a text prompt; token-id prompts are checked."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return model.check_tokens(prompt).tolist()
    text = prompt if isinstance(prompt, str) else prompt[0]
    return model.tokenize(text, add_special=True, parse_special=False)
