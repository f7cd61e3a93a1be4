"""The sampler and the speculative verifier on a toy model with history-dependent logits, with a toy
sampler chain (pure numpy: llama.cpp's own chain is tests/test_sampler_chain.py's).

The Monte Carlo tests compare the distribution of 3-token continuations produced by
one-at-a-time sampling with the one produced by drafting + :meth:`RejectionSampler.verify`: exact
speculative sampling must sit at the noise floor (the distance between two independent
one-at-a-time runs), and a deliberately wrong verifier (greedy-match: keep drafts equal to the
argmax) must be detected by the same test. The toy chain has a presence penalty over the tokens it
heard, so a verifier that let the chain hear a token at the wrong time (a rejected draft, an accepted
one too late) would change the distribution too.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtp_bindings import InvalidParameterError
from mtp_bindings.generation.rejection import RejectionSampler
from mtp_bindings.generation.sampling import Sampler, candidate_distribution, draw_index, in_id_order
from mtp_bindings.config.params import SamplingParams

V = 4
N_TOK = 3
N_SAMPLES = 30000
W = np.random.default_rng(7).normal(size=(V, V, V)) * 1.5
PROMPT = [1, 2]


def toy_logits(history: list[int]) -> np.ndarray:
    """Logits that depend on the last two tokens (so penalties and order matter)."""
    a, b = (history[-2:] if len(history) >= 2 else [0] + history[-1:])
    return W[a, b].astype(np.float32)


class ToyChain:
    """A sampler chain in the shape :class:`Sampler` takes: a presence penalty over the tokens it
    heard, the top ``top_k`` (0: all), then temperature; it records every token it hears."""

    def __init__(self, temperature: float, presence: float = 0.0, top_k: int = 0) -> None:
        self.temperature, self.presence, self.top_k = temperature, presence, top_k
        self.heard: list[int] = []
        self.changes_argmax = presence != 0.0

    def apply(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = row.astype(np.float32).copy()
        z[sorted(set(self.heard))] -= np.float32(self.presence)
        ids = np.argsort(-z, kind="stable")[::-1]  # a deliberately odd order: the sampler must not rely on it
        if self.top_k:
            ids = ids[-self.top_k:]
        return ids.astype(np.int32), z[ids] / np.float32(self.temperature or 1.0)

    def accept(self, token: int) -> None:
        self.heard.append(int(token))

    def accept_history(self, tokens: list[int]) -> None:
        self.heard.extend(tokens)

    def close(self) -> None:
        pass


def toy_draft(history: list[int], n: int) -> list[int]:
    """A good but imperfect drafter: the toy model's own greedy chain, with one fixed mistake."""
    h = list(history)
    out = []
    for i in range(n):
        tok = int(np.argmax(toy_logits(h))) if i != 1 else (int(np.argmax(toy_logits(h))) + 1) % V
        out.append(tok)
        h.append(tok)
    return out


def _sampler(seed: int, temperature: float = 0.8, presence: float = 0.7) -> Sampler:
    return Sampler(SamplingParams(temperature=temperature, seed=seed), ToyChain(temperature, presence))


def _fresh(s: Sampler) -> RejectionSampler:
    """A new sequence on ``s``'s generator: the chain forgets, then hears the prompt."""
    s.chain.heard = []  # type: ignore[attr-defined]
    s.accept_history(list(PROMPT))
    return RejectionSampler(s)


def sample_plain(seed: int) -> Counter:
    s = _sampler(seed)
    c: Counter = Counter()
    for _ in range(N_SAMPLES):
        rs, h = _fresh(s), list(PROMPT)
        for _ in range(N_TOK):
            h.append(rs.sample(toy_logits(h)))
        c[tuple(h[2:])] += 1
    return c


def sample_speculative(seed: int, greedy_match: bool = False) -> Counter:
    s = _sampler(seed)
    c: Counter = Counter()
    for _ in range(N_SAMPLES):
        rs, h = _fresh(s), list(PROMPT)
        while len(h) - 2 < N_TOK:
            k = N_TOK - (len(h) - 2) - 1
            drafts = toy_draft(h, k)
            rows = np.stack([toy_logits(h + drafts[:i]) for i in range(k + 1)])
            if greedy_match:
                n_acc = 0
                while n_acc < k and int(np.argmax(rows[n_acc])) == drafts[n_acc]:
                    s.accept(drafts[n_acc])
                    n_acc += 1
                nxt = rs.sample(rows[n_acc])
            else:
                n_acc, nxt = rs.verify(rows, drafts)
            h += drafts[:n_acc] + [nxt]
        c[tuple(h[2:2 + N_TOK])] += 1
    return c


def tv(a: Counter, b: Counter) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a[k] - b[k]) for k in keys) / N_SAMPLES


@pytest.fixture(scope="module")
def reference():
    return sample_plain(seed=1), sample_plain(seed=2)


def test_exact_speculative_sampling_matches_one_at_a_time_sampling(reference):
    ref, ref2 = reference
    floor = tv(ref, ref2)
    spec = tv(ref, sample_speculative(seed=3))
    assert floor < 0.03
    assert spec < max(0.03, 2.0 * floor), (spec, floor)


