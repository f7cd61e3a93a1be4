"""Our sampling distribution is llama-server's: for each sampler set, the tokens our sampler draws
(:mod:`mtp_bindings.generation.chain`'s candidates, our softmax and our seeded draw) are distributed as
the tokens llama.cpp's own chain, ending in its ``dist`` sampler, draws from the same logits row.

The reference chain is built here with the raw C calls, in the order of the pin's
``common_sampler_init`` (common/sampling.cpp): logit_bias, penalties, dry, top_n_sigma, top_k,
typical, top_p, min_p, xtc, temperature, dist. Distances are total variation between empirical
distributions of ``N`` seeded draws each (the row's long tail in one bucket); the noise floor is the
distance between two reference runs with different seeds. Seeds are fixed, so each figure is the
same on every run. The bundled tiny model gives the vocabulary (1,024 tokens; DRY tokenizes its
sequence breakers with it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mtp_bindings.exceptions import InvalidParameterError
from mtp_bindings.generation.chain import TOKEN_DATA, SamplerChain, sampler_for
from mtp_bindings.generation.rejection import RejectionSampler
from mtp_bindings.low_level import ffi, lib
from mtp_bindings.config.params import SAMPLER_ORDER, SamplingParams

from test_sampling import V as TOY_V, toy_draft, toy_logits

N = 20000
N_CTX = 4096
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}  # every truncation off: each set below switches on its own
SETS: dict[str, dict[str, Any]] = {
    "temperature": {"temperature": 1.3, **OFF},
    "top_k": {"temperature": 1.0, **OFF, "top_k": 5},
    "top_p": {"temperature": 1.0, **OFF, "top_p": 0.7},
    "min_p": {"temperature": 1.0, **OFF, "min_p": 0.1},
    "typical_p": {"temperature": 1.0, **OFF, "typical_p": 0.6},
    "top_n_sigma": {"temperature": 1.0, **OFF, "top_n_sigma": 1.0},
    "xtc": {"temperature": 1.0, **OFF, "xtc_probability": 0.5, "xtc_threshold": 0.05},
    "penalties": {"temperature": 1.0, **OFF, "repeat_penalty": 1.5, "presence_penalty": 0.5,
                  "frequency_penalty": 0.3, "repeat_last_n": 8},
    "dry": {"temperature": 1.0, **OFF, "dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_penalty_last_n": 32},
    "defaults": {},
    "mix": {"temperature": 1.5, "top_p": 0.8, "top_k": 20, "min_p": 0.02, "repeat_penalty": 1.2, "repeat_last_n": 16,
            "dry_multiplier": 0.5, "xtc_probability": 0.3, "xtc_threshold": 0.1, "typical_p": 0.95,
            "top_n_sigma": 2.0, "logit_bias": {3: 2.0, 5: -100.0}},
}
# llama.cpp's name of each sampler of llama-server's order
C_NAMES = {"penalties": "penalties", "dry": "dry", "top_n_sigma": "top-n-sigma", "top_k": "top-k",
           "typ_p": "typical", "top_p": "top-p", "min_p": "min-p", "xtc": "xtc", "temperature": "temp-ext"}


@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    from mtp_bindings import Model
    from fixture_paths import BUNDLED

    with Model(BUNDLED / "trained-target.gguf") as m:
        yield m


@pytest.fixture(scope="module")
def row(model: Any) -> np.ndarray:
    """A fixed logits row: 16 likely tokens with evenly spaced logits (77% of the mass at temperature 1),
    and a long tail."""
    return logits_row(model.n_vocab)


def logits_row(n_vocab: int) -> np.ndarray:
    rng = np.random.default_rng(11)
    row = (rng.normal(size=n_vocab) - 5.0).astype(np.float32)
    row[rng.permutation(n_vocab)[:16]] = np.linspace(4.0, 1.0, 16)
    return row


def history_for(row: np.ndarray) -> list[int]:
    """Tokens already emitted: a prompt longer than the windows, ending in a repeat of likely tokens (so
    penalties and DRY change the next row: DRY penalises the most likely token, which would extend the
    repeat of ``top[1], top[2]``)."""
    top = [int(t) for t in np.argsort(-row)[:6]]
    return [top[5]] * 20 + [top[1], top[2], top[0], top[3], top[1], top[2]]


def llama_server_chain(p: SamplingParams, model: Any, seed: int) -> Any:
    """The pin's common_sampler_init for ``p``, ending in dist(seed); the caller frees it."""
    chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())

    def add(s: Any) -> None:
        lib.llama_sampler_chain_add(chain, s)

    if p.logit_bias:
        bias = ffi.new("llama_logit_bias[]", list(p.logit_bias.items()))
        add(lib.llama_sampler_init_logit_bias(model.n_vocab, len(p.logit_bias), bias))
    add(lib.llama_sampler_init_penalties(model.n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                                         p.presence_penalty))
    keep = [ffi.new("char[]", b.encode()) for b in p.dry_sequence_breakers]
    add(lib.llama_sampler_init_dry(model.vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                   p.dry_penalty_last_n, ffi.new("const char *[]", keep), len(keep)))
    add(lib.llama_sampler_init_top_n_sigma(p.top_n_sigma))
    add(lib.llama_sampler_init_top_k(p.top_k))
    add(lib.llama_sampler_init_typical(p.typical_p, 0))
    add(lib.llama_sampler_init_top_p(p.top_p, 0))
    add(lib.llama_sampler_init_min_p(p.min_p, 0))
    add(lib.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 0, seed))
    add(lib.llama_sampler_init_temp_ext(p.temperature, 0.0, 1.0))
    add(lib.llama_sampler_init_dist(seed))
    return chain


