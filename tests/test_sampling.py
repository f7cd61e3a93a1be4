"""The sampler and the speculative verifier on a toy model with history-dependent logits.

The Monte Carlo tests compare the distribution of 3-token continuations produced by
one-at-a-time sampling with the one produced by drafting + :meth:`RejectionSampler.verify`: exact
speculative sampling must sit at the noise floor (the distance between two independent
one-at-a-time runs), and a deliberately wrong verifier (greedy-match: keep drafts equal to the
argmax) must be detected by the same test.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtp_bindings import InvalidParameterError
from mtp_bindings.generation.rejection import RejectionSampler
from mtp_bindings.generation.sampling import Sampler
from mtp_bindings.params import SamplingParams

V = 4
N_TOK = 3
N_SAMPLES = 30000
W = np.random.default_rng(7).normal(size=(V, V, V)) * 1.5


def toy_logits(history: list[int]) -> np.ndarray:
    """Logits that depend on the last two tokens (so penalties and order matter)."""
    a, b = (history[-2:] if len(history) >= 2 else [0] + history[-1:])
    return W[a, b].astype(np.float32)


def toy_draft(history: list[int], n: int) -> list[int]:
    """A good but imperfect drafter: the toy model's own greedy chain, with one fixed mistake."""
    h = list(history)
    out = []
    for i in range(n):
        tok = int(np.argmax(toy_logits(h))) if i != 1 else (int(np.argmax(toy_logits(h))) + 1) % V
        out.append(tok)
        h.append(tok)
    return out


def sample_plain(params: SamplingParams, seed: int) -> Counter:
    s = Sampler(SamplingParams(**{**params.__dict__, "seed": seed}))
    c: Counter = Counter()
    for _ in range(N_SAMPLES):
        h = [1, 2]
        for _ in range(N_TOK):
            h.append(s.sample(toy_logits(h), h))
        c[tuple(h[2:])] += 1
    return c


def sample_speculative(params: SamplingParams, seed: int, greedy_match: bool = False) -> Counter:
    s = Sampler(SamplingParams(**{**params.__dict__, "seed": seed}))
    c: Counter = Counter()
    for _ in range(N_SAMPLES):
        h = [1, 2]
        while len(h) - 2 < N_TOK:
            k = N_TOK - (len(h) - 2) - 1
            drafts = toy_draft(h, k)
            rows = np.stack([toy_logits(h + drafts[:i]) for i in range(k + 1)])
            if greedy_match:
                n_acc = 0
                while n_acc < k and int(np.argmax(rows[n_acc])) == drafts[n_acc]:
                    n_acc += 1
                nxt = s.sample(rows[n_acc], h + drafts[:n_acc])
            else:
                n_acc, nxt = RejectionSampler(s).verify(rows, drafts, h)
            h += drafts[:n_acc] + [nxt]
        c[tuple(h[2:2 + N_TOK])] += 1
    return c


def tv(a: Counter, b: Counter) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a[k] - b[k]) for k in keys) / N_SAMPLES


PARAMS = SamplingParams(temperature=0.8, top_k=0, top_p=0.95, min_p=0.02, repeat_penalty=1.3,
                        repeat_last_n=8, presence_penalty=0.2)


@pytest.fixture(scope="module")
def reference():
    return sample_plain(PARAMS, seed=1), sample_plain(PARAMS, seed=2)


def test_exact_speculative_sampling_matches_one_at_a_time_sampling(reference):
    ref, ref2 = reference
    floor = tv(ref, ref2)
    spec = tv(ref, sample_speculative(PARAMS, seed=3))
    assert floor < 0.03
    assert spec < max(0.03, 2.0 * floor), (spec, floor)


def test_greedy_match_verifier_is_detected_as_wrong(reference):
    ref, ref2 = reference
    floor = tv(ref, ref2)
    wrong = tv(ref, sample_speculative(PARAMS, seed=3, greedy_match=True))
    assert wrong > 5 * floor and wrong > 0.05, (wrong, floor)


@settings(max_examples=50, deadline=None)
@given(history=st.lists(st.integers(0, V - 1), min_size=2, max_size=6),
       drafts=st.lists(st.integers(0, V - 1), min_size=0, max_size=3))
def test_greedy_verify_keeps_exactly_the_argmax_prefix(history, drafts):
    s = Sampler(SamplingParams(temperature=0.0))
    rows = np.stack([toy_logits(history + drafts[:i]) for i in range(len(drafts) + 1)])
    n_acc, nxt = RejectionSampler(s).verify(rows, drafts, history)
    h = list(history)
    for i in range(n_acc):
        assert drafts[i] == int(np.argmax(toy_logits(h)))
        h.append(drafts[i])
    assert nxt == int(np.argmax(toy_logits(h)))
    if n_acc < len(drafts):
        assert drafts[n_acc] != nxt


def test_seeded_sampling_is_reproducible():
    def sequence(seed):
        s = Sampler(SamplingParams(temperature=1.0, seed=seed))
        return [s.sample(toy_logits([i % V, 2]), []) for i in range(50)]
    assert sequence(42) == sequence(42)
    assert sequence(42) != sequence(43)  # the seed is used: another one samples another sequence


def test_distribution_respects_top_k_and_top_p():
    s = Sampler(SamplingParams(temperature=1.0, top_k=2))
    ids, probs = s.distribution(np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32), [])
    assert ids.tolist() == [1, 3] and probs.sum() == pytest.approx(1.0)
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=0.5))
    ids, _ = s.distribution(np.array([0.0, 5.0, 1.0, 2.0], dtype=np.float32), [])
    assert ids.tolist() == [1]


def test_repeat_penalty_lowers_repeated_tokens():
    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=10.0))
    logits = np.array([1.0, 1.1, 0.0, 0.0], dtype=np.float32)
    assert s.sample(logits, []) == 1
    assert s.sample(logits, [1]) == 0


@pytest.mark.parametrize("kwargs", [
    {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -2}, {"min_p": 2.0},
    {"seed": -3}, {"temperature": "hot"}, {"repeat_last_n": 1.5}, {"temperature": float("nan")},
])
def test_invalid_sampling_parameters_are_refused(kwargs):
    with pytest.raises(InvalidParameterError):
        SamplingParams(**kwargs)
