"""A request's generation parameters: what :func:`~mtp_bindings.generation.driver.generate` is called
with for it.

One job: merge a validated request with the server's settings. Where the request says nothing,
the library's defaults (:data:`mtp_bindings.config.params.SAMPLING_DEFAULTS`, the one set every front
end shares, ``temperature`` included) apply, the server's drafting defaults
(:class:`DraftDefaults`) to drafting, and the server's ``n_predict`` is the length of a request
that sets no limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config.params import SAMPLING_DEFAULTS, DraftParams, check_draft_overrides
from ..config.presets import resolve_preset
from .schemas import GenerationRequest


@dataclass(frozen=True)
class DraftDefaults:
    """Server-wide drafting defaults (a request may override ``draft_n_max`` and ``cache_prompt``)."""

    draft_n_max: int | None = None
    preset: str | None = None
    depth2: bool | None = None
    skip_streak: int | None = None
    cache_prompt: bool = DraftParams.cache_prompt  # off: ``serve --no-cache-prompt``

    def validate(self) -> None:
        resolve_preset(self.preset)
        check_draft_overrides(self.draft_n_max, self.skip_streak)


def generation_kwargs(req: GenerationRequest, draft: DraftDefaults, n_prompt: int, n_ctx: int,
                      n_vocab: int, n_predict: int = -1) -> dict[str, Any]:
    """The :func:`generate` arguments for ``req`` (defaults as the module's docstring says; the
    server's ``n_predict``, -1 for none, is the length of a request that sets no limit)."""
    max_tokens = req.requested_max_tokens()
    if max_tokens is None and n_predict >= 0:
        max_tokens = n_predict
    room = max(n_ctx - n_prompt, 0)
    seed = None if req.seed is None or req.seed < 0 else req.seed
    d = SAMPLING_DEFAULTS
    draft_n_max = req.requested_draft_n_max()
    return dict(
        max_tokens=room if max_tokens is None else min(max_tokens, room),
        temperature=d.temperature if req.temperature is None else req.temperature,
        top_p=d.top_p if req.top_p is None else req.top_p,
        top_k=d.top_k if req.top_k is None else req.top_k,
        min_p=d.min_p if req.min_p is None else req.min_p,
        repeat_penalty=d.repeat_penalty if req.repeat_penalty is None else req.repeat_penalty,
        repeat_last_n=d.repeat_last_n if req.repeat_last_n is None else
        (n_ctx if req.repeat_last_n < 0 else req.repeat_last_n),
        presence_penalty=d.presence_penalty if req.presence_penalty is None else req.presence_penalty,
        frequency_penalty=d.frequency_penalty if req.frequency_penalty is None else req.frequency_penalty,
        seed=seed,
        logit_bias=req.token_bias(n_vocab),
        typical_p=d.typical_p if req.typical_p is None else req.typical_p,
        top_n_sigma=d.top_n_sigma if req.top_n_sigma is None else req.top_n_sigma,
        xtc_probability=d.xtc_probability if req.xtc_probability is None else req.xtc_probability,
        xtc_threshold=d.xtc_threshold if req.xtc_threshold is None else req.xtc_threshold,
        dry_multiplier=d.dry_multiplier if req.dry_multiplier is None else req.dry_multiplier,
        # llama-server replaces a base below 1 with its default
        dry_base=d.dry_base if req.dry_base is None or req.dry_base < 1.0 else req.dry_base,
        dry_allowed_length=d.dry_allowed_length if req.dry_allowed_length is None else req.dry_allowed_length,
        dry_penalty_last_n=d.dry_penalty_last_n if req.dry_penalty_last_n is None else
        (n_ctx if req.dry_penalty_last_n < 0 else req.dry_penalty_last_n),
        dry_sequence_breakers=d.dry_sequence_breakers if req.dry_sequence_breakers is None
        else tuple(req.dry_sequence_breakers),
        stop=req.stop,
        logprobs=req.requested_logprobs(),
        draft_n_max=draft.draft_n_max if draft_n_max is None else draft_n_max,
        preset=draft.preset,
        depth2=draft.depth2,
        skip_streak=draft.skip_streak,
        cache_prompt=draft.cache_prompt if req.cache_prompt is None else req.cache_prompt,
    )