def c_draws(chain: Any, row: np.ndarray, n: int) -> Counter:
    """``n`` tokens drawn by a chain ending in dist from ``row`` (as llama_sampler_sample does, without
    accepting them)."""
    buf = np.zeros(len(row), dtype=TOKEN_DATA)
    data = ffi.from_buffer("llama_token_data[]", buf)
    arr = ffi.new("llama_token_data_array *")
    ids = np.arange(len(row), dtype=np.int32)
    counts: Counter = Counter()
    for _ in range(n):
        buf["id"], buf["logit"], buf["p"] = ids, row, 0.0
        arr.data, arr.size, arr.selected, arr.sorted = data, len(row), -1, False
        lib.llama_sampler_apply(chain, arr)
        counts[int(arr.data[arr.selected].id)] += 1
    return counts


def reference_draws(p: SamplingParams, model: Any, row: np.ndarray, history: list[int], seed: int) -> Counter:
    chain = llama_server_chain(p, model, seed)
    try:
        for t in history:
            lib.llama_sampler_accept(chain, t)
        return c_draws(chain, row, N)
    finally:
        lib.llama_sampler_free(chain)


def our_draws(p: SamplingParams, model: Any, row: np.ndarray, history: list[int]) -> Counter:
    with sampler_for(p, model.n_vocab, model.vocab) as s:
        s.accept_history(history)
        return Counter(s.sample(row) for _ in range(N))


def tv(a: Counter, b: Counter) -> float:
    return 0.5 * sum(abs(a[k] - b[k]) for k in set(a) | set(b)) / N


def coarse(counts: Counter, row: np.ndarray, n_head: int = 32) -> Counter:
    """``counts`` with the tokens outside the row's ``n_head`` best in one bucket (-1): the long tail's
    hundreds of rare tokens would otherwise make the noise floor, not the samplers, the measure."""
    head = {int(t) for t in np.argsort(-row)[:n_head]}
    out: Counter = Counter()
    for tok, n in counts.items():
        out[tok if tok in head else -1] += n
    return out


def params(name: str, seed: int = 1) -> SamplingParams:
    return SamplingParams(**SETS[name], seed=seed).resolved(N_CTX)


@pytest.mark.parametrize("name", list(SETS))
def test_our_draws_have_the_distribution_llama_cpps_chain_draws(model: Any, row: np.ndarray, name: str) -> None:
    hist = history_for(row)
    ref = coarse(reference_draws(params(name), model, row, hist, seed=101), row)
    floor = tv(ref, coarse(reference_draws(params(name), model, row, hist, seed=202), row))
    ours = tv(ref, coarse(our_draws(params(name, seed=303), model, row, hist), row))
    assert ours < 1.5 * floor + 0.005, (name, ours, floor)


