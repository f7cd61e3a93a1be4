"""llama-server's own endpoints that scripts use beside the OpenAI ones: ``POST /tokenize``,
``POST /detokenize`` and ``GET /props``, in llama-server's request and response shapes.

One job: the bodies of these three routes. Tokenizing uses the served model's vocabulary with
llama-server's defaults (``add_special`` false, ``parse_special`` true, pieces rendered with
special tokens as text); ``/props`` reports what this server knows of itself, in llama-server's
field names, and leaves out what has no counterpart here (the README lists the fields filled).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .. import __version__
from ..chat.template import GEMMA_TEMPLATE
from ..config.params import SAMPLER_ORDER, SAMPLING_DEFAULTS
from ..config.presets import resolve_preset
from .params import DraftDefaults
from .strict import STRICT

BUILD_INFO = f"mtp-bindings-{__version__}"


class TokenizeRequest(BaseModel):
    """``/tokenize``'s body (llama-server's fields and defaults)."""

    model_config = STRICT
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    """``/detokenize``'s body."""

    model_config = STRICT
    tokens: list[int] = Field(default_factory=list)


def piece_json(raw: bytes) -> str | list[int]:
    """A token's piece as llama-server gives it: the text when it is valid UTF-8, else its bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def tokenize_body(model: Any, req: TokenizeRequest) -> dict[str, Any]:
    """``{"tokens": [ids]}``, or with ``with_pieces`` ``{"tokens": [{"id", "piece"}]}``."""
    ids = model.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special) \
        if req.content else []
    if not req.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": piece_json(model.token_to_piece(t, special=True))} for t in ids]}


def detokenize_body(model: Any, req: DetokenizeRequest) -> dict[str, Any]:
    """``{"content": text}`` (special tokens rendered as text, as llama-server does)."""
    tokens = model.check_tokens(req.tokens).tolist() if req.tokens else []
    return {"content": model.detokenize(tokens, special=True) if tokens else ""}


def props_body(model: Any, *, model_name: str, n_slots: int, n_ctx: int, n_predict: int,
               draft: DraftDefaults, chat_template: str | None = None) -> dict[str, Any]:
    """llama-server's ``GET /props``: the defaults a request gets, the slots, the model
    (``chat_template``: the one in use, when it overrides the GGUF's; else the GGUF's, else our
    Gemma 4 fallback)."""
    d = SAMPLING_DEFAULTS
    n_max = resolve_preset(draft.preset).draft_n_max if draft.draft_n_max is None else draft.draft_n_max
    speculative = bool(model.has_assistant) and n_max > 0
    params = {
        "n_predict": n_predict, "max_tokens": n_predict, "seed": -1, "temperature": d.temperature,
        "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p, "repeat_last_n": d.repeat_last_n,
        "repeat_penalty": d.repeat_penalty, "presence_penalty": d.presence_penalty,
        "frequency_penalty": d.frequency_penalty, "typical_p": d.typical_p, "top_n_sigma": d.top_n_sigma,
        "xtc_probability": d.xtc_probability, "xtc_threshold": d.xtc_threshold, "dry_multiplier": d.dry_multiplier,
        "dry_base": d.dry_base, "dry_allowed_length": d.dry_allowed_length,
        "dry_penalty_last_n": d.dry_penalty_last_n, "dry_sequence_breakers": list(d.dry_sequence_breakers),
        "stop": [], "ignore_eos": False, "stream": False,
        "n_probs": 0, "logit_bias": [], "samplers": list(SAMPLER_ORDER),
        "speculative.n_max": n_max if model.has_assistant else 0,
    }
    settings = {"id": 0, "id_task": -1, "n_ctx": n_ctx, "speculative": speculative, "is_processing": False,
                "params": params}
    template = chat_template or model.chat_template or GEMMA_TEMPLATE
    return {
        "default_generation_settings": settings,
        "total_slots": n_slots,
        "model_alias": model_name,
        "model_path": str(model.path),
        "chat_template": template,
        "modalities": {"vision": False, "audio": False},
        "build_info": BUILD_INFO,
        "is_sleeping": False,
    }
