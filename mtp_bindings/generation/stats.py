"""What one generation did and how long it took, and the counting rules shared with the server.

Acceptance per draft position and tokens per second are computed here only: the server's metrics
add generations together with :func:`add_per_position` and read rates with :func:`per_second`.
Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def add_per_position(total: list[int], counts: Sequence[int]) -> None:
    """Add ``counts`` (one per draft position) into ``total``, growing it as needed."""
    if len(total) < len(counts):
        total.extend([0] * (len(counts) - len(total)))
    for i, n in enumerate(counts):
        total[i] += n


def acceptance_per_position(accepted: Sequence[int], drafted: Sequence[int]) -> list[float]:
    """Accepted / drafted at each draft position (0 where nothing was drafted)."""
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted)]


def per_second(n: float, seconds: float) -> float:
    """``n / seconds``, 0 for a zero or negative time."""
    return n / seconds if seconds > 0 else 0.0


@dataclass
class GenerationStats:
    """What one generation did and how long it took (seconds)."""

    n_prompt: int = 0
    n_prompt_cached: int = 0  # prompt tokens whose KV was reused from the context's last generation
    n_generated: int = 0
    n_rounds: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    n_skipped_rounds: int = 0
    rounds_per_k: list[int] = field(default_factory=list)  # verify rounds by the drafts they verified
    # what the ``auto`` draft count estimated at the end (costs, acceptance; see .controller), else None
    draft_policy: dict[str, Any] | None = None
    hit_eog: bool = False
    hit_context_limit: bool = False  # stopped because the context was full, before max_tokens
    t_prompt: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_sample: float = 0.0
    t_total: float = 0.0

    def count_round(self, n_drafted: int, n_accepted: int) -> None:
        """One verify round: ``n_drafted`` drafts of which the first ``n_accepted`` were kept."""
        self.n_rounds += 1
        by_k = self.rounds_per_k
        if n_drafted < len(by_k):  # most rounds (a plain one always, after the first): no lists built
            by_k[n_drafted] += 1
        else:
            add_per_position(by_k, [0] * n_drafted + [1])
        if n_drafted:
            self.n_drafted += n_drafted
            self.n_accepted += n_accepted
            add_per_position(self.drafted_per_position, [1] * n_drafted)
            add_per_position(self.accepted_per_position, [1] * n_accepted + [0] * (n_drafted - n_accepted))

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per verify round (accepted drafts + the one sampled token)."""
        return (self.n_generated - 1) / self.n_rounds if self.n_rounds else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return acceptance_per_position(self.accepted_per_position, self.drafted_per_position)

    @property
    def t_generate(self) -> float:
        """Seconds after the prompt."""
        return max(self.t_total - self.t_prompt, 0.0)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second after the prompt."""
        return per_second(self.n_generated, self.t_generate)

    @property
    def n_prompt_decoded(self) -> int:
        """Prompt tokens decoded (the rest came from the prompt cache)."""
        return self.n_prompt - self.n_prompt_cached

    @property
    def prompt_tokens_per_second(self) -> float:
        """Decoded prompt tokens per second (cached ones cost nothing)."""
        return per_second(self.n_prompt_decoded, self.t_prompt)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 acceptance_per_position=self.acceptance_per_position, tokens_per_second=self.tokens_per_second,
                 n_prompt_decoded=self.n_prompt_decoded)
        return d