@pytest.mark.parametrize("name", ["penalties", "dry"])
def test_a_chain_that_did_not_hear_the_history_is_told_apart(model: Any, row: np.ndarray, name: str) -> None:
    hist = history_for(row)
    ref = coarse(reference_draws(params(name), model, row, hist, seed=101), row)
    floor = tv(ref, coarse(reference_draws(params(name), model, row, hist, seed=202), row))
    deaf = tv(ref, coarse(our_draws(params(name, seed=303), model, row, []), row))
    assert deaf > 4 * floor, (name, deaf, floor)


def test_temperature_before_the_truncations_is_told_apart(model: Any, row: np.ndarray) -> None:
    # the order our sampler had before (temperature, then min-p and top-p) draws another distribution:
    # the distance above would catch it
    p = SamplingParams(temperature=1.5, top_p=0.8, top_k=0, min_p=0.05, seed=1).resolved(N_CTX)
    ref = reference_draws(p, model, row, [], seed=101)
    floor = tv(ref, reference_draws(p, model, row, [], seed=202))
    chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
    for s in (lib.llama_sampler_init_temp(p.temperature), lib.llama_sampler_init_min_p(p.min_p, 0),
              lib.llama_sampler_init_top_p(p.top_p, 0), lib.llama_sampler_init_dist(7)):
        lib.llama_sampler_chain_add(chain, s)
    try:
        wrong = tv(ref, c_draws(chain, row, N))
    finally:
        lib.llama_sampler_free(chain)
    assert wrong > 4 * floor and wrong > 0.05, (wrong, floor)


def test_the_chain_runs_llama_servers_samplers_in_its_order(model: Any) -> None:
    with SamplerChain(params("mix"), model.n_vocab, model.vocab) as chain:
        names = [n.lstrip("?") for n in chain.names()]  # llama.cpp names a disabled sampler "?name"
    assert names == ["logit-bias"] + [C_NAMES[s] for s in SAMPLER_ORDER]


def test_at_temperature_zero_the_chain_ends_before_the_temperature_sampler(model: Any) -> None:
    with SamplerChain(SamplingParams(temperature=0.0), model.n_vocab, model.vocab) as chain:
        assert chain.names()[-1].lstrip("?") == "xtc"


@pytest.mark.parametrize("name", ["penalties", "dry", "typical_p", "mix"])
def test_greedy_picks_what_llama_servers_temperature_zero_picks(model: Any, row: np.ndarray, name: str) -> None:
    kwargs = {k: v for k, v in SETS[name].items() if not k.startswith("xtc")}  # XTC's coin would differ
    p = SamplingParams(**{**kwargs, "temperature": 0.0}, seed=1).resolved(N_CTX)
    hist = history_for(row)
    ref = reference_draws(p, model, row, hist, seed=5)
    with sampler_for(p, model.n_vocab, model.vocab) as s:
        s.accept_history(hist)
        assert list(ref) == [s.sample(row)]


def test_greedy_without_samplers_that_move_the_argmax_takes_the_rows_argmax(model: Any, row: np.ndarray) -> None:
    with sampler_for(SamplingParams(temperature=0.0), model.n_vocab, model.vocab) as s:
        assert not s.chain.changes_argmax
        assert s.sample(row) == int(np.argmax(row))


