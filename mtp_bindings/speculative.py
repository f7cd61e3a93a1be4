"""Compatibility name: the generation driver now lives in :mod:`mtp_bindings.generation`, one
module per job. These names are kept for code that imported them from here."""

from __future__ import annotations

from .generation.drafter import Drafter, MTPDrafter, NoDrafter, SkipStreak
from .generation.driver import chat, draft_params, generate
from .generation.loop import token_rounds
from .generation.results import GenerationResult, TextPiece
from .generation.stats import GenerationStats
from .generation.text import TextAssembler
from .generation.trace import Tracer
from .params import DraftParams

DriverOptions = DraftParams  # the loop's knobs, by their old name

__all__ = ["generate", "chat", "draft_params", "GenerationResult", "GenerationStats", "TextPiece", "TextAssembler",
           "Tracer", "Drafter", "NoDrafter", "MTPDrafter", "SkipStreak", "DriverOptions", "token_rounds"]