def test_greedy_match_verifier_is_detected_as_wrong(reference):
    ref, ref2 = reference
    floor = tv(ref, ref2)
    wrong = tv(ref, sample_speculative(seed=3, greedy_match=True))
    assert wrong > 5 * floor and wrong > 0.05, (wrong, floor)


def test_the_chain_hears_exactly_the_emitted_tokens():
    s = _sampler(seed=5)
    for _ in range(200):
        rs, h = _fresh(s), list(PROMPT)
        drafts = toy_draft(h, 3)
        rows = np.stack([toy_logits(h + drafts[:i]) for i in range(4)])
        n_acc, nxt = rs.verify(rows, drafts)
        assert s.chain.heard == PROMPT + drafts[:n_acc] + [nxt]  # type: ignore[attr-defined]


@settings(max_examples=50, deadline=None)
@given(history=st.lists(st.integers(0, V - 1), min_size=2, max_size=6),
       drafts=st.lists(st.integers(0, V - 1), min_size=0, max_size=3))
def test_greedy_verify_keeps_exactly_the_argmax_prefix(history, drafts):
    s = Sampler(SamplingParams(temperature=0.0), ToyChain(0.0))
    rows = np.stack([toy_logits(history + drafts[:i]) for i in range(len(drafts) + 1)])
    n_acc, nxt = RejectionSampler(s).verify(rows, drafts)
    h = list(history)
    for i in range(n_acc):
        assert drafts[i] == int(np.argmax(toy_logits(h)))
        h.append(drafts[i])
    assert nxt == int(np.argmax(toy_logits(h)))
    if n_acc < len(drafts):
        assert drafts[n_acc] != nxt


def test_greedy_pick_is_the_highest_surviving_logit_when_the_chain_can_change_it():
    s = Sampler(SamplingParams(temperature=0.0), ToyChain(0.0, presence=10.0))
    logits = np.array([1.0, 1.1, 0.0, 0.0], dtype=np.float32)
    assert s.sample(logits) == 1
    s.accept(1)
    assert s.sample(logits) == 0


def test_seeded_sampling_is_reproducible():
    def sequence(seed):
        s = _sampler(seed, temperature=1.0, presence=0.0)
        return [s.sample(toy_logits([i % V, 2])) for i in range(50)]
    assert sequence(42) == sequence(42)
    assert sequence(42) != sequence(43)  # the seed is used: another one samples another sequence


def test_candidates_come_out_in_token_id_order_whatever_the_chain_order():
    ids = np.array([7, 2, 5], dtype=np.int32)
    logits = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    out_ids, probs = candidate_distribution(ids, logits)
    assert out_ids.tolist() == [2, 5, 7]
    z = np.exp(np.array([1.0, 2.0, 0.0]) - 2.0)
    np.testing.assert_allclose(probs, z / z.sum())


def test_candidates_at_minus_infinity_are_dropped():
    ids, probs = candidate_distribution(np.array([0, 1, 2], dtype=np.int32),
                                        np.array([0.0, -np.inf, 1.0], dtype=np.float32))
    assert ids.tolist() == [0, 2] and probs.sum() == pytest.approx(1.0)


def test_many_candidates_are_ordered_by_a_scatter_as_a_sort_would_order_them():
    rng = np.random.default_rng(0)
    ids = rng.permutation(50000)[:20000].astype(np.int32)  # above the sort limit
    logits = rng.normal(size=ids.size).astype(np.float32)
    got_ids, got_logits = in_id_order(ids, logits)
    order = np.argsort(ids)
    assert np.array_equal(got_ids, ids[order]) and np.array_equal(got_logits, logits[order])


def test_a_draw_never_lands_on_a_token_of_probability_zero():
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    assert {draw_index(probs, u) for u in np.linspace(0.0, 1.0 - 1e-16, 101)} == {1, 3}
    assert draw_index(np.array([0.3, 0.3, 0.3, 0.0]), np.nextafter(1.0, 0.0)) == 2


@pytest.mark.parametrize("kwargs", [
    {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -2}, {"min_p": 2.0},
    {"seed": -3}, {"temperature": "hot"}, {"repeat_last_n": 1.5}, {"temperature": float("nan")},
    {"typical_p": 1.5}, {"top_n_sigma": "1"}, {"xtc_probability": 2.0}, {"xtc_threshold": -0.1},
    {"dry_multiplier": -1.0}, {"dry_base": float("nan")}, {"dry_allowed_length": -1},
    {"dry_penalty_last_n": -2}, {"dry_sequence_breakers": "\n"}, {"dry_sequence_breakers": [""]},
    {"dry_sequence_breakers": [1]},
])
def test_invalid_sampling_parameters_are_refused(kwargs):
    with pytest.raises(InvalidParameterError):
        SamplingParams(**kwargs)


def test_new_samplers_default_to_llama_servers_values():
    d = SamplingParams()
    assert (d.typical_p, d.top_n_sigma, d.xtc_probability, d.xtc_threshold) == (1.0, -1.0, 0.0, 0.1)
    assert (d.dry_multiplier, d.dry_base, d.dry_allowed_length, d.dry_penalty_last_n) == (0.0, 1.75, 2, 64)
    assert d.dry_sequence_breakers == ("\n", ":", '"', "*")