def test_after_a_rejection_the_chain_is_one_that_heard_exactly_the_emitted_tokens(model: Any,
                                                                                 row: np.ndarray) -> None:
    p = SamplingParams(**SETS["penalties"], dry_multiplier=0.8, seed=3).resolved(N_CTX)
    hist = history_for(row)
    rng = np.random.default_rng(4)
    with sampler_for(p, model.n_vocab, model.vocab) as s:
        s.accept_history(hist)
        emitted: list[int] = []
        rejected = 0
        for i in range(30):
            # random drafts, mostly rejected; every other round the row's best ones, often accepted
            drafts = ([int(t) for t in np.argsort(-row)[:3]] if i % 2 else
                      [int(t) for t in rng.integers(0, model.n_vocab, size=3)])
            rows = [np.roll(row, i) for i in range(4)]
            n_acc, y = RejectionSampler(s).verify(rows, drafts)
            rejected += n_acc < 3
            emitted += drafts[:n_acc] + [y]
        with SamplerChain(p, model.n_vocab, model.vocab) as fresh:
            fresh.accept_history(hist + emitted)
            for r in (row, np.roll(row, 5)):
                ours, theirs = s.chain.apply(r), fresh.apply(r)
                assert rejected and all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def _toy_counts(p: SamplingParams, draft_n_max: int, n: int) -> Counter:
    """3-token continuations of the toy model (tests/test_sampling.py) with a real chain over its 4 tokens."""
    counts: Counter = Counter()
    with sampler_for(p, TOY_V) as s:
        for _ in range(n):
            s.chain.reset([1, 2])
            rs, h = RejectionSampler(s), [1, 2]
            while len(h) - 2 < 3:
                k = min(draft_n_max, 3 - (len(h) - 2) - 1)
                drafts = toy_draft(h, k)
                n_acc, y = rs.verify([toy_logits(h + drafts[:i]) for i in range(k + 1)], drafts)
                h += drafts[:n_acc] + [y]
            counts[tuple(h[2:5])] += 1
    return counts


def test_speculative_sampling_through_the_chain_matches_one_at_a_time_sampling() -> None:
    def p(seed: int) -> SamplingParams:
        return SamplingParams(temperature=0.8, top_k=3, top_p=0.95, min_p=0.02, repeat_penalty=1.3, repeat_last_n=8,
                              presence_penalty=0.5, seed=seed).resolved(N_CTX)
    ref = _toy_counts(p(1), 0, N)
    floor = tv(ref, _toy_counts(p(2), 0, N))
    spec = tv(ref, _toy_counts(p(3), 2, N))
    assert spec < max(0.035, 2.0 * floor), (spec, floor)


def test_a_row_of_another_size_is_refused(model: Any) -> None:
    with SamplerChain(SamplingParams(), model.n_vocab) as chain, pytest.raises(InvalidParameterError):
        chain.apply(np.zeros(model.n_vocab + 1, dtype=np.float32))


def test_dry_without_a_vocabulary_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="DRY"):
        SamplerChain(SamplingParams(dry_multiplier=1.0), 16)


def test_unresolved_windows_are_refused() -> None:
    with pytest.raises(InvalidParameterError, match="resolved"):
        SamplerChain(SamplingParams(repeat_last_n=-1), 16)


def test_a_closed_chain_is_freed_once_and_refuses_use(model: Any) -> None:
    chain = SamplerChain(SamplingParams(), model.n_vocab)
    chain.close()
    chain.close()
    with pytest.raises(ValueError, match="closed"):
        chain.apply(np.zeros(model.n_vocab, dtype=np.float32))


BIG_V = 262144  # Gemma 4's vocabulary: there the chain starts from a few candidates holding the top k
BIG_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "top_k_top_p": {"temperature": 1.0, "top_k": 5, "top_p": 0.7, "min_p": 0.0},
    "typical_p": {"temperature": 1.0, "top_k": 50, "typical_p": 0.6, "top_p": 1.0, "min_p": 0.0},
    "xtc": {"temperature": 1.0, "top_k": 40, "xtc_probability": 0.5, "xtc_threshold": 0.05, "seed": 3},
    "min_p": {"temperature": 1.5, "top_k": 64, "top_p": 1.0, "min_p": 0.1},
    "bans": {"temperature": 1.0, "top_k": 40, "logit_bias": {1: float("-inf"), 2: float("-inf")}},
    "bans_of_the_best": {"temperature": 1.0, "top_k": 40, "logit_bias": {7: float("-inf"), 11: float("-inf")}},
}


