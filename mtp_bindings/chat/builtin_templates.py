"""llama.cpp's built-in chat formats, by name (``chatml``, ``llama3``, ``gemma``, ...): what
llama-server's and llama-cli's ``--chat-template NAME`` take.

One job: the names (``llama_chat_builtin_templates``) and a chat rendered in one of them
(``llama_chat_apply_template``: llama.cpp's own formatter of each format, in C++, not a Jinja
template). A message's content is its text; a list of parts is its text parts joined by newlines,
as llama.cpp's own non-Jinja path joins them. The rendered text holds no BOS: the caller adds the
model's (:mod:`.chat_template`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from ..native._native import ffi, lib
from ..exceptions import InvalidParameterError


@functools.lru_cache(maxsize=1)
def builtin_template_names() -> tuple[str, ...]:
    """Every name ``llama_chat_apply_template`` formats, as llama.cpp lists them."""
    n = lib.llama_chat_builtin_templates(ffi.NULL, 0)
    out = ffi.new("const char *[]", n)
    n = lib.llama_chat_builtin_templates(out, n)
    return tuple(ffi.string(out[i]).decode("utf-8") for i in range(n))


def is_builtin_template(name: object) -> bool:
    """Whether ``name`` is the name of one of llama.cpp's built-in formats (not a template's source)."""
    return isinstance(name, str) and name in builtin_template_names()


def _content_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise InvalidParameterError(f"a built-in chat template takes text parts only, got {part!r}")
        texts.append(part["text"])
    return "\n".join(texts)


def apply_builtin_template(name: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    """``messages`` rendered in llama.cpp's built-in format ``name`` (see :func:`builtin_template_names`)."""
    if not is_builtin_template(name):
        raise InvalidParameterError(f"{name!r} is not one of llama.cpp's built-in chat templates: "
                                    f"{', '.join(builtin_template_names())}")
    keep = []  # the C strings must outlive the call
    chat = ffi.new("struct llama_chat_message[]", len(messages))
    for i, m in enumerate(messages):
        role, content = ffi.new("char[]", str(m["role"]).encode()), ffi.new("char[]", _content_text(m).encode())
        keep += [role, content]
        chat[i].role, chat[i].content = role, content
    tmpl = name.encode()
    size = 2 * sum(len(ffi.string(c)) for c in keep) + 256
    for _ in range(2):  # once more with the length it asked for
        buf = ffi.new("char[]", size)
        n = lib.llama_chat_apply_template(tmpl, chat, len(messages), add_generation_prompt, buf, size)
        if n < 0:
            raise InvalidParameterError(f"llama.cpp's built-in chat template {name!r} cannot render these messages")
        if n <= size:
            return ffi.buffer(buf, n)[:].decode("utf-8", errors="replace")
        size = n
    raise InvalidParameterError(f"llama.cpp's built-in chat template {name!r} gave no stable length")
