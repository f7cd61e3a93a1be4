"""``chat``: render ``messages`` with the model's chat template (:mod:`mtp_bindings.chat.template`),
generate the reply with :func:`.driver.generate` (the same keyword arguments) and parse it into an
OpenAI-style assistant message (:mod:`mtp_bindings.chat.reply`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import IO, Any, Literal, overload

from ..chat.reply import parse_reply
from ..chat.template import CHAT_TOKENIZE, ChatOptions, chat_prompt, reply_markers
from ..config.params import DraftParams, SamplingParams, SpeculativeParams
from ..llama_context import LlamaContext
from ..llama_model import LlamaModel
from .constraint import Grammar
from .driver import generate
from .results import GenerationResult, TextPiece


# chat's typed faces: stream=False gives a result, stream=True a stream of pieces, a bool either
# (the implementation, with the documentation, follows them)
@overload
def chat(
    model: LlamaModel, messages: Sequence[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
    chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None, max_tokens: int = 128,
    temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
    min_p: float | None = None, repeat_penalty: float | None = None, repeat_last_n: int | None = None,
    presence_penalty: float | None = None, frequency_penalty: float | None = None, seed: int | None = None,
    logit_bias: dict[int, float] | None = None, typical_p: float | None = None, top_n_sigma: float | None = None,
    xtc_probability: float | None = None, xtc_threshold: float | None = None, dry_multiplier: float | None = None,
    dry_base: float | None = None, dry_allowed_length: int | None = None, dry_penalty_last_n: int | None = None,
    dry_sequence_breakers: Sequence[str] | None = None, sampling: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None, speculative: SpeculativeParams | None = None,
    draft_n_max: int | None = None, preset: str | None = None, depth2: bool | None = None,
    skip_streak: int | None = None, trace: str | os.PathLike[str] | IO[str] | None = None,
    cancel: Callable[[], bool] | None = None, prompt_progress: Callable[[int, int], None] | None = None,
    context: LlamaContext | None = None, add_special: bool = CHAT_TOKENIZE["add_special"],
    parse_special: bool = CHAT_TOKENIZE["parse_special"], ignore_eos: bool = False, logprobs: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt, grammar: Grammar | str | None = None,
    json_schema: dict[str, Any] | str | None = None, special_tokens: Collection[int] | None = None,
    stream: Literal[False] = False,
) -> GenerationResult: ...


@overload
def chat(
    model: LlamaModel, messages: Sequence[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
    chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None, max_tokens: int = 128,
    temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
    min_p: float | None = None, repeat_penalty: float | None = None, repeat_last_n: int | None = None,
    presence_penalty: float | None = None, frequency_penalty: float | None = None, seed: int | None = None,
    logit_bias: dict[int, float] | None = None, typical_p: float | None = None, top_n_sigma: float | None = None,
    xtc_probability: float | None = None, xtc_threshold: float | None = None, dry_multiplier: float | None = None,
    dry_base: float | None = None, dry_allowed_length: int | None = None, dry_penalty_last_n: int | None = None,
    dry_sequence_breakers: Sequence[str] | None = None, sampling: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None, speculative: SpeculativeParams | None = None,
    draft_n_max: int | None = None, preset: str | None = None, depth2: bool | None = None,
    skip_streak: int | None = None, trace: str | os.PathLike[str] | IO[str] | None = None,
    cancel: Callable[[], bool] | None = None, prompt_progress: Callable[[int, int], None] | None = None,
    context: LlamaContext | None = None, add_special: bool = CHAT_TOKENIZE["add_special"],
    parse_special: bool = CHAT_TOKENIZE["parse_special"], ignore_eos: bool = False, logprobs: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt, grammar: Grammar | str | None = None,
    json_schema: dict[str, Any] | str | None = None, special_tokens: Collection[int] | None = None,
    stream: Literal[True],
) -> Iterator[TextPiece]: ...


@overload
def chat(
    model: LlamaModel, messages: Sequence[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
    chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None, max_tokens: int = 128,
    temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
    min_p: float | None = None, repeat_penalty: float | None = None, repeat_last_n: int | None = None,
    presence_penalty: float | None = None, frequency_penalty: float | None = None, seed: int | None = None,
    logit_bias: dict[int, float] | None = None, typical_p: float | None = None, top_n_sigma: float | None = None,
    xtc_probability: float | None = None, xtc_threshold: float | None = None, dry_multiplier: float | None = None,
    dry_base: float | None = None, dry_allowed_length: int | None = None, dry_penalty_last_n: int | None = None,
    dry_sequence_breakers: Sequence[str] | None = None, sampling: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None, speculative: SpeculativeParams | None = None,
    draft_n_max: int | None = None, preset: str | None = None, depth2: bool | None = None,
    skip_streak: int | None = None, trace: str | os.PathLike[str] | IO[str] | None = None,
    cancel: Callable[[], bool] | None = None, prompt_progress: Callable[[int, int], None] | None = None,
    context: LlamaContext | None = None, add_special: bool = CHAT_TOKENIZE["add_special"],
    parse_special: bool = CHAT_TOKENIZE["parse_special"], ignore_eos: bool = False, logprobs: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt, grammar: Grammar | str | None = None,
    json_schema: dict[str, Any] | str | None = None, special_tokens: Collection[int] | None = None, stream: bool,
) -> GenerationResult | Iterator[TextPiece]: ...


def chat(
    model: LlamaModel,
    messages: Sequence[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    max_tokens: int = 128,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repeat_penalty: float | None = None,
    repeat_last_n: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    seed: int | None = None,
    logit_bias: dict[int, float] | None = None,
    typical_p: float | None = None,
    top_n_sigma: float | None = None,
    xtc_probability: float | None = None,
    xtc_threshold: float | None = None,
    dry_multiplier: float | None = None,
    dry_base: float | None = None,
    dry_allowed_length: int | None = None,
    dry_penalty_last_n: int | None = None,
    dry_sequence_breakers: Sequence[str] | None = None,
    sampling: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None,
    speculative: SpeculativeParams | None = None,
    draft_n_max: int | None = None,
    preset: str | None = None,
    depth2: bool | None = None,
    skip_streak: int | None = None,
    trace: str | os.PathLike[str] | IO[str] | None = None,
    cancel: Callable[[], bool] | None = None,
    prompt_progress: Callable[[int, int], None] | None = None,
    context: LlamaContext | None = None,
    add_special: bool = CHAT_TOKENIZE["add_special"],
    parse_special: bool = CHAT_TOKENIZE["parse_special"],
    ignore_eos: bool = False,
    logprobs: int | None = None,
    cache_prompt: bool = DraftParams.cache_prompt,
    grammar: Grammar | str | None = None,
    json_schema: dict[str, Any] | str | None = None,
    special_tokens: Collection[int] | None = None,
    stream: bool = False,
) -> GenerationResult | Iterator[TextPiece]:
    """Apply the model's chat template (jinja2; ``chat_template``: a template source instead of the
    GGUF's) to ``messages``, with OpenAI-style ``tools`` and ``chat_template_kwargs`` (e.g.
    ``{"enable_thinking": True}``) passed to the template, and generate the reply. A whole result's
    ``message`` is the reply as OpenAI's assistant message: ``content``, ``reasoning_content`` (the
    thinking channel) and, when ``tools`` were offered, ``tool_calls``; a stream yields the raw text
    (split it with :class:`mtp_bindings.chat.reply.ReplyStream`). Tools offered with a GGUF template
    that cannot declare them: a Gemma 4 model uses the package's Gemma 4 template, another model's
    template is used with a logged warning. An assistant's ``content: None`` renders as empty; an
    image or audio content part raises :class:`~mtp_bindings.exceptions.TextOnlyError`."""
    prompt = chat_prompt(model, messages, ChatOptions(tools, chat_template, chat_template_kwargs or {}))
    out = generate(model, prompt.text, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   min_p=min_p, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                   presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed,
                   logit_bias=logit_bias, typical_p=typical_p, top_n_sigma=top_n_sigma,
                   xtc_probability=xtc_probability, xtc_threshold=xtc_threshold, dry_multiplier=dry_multiplier,
                   dry_base=dry_base, dry_allowed_length=dry_allowed_length, dry_penalty_last_n=dry_penalty_last_n,
                   dry_sequence_breakers=dry_sequence_breakers, sampling=sampling, stop=stop,
                   speculative=speculative, draft_n_max=draft_n_max, preset=preset, depth2=depth2,
                   skip_streak=skip_streak, trace=trace, cancel=cancel, prompt_progress=prompt_progress,
                   context=context, add_special=add_special, parse_special=parse_special, ignore_eos=ignore_eos,
                   logprobs=logprobs, cache_prompt=cache_prompt, grammar=grammar, json_schema=json_schema,
                   stream=stream, special_tokens=reply_markers(model) if special_tokens is None else special_tokens)
    if isinstance(out, GenerationResult):
        out.message = parse_reply(out.text, tools=bool(tools), prefix=prompt.reply_prefix).message()
    return out