def big_row(seed: int, floor_ties: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    row = (rng.normal(size=BIG_V) * 2.0).astype(np.float32)
    row[rng.permutation(BIG_V)[:30]] = np.linspace(9.0, 6.0, 30)
    row[7] = row[11] = 12.0  # the best tokens, banned in "bans_of_the_best"
    if floor_ties:  # the scaled pair's padding tokens: a third of the vocabulary at one floor value
        row[BIG_V // 3: 2 * BIG_V // 3] = -30.0
    return row


@pytest.mark.parametrize("floor_ties", [False, True])
@pytest.mark.parametrize("name", list(BIG_SETS))
def test_the_chain_from_the_top_k_candidates_keeps_what_it_keeps_from_the_whole_row(
        monkeypatch: pytest.MonkeyPatch, name: str, floor_ties: bool) -> None:
    from mtp_bindings.generation import chain as chain_module

    started_from: list[int] = []
    superset = chain_module.top_k_superset
    monkeypatch.setattr(chain_module, "top_k_superset",
                        lambda row, k, out=None: started_from.append(k) or superset(row, k, out))
    p = SamplingParams(**BIG_SETS[name]).resolved(N_CTX)
    whole = {**(p.logit_bias or {}), 0: 0.0}  # a bias of 0 changes no logit, but makes the chain read every token
    kept = []
    for q in (p, SamplingParams(**{**BIG_SETS[name], "logit_bias": whole}).resolved(N_CTX)):
        with SamplerChain(q, BIG_V) as chain:
            ids, logits = chain.apply(big_row(5, floor_ties))
        order = np.argsort(ids)
        kept.append((ids[order], logits[order]))
    assert len(started_from) == 1  # only the first chain started from candidates
    assert np.array_equal(kept[0][0], kept[1][0]) and np.array_equal(kept[0][1], kept[1][1])


def test_the_top_k_superset_holds_the_top_k_and_few_others() -> None:
    from mtp_bindings.generation.chain import top_k_superset

    for seed in range(5):
        row = big_row(seed, floor_ties=seed % 2 == 1)
        for k in (1, 5, 40, 100):
            ids = top_k_superset(row, k)
            assert ids is not None and np.all(np.diff(ids) > 0)
            assert set(np.argsort(-row, kind="stable")[:k].tolist()) <= set(ids.tolist())
            assert ids.size <= 64 * k  # a few blocks' worth, not the vocabulary


def test_the_top_k_superset_keeps_every_token_tied_with_the_kth() -> None:
    from mtp_bindings.generation.chain import top_k_superset

    row = np.full(BIG_V, -3.0, dtype=np.float32)
    row[[7, 900, 5000]] = 2.0   # three above; the 5th highest is a tie among the rest, all of them kept
    ids = top_k_superset(row, 5)
    assert ids is not None and ids.size == BIG_V
    row[np.arange(0, BIG_V, 97)] = 1.0  # now k of them are above the floor: the floor's ties stay out
    ids = top_k_superset(row, 5)
    assert ids is not None and set(ids.tolist()) == set(np.flatnonzero(row > -3.0).tolist())


@pytest.mark.parametrize("spread,p", [(2.0, 0.9), (3.0, 0.95), (2.5, 0.7), (1.0, 0.3)])
def test_top_p_keeps_the_largest_logits_that_hold_p_when_the_top_256_hold_less(spread: float, p: float) -> None:
    # A flat row: llama.cpp's top-p first sorts the 256 largest, and they hold less than p. Patch 0022 then sorts
    # as many as a histogram of the probability mass says hold p, where upstream sorted the whole row.
    row = (np.random.default_rng(int(spread * 10 + p * 100)).standard_normal(40000) * spread).astype(np.float32)
    q = SamplingParams(temperature=1.0, top_k=0, min_p=0.0, top_p=p).resolved(N_CTX)
    with SamplerChain(q, row.size) as chain:
        ids, logits = chain.apply(row)
    n = ids.size
    assert n > 256 and np.all(np.diff(logits) <= 0)  # the fallback ran, and kept its candidates sorted
    assert np.array_equal(logits, np.sort(row)[::-1][:n]) and np.array_equal(row[ids], logits)
    probs = np.exp(np.sort(row.astype(np.float64))[::-1] - row.max())
    mass = np.cumsum(probs / probs.sum())
    # the cut is where the running sum reaches p: one token fewer holds less (the C sum is float32, hence the slack)
    assert mass[n - 1] >= p - 1e-4 and mass[n - 2] < p + 1e-4
