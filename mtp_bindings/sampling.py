"""Compatibility name: the sampler moved to :mod:`mtp_bindings.generation.sampling` (and its
settings to :mod:`mtp_bindings.params`); verifying drafts is :mod:`mtp_bindings.generation.rejection`."""

from __future__ import annotations

from .generation.rejection import RejectionSampler
from .generation.sampling import Sampler
from .params import SamplingParams

__all__ = ["Sampler", "SamplingParams", "RejectionSampler"]
