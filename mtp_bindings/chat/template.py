"""Prompts to tokens: render a list of messages with the GGUF's own jinja2 chat template (or one
given instead, or one of llama.cpp's built-in formats by name; Gemma 4's format when the GGUF has
none), with tools and template arguments, and the one rule for tokenizing each kind of prompt
(:data:`CHAT_TOKENIZE` / :func:`chat_tokens` for chats, :data:`TEXT_TOKENIZE` / :func:`text_tokens`
for plain text) that ``generate`` / ``chat`` and the server's endpoints share."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .builtin_templates import apply_builtin_template, is_builtin_template
from .reply import MARKERS, reply_prefix
from ..exceptions import InvalidParameterError, TextOnlyError
from .gemma4_template import GEMMA4_TEMPLATE
from ..llama_model import LlamaModel
from .template_env import template_environment

# A rendered chat prompt already holds its BOS and turn markers as text: add nothing, and parse the
# control-token text into control tokens.
CHAT_TOKENIZE = {"add_special": False, "parse_special": True}
# Plain text: BOS as the model wants it; control-token text stays text (user input cannot forge turns).
TEXT_TOKENIZE = {"add_special": True, "parse_special": False}

logger = logging.getLogger("mtp_bindings")

# Gemma 4's turn format, for models whose GGUF carries no template, or one that cannot declare tools
# (see :mod:`.gemma4_template`).
GEMMA_TEMPLATE = GEMMA4_TEMPLATE
GEMMA4_ARCH = "gemma4"
# content parts a text-only model cannot read (OpenAI's and HF's names); "text" is the only one it can
NON_TEXT_PARTS = frozenset({"image", "image_url", "input_image", "audio", "input_audio", "video", "file"})
TEXT_ONLY = "this model takes text only"
_warned_templates: set[int] = set()  # hashes of templates already warned about (once each, not per request)


@dataclass(frozen=True)
class ChatOptions:
    """How a chat is rendered beyond its messages: the ``tools`` offered (OpenAI's list of
    ``{"type": "function", "function": {...}}``), a ``template`` overriding the GGUF's (a Jinja source,
    or the name of one of llama.cpp's built-in formats: :mod:`.builtin_templates`), and
    ``kwargs`` passed to the template as variables (``enable_thinking`` and any other)."""

    tools: list[dict[str, Any]] | None = None
    template: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat: the prompt ``text`` and the ``reply_prefix`` its reply is parsed from
    (:func:`mtp_bindings.chat.reply.reply_prefix`)."""

    text: str
    reply_prefix: str


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """Each message a dict with a string ``role`` and a ``content`` that is a string, a list of
    text parts, or (for an assistant) None; an image, audio or other non-text part is a
    :class:`TextOnlyError` ("this model takes text only"), never dropped silently."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidParameterError("messages must be a non-empty list of {'role', 'content'} dicts")
    for m in messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InvalidParameterError(f"each message needs a string 'role', got {m!r}")
        content = m.get("content")
        if not isinstance(content, (str, list)) and not (content is None and m["role"] == "assistant"):
            raise InvalidParameterError(f"each message needs a string (or list of parts) 'content', got {m!r}")
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in NON_TEXT_PARTS:
                raise TextOnlyError(f"{TEXT_ONLY}: a {m['role']} message has an {kind!r} content part")
            if kind != "text" or not isinstance(part.get("text"), str):
                raise InvalidParameterError(f"a content part must be {{'type': 'text', 'text': str}}, got {part!r}")


def _template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as templates get them: an assistant's ``content: None`` (a reply of tool calls
    only) as "", which templates render as nothing -- not as the text ``None``."""
    return [{**m, "content": ""} if m.get("content") is None else dict(m) for m in messages]


def declares_tools(source: str) -> bool:
    """Whether a template reads the ``tools`` variable (can put tool declarations in the prompt)."""
    import jinja2.meta

    return "tools" in jinja2.meta.find_undeclared_variables(template_environment().parse(source))


def check_template(source: str) -> None:
    """Raise :class:`InvalidParameterError` when ``source`` is not a Jinja template that parses."""
    import jinja2

    try:
        template_environment().parse(source)
    except jinja2.TemplateError as e:
        raise InvalidParameterError(f"the chat template does not parse: {e}") from e


