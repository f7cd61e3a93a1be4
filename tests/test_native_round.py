"""The verify round in C (``SamplerChain.verify_round``, what ``RejectionSampler`` runs over llama.cpp's chain,
a grammar's masks included) is the rule of exact speculative sampling over the chain's distribution: given the same
uniform numbers it emits the tokens a plain numpy reading of the rule emits (the reference below, built from
the chain's candidates and our softmax); its one-row draws have llama-server's distribution; greedy rounds
pick what the chain picks at temperature 0 (that a stateful chain hears exactly the emitted tokens is
test_sampler_chain's test of the rejection sampler, which runs this round).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from mtp_bindings.config.params import SamplingParams
from mtp_bindings.exceptions import InvalidParameterError
from mtp_bindings.generation.chain import SamplerChain, sampler_for
from mtp_bindings.generation.sampling import Sampler, draw_index

from test_sampler_chain import (BIG_SETS, BIG_V, N, N_CTX, SETS, big_row, coarse, history_for, model, params,  # noqa: F401
                                reference_draws, row, tv)


def numpy_round(s: Sampler, rows: Sequence[np.ndarray], drafts: Sequence[int], u: np.ndarray) -> tuple[int, int]:
    """The rule, read in numpy: draft i accepted where u[2 i] is below its probability, else a token drawn
    with u[2 i + 1] from the row without it; the bonus drawn with the last row's u[2 i + 1]."""
    for i, d in enumerate(drafts):
        if s.params.greedy:
            tok = s.greedy_pick(rows[i])
            s.accept(tok)
            if tok != d:
                return i, tok
            continue
        ids, probs = s.distribution(rows[i])
        hit = int(np.searchsorted(ids, d))
        p_d = float(probs[hit]) if hit < ids.size and ids[hit] == d else 0.0
        if p_d > 0.0 and u[2 * i] < p_d:
            s.accept(d)
            continue
        if p_d > 0.0:
            probs = probs.copy()
            probs[hit] = 0.0
            probs /= probs.sum()
        tok = int(ids[draw_index(probs, u[2 * i + 1])])
        s.accept(tok)
        return i, tok
    last = rows[len(drafts)]
    if s.params.greedy:
        tok = s.greedy_pick(last)
    else:
        ids, probs = s.distribution(last)
        tok = int(ids[draw_index(probs, u[2 * len(drafts) + 1])])
    s.accept(tok)
    return len(drafts), tok


def rounds(p: SamplingParams, n_vocab: int, vocab: Any, base: np.ndarray, n_rounds: int, native: bool,
           hist: list[int]) -> list[tuple[int, int]]:
    """``n_rounds`` rounds of 3 drafts, each draft one of a row's likely tokens (so drafts are accepted and
    rejected), the same rows, drafts and numbers for both readings."""
    rng = np.random.default_rng(5)
    out = []
    with sampler_for(p, n_vocab, vocab) as s:
        s.accept_history(hist)
        for _ in range(n_rounds):
            rows = [np.roll(base, int(rng.integers(0, 4))) for _ in range(4)]
            drafts = [int(np.argsort(-r)[int(rng.integers(0, 4))]) for r in rows[:3]]
            u = rng.random(8)
            out.append(s.chain.verify_round(rows, drafts, None if p.greedy else u) if native
                       else numpy_round(s, rows, drafts, u))
    return out


@pytest.mark.parametrize("name", list(SETS))
def test_the_native_round_emits_what_the_rule_read_in_numpy_emits(model: Any, row: np.ndarray, name: str) -> None:
    p, hist = params(name), history_for(row)
    ours = rounds(p, model.n_vocab, model.vocab, row, 300, True, hist)
    assert ours == rounds(p, model.n_vocab, model.vocab, row, 300, False, hist)
    counts = {n for n, _ in ours}
    assert 0 in counts and max(counts) >= 2  # drafts were accepted and rejected: both branches were taken


@pytest.mark.parametrize("name", ["defaults", "penalties", "mix"])
def test_a_greedy_native_round_picks_what_the_chain_picks_at_temperature_zero(model: Any, row: np.ndarray,
                                                                               name: str) -> None:
    p, hist = SamplingParams(**{**SETS[name], "temperature": 0.0, "seed": 1}).resolved(N_CTX), history_for(row)
    assert rounds(p, model.n_vocab, model.vocab, row, 100, True, hist) == \
        rounds(p, model.n_vocab, model.vocab, row, 100, False, hist)


@pytest.mark.parametrize("name", list(BIG_SETS))
def test_at_gemma_4s_vocabulary_the_native_round_emits_what_the_numpy_rule_emits(name: str) -> None:
    # the top-k prefilter, the bans' fallback to the whole row and the many-candidates ordering all run here
    p = SamplingParams(**BIG_SETS[name]).resolved(N_CTX)
    base = big_row(5, floor_ties=False)
    assert rounds(p, BIG_V, None, base, 20, True, []) == rounds(p, BIG_V, None, base, 20, False, [])


