"""A request's generation parameters: what :func:`~mtp_bindings.speculative.generate` is called
with for it.

One job: merge a validated request with the server's settings. Where the request says nothing,
OpenAI's defaults apply (temperature 1), llama.cpp's for the extras (the library's
:class:`~mtp_bindings.sampling.SamplingParams` defaults), the server's drafting defaults
(:class:`DraftDefaults`) and its ``n_predict`` as the length of a request that sets no limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..exceptions import InvalidParameterError
from ..presets import resolve_preset
from .schemas import GenerationRequest


@dataclass(frozen=True)
class DraftDefaults:
    """Server-wide drafting defaults (a request may override ``draft_n_max``)."""

    draft_n_max: int | None = None
    preset: str | None = None
    depth2: bool | None = None
    skip_streak: int | None = None

    def validate(self) -> None:
        resolve_preset(self.preset)
        for name, hi in (("draft_n_max", 16), ("skip_streak", 32)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi):
                raise InvalidParameterError(f"{name} must be an int in 0..{hi}, got {v!r}")


def generation_kwargs(req: GenerationRequest, draft: DraftDefaults, n_prompt: int, n_ctx: int,
                      n_vocab: int, n_predict: int = -1) -> dict[str, Any]:
    """The :func:`generate` arguments for ``req``; OpenAI's defaults where it says nothing
    (temperature 1), llama.cpp's for the extras, the server's ``n_predict`` (-1: none) as the
    length of a request that sets no limit."""
    max_tokens = req.requested_max_tokens()
    if max_tokens is None and n_predict >= 0:
        max_tokens = n_predict
    room = max(n_ctx - n_prompt, 0)
    seed = None if req.seed is None or req.seed < 0 else req.seed
    return dict(
        max_tokens=room if max_tokens is None else min(max_tokens, room),
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=40 if req.top_k is None else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        repeat_penalty=1.0 if req.repeat_penalty is None else req.repeat_penalty,
        repeat_last_n=64 if req.repeat_last_n is None else (n_ctx if req.repeat_last_n < 0 else req.repeat_last_n),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        seed=seed,
        logit_bias=req.token_bias(n_vocab),
        stop=req.stop,
        draft_n_max=req.requested_draft_n_max() if req.requested_draft_n_max() is not None else draft.draft_n_max,
        preset=draft.preset,
        depth2=draft.depth2,
        skip_streak=draft.skip_streak,
    )