def _template_source(model: LlamaModel, options: ChatOptions) -> str:
    """The template to render: the one given, else the GGUF's, else Gemma 4's. With ``tools``, a
    GGUF template that cannot declare them is replaced by Gemma 4's on a Gemma 4 model, and any other
    that cannot is used with a warning (logged once per template): tools are never dropped unsaid."""
    source = options.template or model.chat_template or GEMMA_TEMPLATE
    if not options.tools or source is GEMMA_TEMPLATE or declares_tools(source):
        return source
    if options.template is None and getattr(model, "arch", "") == GEMMA4_ARCH:
        logger.info("the GGUF's chat template cannot declare tools: using the package's Gemma 4 template")
        return GEMMA_TEMPLATE
    if hash(source) not in _warned_templates:
        _warned_templates.add(hash(source))
        logger.warning("the chat template does not use 'tools': the %d tool(s) offered are not in the prompt, so "
                       "the model cannot call them (give a chat_template that declares tools)", len(options.tools))
    return source


def _special_text(model: LlamaModel, token: int) -> str:
    return model.token_to_piece(token, special=True).decode("utf-8", errors="replace")


def render_chat(model: LlamaModel, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                options: ChatOptions | None = None) -> str:
    """The prompt text for ``messages`` (control tokens as text: tokenize with parse_special),
    rendered in HF's template environment (:mod:`.template_env`) with ``options``."""
    import jinja2

    opts = options or ChatOptions()
    validate_messages(messages)
    if is_builtin_template(opts.template):
        return _render_builtin(model, messages, add_generation_prompt, opts)
    env = template_environment()
    try:
        tmpl = env.from_string(_template_source(model, opts))
    except jinja2.TemplateError as e:
        raise InvalidParameterError(f"the chat template does not parse: {e}") from e
    variables = {**opts.kwargs, "messages": _template_messages(messages), "tools": opts.tools,
                 "add_generation_prompt": add_generation_prompt,
                 "bos_token": _special_text(model, model.token_bos) if model.add_bos else "",
                 "eos_token": _special_text(model, model.token_eos)}
    return tmpl.render(**variables)


def _render_builtin(model: LlamaModel, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                    opts: ChatOptions) -> str:
    """``messages`` in llama.cpp's built-in format ``opts.template`` (:mod:`.builtin_templates`), after
    the model's BOS as the Jinja path's ``bos_token`` puts it (llama.cpp's tokenizer adds it there).
    Those formats know no tools and no template arguments: asking for either is an error, not a
    prompt that silently lacks them."""
    name = opts.template
    if opts.tools:
        raise InvalidParameterError(f"llama.cpp's built-in chat template {name!r} has no tool calls: use a Jinja "
                                    "template that has (the GGUF's, or a file)")
    if opts.kwargs:
        raise InvalidParameterError(f"llama.cpp's built-in chat template {name!r} takes no template arguments "
                                    f"(got {', '.join(map(str, opts.kwargs))})")
    text = apply_builtin_template(str(name), messages, add_generation_prompt)
    bos = _special_text(model, model.token_bos) if model.add_bos else ""
    return text if text.startswith(bos) else bos + text


def chat_prompt(model: LlamaModel, messages: Sequence[Mapping[str, Any]],
                options: ChatOptions | None = None) -> ChatPrompt:
    """The prompt of ``messages`` with its reply prefix (rendered twice: with and without the
    generation prompt). A template that fails on these messages is an :class:`InvalidParameterError`."""
    import jinja2

    try:
        text = render_chat(model, messages, True, options)
        without = render_chat(model, messages, False, options)
    except jinja2.TemplateError as e:
        raise InvalidParameterError(f"the chat template failed on these messages: {e}") from e
    return ChatPrompt(text, reply_prefix(text, without))


def chat_tokens(model: LlamaModel, messages: Sequence[Mapping[str, Any]],
                options: ChatOptions | None = None) -> list[int]:
    """The prompt tokens of ``messages``: rendered with the model's template, tokenized with
    :data:`CHAT_TOKENIZE`. A template that fails on these messages is an :class:`InvalidParameterError`."""
    import jinja2

    try:
        text = render_chat(model, messages, True, options)
    except jinja2.TemplateError as e:
        raise InvalidParameterError(f"the chat template failed on these messages: {e}") from e
    return model.tokenize(text, **CHAT_TOKENIZE)


def reply_markers(model: LlamaModel) -> frozenset[int]:
    """The control tokens a reply's text must show for it to be parsed: Gemma 4's channel, tool-call
    and string markers, where the vocabulary has each as one control token (which renders as nothing
    unless asked; llama-server's "preserved tokens"). Empty for a vocabulary without them."""
    found = set()
    for marker in MARKERS:
        toks = model.tokenize(marker, add_special=False, parse_special=True)
        if len(toks) == 1 and not model.token_to_piece(toks[0]):
            found.add(toks[0])
    return frozenset(found)


def text_tokens(model: LlamaModel, text: str) -> list[int]:
    """The prompt tokens of plain ``text`` (:data:`TEXT_TOKENIZE`)."""
    return model.tokenize(text, **TEXT_TOKENIZE)