# top_k 0 at Gemma 4's vocabulary: every token a candidate, in the row's order (temperature alone keeps it) or in
# top-p's order of probability (thousands survive a row as flat as big_row's)
WHOLE_VOCABULARY = {"in_id_order": {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
                    "reordered": {"temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_p": 0.0}}


@pytest.mark.parametrize("exp", ["avx2", "baseline"])  # the weights' exp: AVX2 where the CPU has it, else SSE2
@pytest.mark.parametrize("name", list(WHOLE_VOCABULARY))
def test_with_every_token_a_candidate_the_native_round_emits_what_the_numpy_rule_emits(name: str, exp: str) -> None:
    from mtp_bindings.low_level import lib

    p = SamplingParams(**WHOLE_VOCABULARY[name], seed=1).resolved(N_CTX)
    base = big_row(5, floor_ties=False)
    with sampler_for(p, BIG_V) as s:
        ids, _ = s.distribution(base)
    assert ids.size > 4096  # more than MTP_ROUND_SORT_MAX: the many-candidates path
    lib.mtp_sampling_use_baseline(int(exp == "baseline"))
    try:
        native = rounds(p, BIG_V, None, base, 12, True, [])
    finally:
        lib.mtp_sampling_use_baseline(0)
    assert native == rounds(p, BIG_V, None, base, 12, False, [])


@pytest.mark.parametrize("name", ["defaults", "top_p", "xtc", "penalties", "dry"])
def test_one_row_native_rounds_draw_llama_servers_distribution(model: Any, row: np.ndarray, name: str) -> None:
    hist = history_for(row)
    ref = coarse(reference_draws(params(name), model, row, hist, seed=101), row)
    floor = tv(ref, coarse(reference_draws(params(name), model, row, hist, seed=202), row))
    counts: Counter = Counter()
    with sampler_for(params(name, seed=303), model.n_vocab, model.vocab) as s:
        for _ in range(N):
            if s.chain.stateful:  # every draw after the same history, as the reference's (a reset would also
                s.chain.reset(hist)  # reseed XTC's coin: it has no history)
            counts[s.chain.verify_round([row], [], s.rng.random(2))[1]] += 1
    ours = tv(ref, coarse(counts, row))
    assert ours < 1.5 * floor + 0.005, (name, ours, floor)


def test_a_round_with_too_few_rows_or_numbers_is_refused(model: Any, row: np.ndarray) -> None:
    with SamplerChain(params("defaults"), model.n_vocab) as chain:
        with pytest.raises(InvalidParameterError, match="rows"):
            chain.verify_round([row], [1], np.zeros(4))
        with pytest.raises(InvalidParameterError, match="uniform"):
            chain.verify_round([row, row], [1], np.zeros(2))
        with pytest.raises(InvalidParameterError, match="rows"):
            chain.verify_round([row.astype(np.float64)], [], np.zeros(2))
        with pytest.raises(InvalidParameterError, match="rows"):
            chain.verify_round([row.view(np.int32)], [], np.zeros(2))  # the same bytes, not logits


def test_a_round_on_a_closed_chain_is_refused(model: Any, row: np.ndarray) -> None:
    chain = SamplerChain(params("defaults"), model.n_vocab)
    chain.close()
    with pytest.raises(ValueError, match="closed"):
        chain.verify_round([row], [], np.zeros(2))


def test_a_row_with_every_token_banned_is_refused(model: Any) -> None:
    with SamplerChain(params("defaults"), model.n_vocab) as chain, pytest.raises(ValueError, match="no candidate"):
        chain.verify_round([np.full(model.n_vocab, -np.inf, dtype=np.float32)], [], np.zeros(2))


def test_a_greedy_round_takes_the_first_of_tied_maxima_as_numpy_does(model: Any) -> None:
    p = SamplingParams(temperature=0.0).resolved(N_CTX)
    row = np.zeros(model.n_vocab, dtype=np.float32)
    row[[300, 900, 901]] = 5.0  # three blocks apart and within one
    with SamplerChain(p, model.n_vocab) as chain:
        assert chain.verify_round([row], [], None) == (0, int(np.argmax(row))) == (0, 300)
        assert chain.verify_round([row, row], [300], None) == (1, 300)


def packed(allowed: np.ndarray) -> np.ndarray:
    """A bool mask as llguidance packs it: token t in bit t % 32 of uint32 word t // 32."""
    bits = np.packbits(allowed, bitorder="little")
    bits = np.concatenate([bits, np.zeros(-bits.size % 4, dtype=np.uint8)])
    return bits.view(np.uint32)


@pytest.mark.parametrize("few", [False, True], ids=["half-allowed", "few-allowed"])
@pytest.mark.parametrize("name", ["defaults", "top_k_top_p", "bans", "greedy"])
def test_a_masked_native_round_emits_what_the_rule_emits_on_masked_rows(name: str, few: bool) -> None:
    # few allowed: fewer than k of the prefilter's candidates survive the mask, and the round reads the whole row
    settings = {"temperature": 0.0} if name == "greedy" else BIG_SETS[name]
    p = SamplingParams(**settings, seed=2).resolved(N_CTX)
    base = big_row(5, floor_ties=False)
    out = []
    for native in (True, False):
        emitted = []
        r = np.random.default_rng(6)
        with sampler_for(p, BIG_V) as s:
            for _ in range(10):
                rows = [np.roll(base, int(r.integers(0, 3))) for _ in range(4)]
                allowed = [r.random(BIG_V) < (0.0001 if few else 0.5) for _ in range(4)]
                for a, row in zip(allowed, rows):
                    a[np.argsort(-row)[:2]] = True  # the drafts below are allowed
                drafts = [int(np.argsort(-row)[int(r.integers(0, 2))]) for row in rows[:3]]
                u = r.random(8)
                if native:
                    masks = np.stack([packed(a) for a in allowed])
                    emitted.append(s.chain.verify_round(rows, drafts, None if p.greedy else u, masks))
                else:
                    masked = [np.where(a, row, np.float32(-np.inf)).astype(np.float32) for a, row in zip(allowed, rows)]
                    emitted.append(numpy_round(s, masked, drafts, u))
        out.append(emitted)
    assert out[0] == out[1]


def test_masks_of_another_shape_are_refused(model: Any, row: np.ndarray) -> None:
    with SamplerChain(params("defaults"), model.n_vocab) as chain, pytest.raises(InvalidParameterError, match="masks"):
        chain.verify_round([row], [], np.zeros(2), np.zeros((1, 3), dtype=np.uint32))
