"""The speculative loop apart from numerics: every emitted token is the one the acceptance rule picks from
the rows the verifier actually read, whatever the kernels round.

A spy wraps the loop's verifier and rejection sampler (test-side subclasses patched into
``generation.loop``; no product hook): it keeps a copy of each row the target gave and the drafts they
verified. An oracle written here from the rule's definition then replays the generation from those rows
alone -- argmax at temperature 0; at temperature > 0 Leviathan et al.'s rule for one-hot drafts (accept
``d`` with probability ``p(d)``, else draw from ``p`` without ``d``; the bonus token from the last row),
with the numbers the generation's rounds draw (:class:`~mtp_bindings.generation.chain.RoundNumbers`, seeded as
the generation's) -- and must emit exactly the generation's tokens. The
oracle's distribution is written here too (softmax(row / T) over the whole vocabulary); the order its
candidates are drawn in and the inverse-CDF draw are the package's one convention
(:func:`~mtp_bindings.generation.sampling.candidate_distribution`: ascending token id;
:func:`~mtp_bindings.generation.sampling.draw_index`), not a copy per test. So a
loop that kept a wrong prefix, read a stale row, skipped or double-consumed a random draw, or emitted a
draft the rule rejected fails here bit for bit, independently of whether the rows themselves are right
(that is the numerics tests' job: tests/numerics.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mtp_bindings.config.env import ENV_GRAPH_GREEDY
from mtp_bindings.generation import loop
from mtp_bindings.generation.rejection import RejectionSampler
from mtp_bindings.generation.chain import RoundNumbers
from mtp_bindings.generation.sampling import candidate_distribution, draw_index, round_seed
from mtp_bindings.generation.verifier import Verifier

PROMPTS = ["def parse_args(argv):\n", "class Queue:\n    def __init__(self):"]
N = 40
# the oracle's distribution: softmax(row / T) over the whole vocabulary (top_k 0, top_p 1, min_p 0, no
# penalties), so it needs none of the sampler's truncation code
PLAIN_CHAIN = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}


class Spy:
    """What one generation's loop read: the first row (after the prompt), then per round the drafts and
    the verify rows."""

    def __init__(self) -> None:
        self.first: np.ndarray | None = None
        self.rounds: list[tuple[list[int], list[np.ndarray]]] = []


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    record = Spy()

    class SpyVerifier(Verifier):
        def rows(self, last_token: int, drafts: list[int], attn_pos: int) -> list[np.ndarray]:
            rows = super().rows(last_token, drafts, attn_pos)
            record.rounds.append((list(drafts), [np.array(r, copy=True) for r in rows]))
            return rows

    class SpyRejection(RejectionSampler):
        def sample(self, row: np.ndarray) -> int:
            if record.first is None:  # the first call is the token after the prompt
                record.first = np.array(row, copy=True)
            return super().sample(row)

    # greedy picks on the host, from the rows (the graph's own picks are test_graph_greedy's: the same tokens)
    monkeypatch.setenv(ENV_GRAPH_GREEDY, "0")
    monkeypatch.setattr(loop, "Verifier", SpyVerifier)
    monkeypatch.setattr(loop, "RejectionSampler", SpyRejection)
    yield record


class Oracle:
    """The acceptance rule from its definition, drawing from its own generator seeded as the sampler's."""

    def __init__(self, temperature: float, seed: int) -> None:
        self.t = temperature
        # the numbers of the native rounds: two per row of each round (accept, draw), from the sampler's seed
        self.numbers = RoundNumbers(round_seed(np.random.default_rng(seed)))
        self.u = np.empty(0)

    def _dist(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # every token, its logit divided by T in float32 as llama.cpp's temperature sampler divides it
        return candidate_distribution(np.arange(row.size, dtype=np.int32), row / np.float32(self.t))

    def pick(self, row: np.ndarray, u: float = 0.0) -> int:
        if self.t == 0.0:
            return int(np.argmax(row))
        ids, p = self._dist(row)
        return int(ids[draw_index(p, u)])

    def round(self, drafts: list[int], rows: list[np.ndarray]) -> list[int]:
        """The tokens one round emits: the accepted drafts, then the correction or the bonus token."""
        assert len(rows) == len(drafts) + 1
        u = self.numbers.random(2 * len(rows)) if self.t > 0.0 else np.zeros(2 * len(rows))
        for i, d in enumerate(drafts):
            if self.t == 0.0:
                best = int(np.argmax(rows[i]))
                if best != d:
                    return drafts[:i] + [best]
                continue
            ids, p = self._dist(rows[i])
            p_d = float(p[ids == d][0])
            if p_d <= 0.0 or u[2 * i] >= p_d:
                p = p.copy()
                p[ids == d] = 0.0
                return drafts[:i] + [int(ids[draw_index(p / p.sum(), u[2 * i + 1])])]
        return drafts + [self.pick(rows[-1], u[-1])]


def replay(spy: Spy, temperature: float, seed: int) -> list[int]:
    oracle = Oracle(temperature, seed)
    assert spy.first is not None
    out = oracle.round([], [spy.first])  # the token after the prompt: a round of one row
    for drafts, rows in spy.rounds:
        out += oracle.round(drafts, rows)
    return out


@pytest.fixture(scope="module")
def trained(trained_paths: Any) -> Iterator[Any]:
    from mtp_bindings import Model

    t, a = trained_paths
    with Model(t, assistant=a) as m, m.create_context(n_ctx=512, embeddings=True) as ctx:
        yield m, ctx


def _generate(trained: Any, prompt: str, **kwargs: Any) -> Any:
    model, ctx = trained
    return model.generate(prompt, context=ctx, max_tokens=N, ignore_eos=True, **PLAIN_CHAIN, **kwargs)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("draft_n_max", [1, 3, 6])
def test_greedy_tokens_are_the_argmax_of_the_rows_the_verifier_read(trained: Any, spy: Spy, prompt: str,
                                                                     draft_n_max: int) -> None:
    result = _generate(trained, prompt, temperature=0.0, draft_n_max=draft_n_max)
    assert result.stats.n_accepted > 0 and result.stats.n_accepted < result.stats.n_drafted  # both branches
    assert len(spy.rounds) == result.stats.n_rounds
    assert replay(spy, 0.0, 0) == result.tokens


@pytest.mark.parametrize("seed", [1, 7, 42])
@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_sampled_tokens_follow_the_rejection_rule_on_the_rows_the_verifier_read(trained: Any, spy: Spy, seed: int,
                                                                                temperature: float) -> None:
    result = _generate(trained, PROMPTS[0], temperature=temperature, seed=seed, draft_n_max=3)
    assert result.stats.n_accepted > 0 and result.stats.n_accepted < result.stats.n_drafted
    assert replay(spy, temperature, seed) == result.tokens


def test_the_oracle_tells_a_wrong_loop_apart(trained: Any, spy: Spy) -> None:
    # the oracle is not blind: the same rows with one accepted draft dropped replay to other tokens
    result = _generate(trained, PROMPTS[0], temperature=0.0, draft_n_max=3)
    r = next(i for i, (drafts, rows) in enumerate(spy.rounds)
             if drafts and int(np.argmax(rows[0])) == drafts[0] != int(np.argmax(rows[1])))
    drafts, rows = spy.rounds[r]
    spy.rounds[r] = (drafts, [rows[1]] + rows[1:])  # a loop reading the next row for the first draft
    assert replay(spy, 0.0, 0) != result.tokens
