"""The MTP driver: lossless at temperature 0 (tokens equal plain greedy decoding for every
prompt, draft_n_max, fixture, head and depth2 setting) and at temperature > 0 (Monte Carlo),
the h_idx correction, skip-streak, the NDJSON trace, and request lifecycle with MTP on."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fixture_paths import PAIRS, fixture_path
from numerics import assert_same_tokens
from mtp_bindings import Model
from mtp_bindings.generation.driver import h_idx_for_tests
from mtp_bindings.generation.rejection import RejectionSampler

PROMPTS = ["def main(argv):\n", "import os\nimport sys\n", "class Queue:\n    def __init__(self):",
           "x = {'a': 1, 'b': [2, 3]}\n", "    return self._data[key]\n"]


def assert_same_greedy(plain, spec, label) -> None:
    """``spec`` equals ``plain`` token for token: a verify batch rounds each row as the one-token decode
    it stands for (every CPU kernel of a decode is batch-invariant: the patches tests/numerics.py lists), so
    MTP at temperature 0 is plain greedy decoding exactly, near-ties included (tests/numerics.py)."""
    assert_same_tokens(plain.tokens, spec.tokens, f"{label}: MTP vs plain greedy")


@pytest.fixture(scope="module", params=list(PAIRS))
def pair(request):
    # an F32 KV cache here (flash attention off: its KQ product takes a permuted Q, patch 0123), the default F16
    # one for the trained pair below: both are exact
    target, assistant = PAIRS[request.param]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m:
        with m.create_context(n_ctx=512, embeddings=True, type_k="f32", type_v="f32") as ctx:
            yield request.param, m, ctx


@pytest.fixture(scope="module")
def trained(trained_paths):
    t, a = trained_paths
    with Model(t, assistant=a) as m:
        with m.create_context(n_ctx=1024, embeddings=True) as ctx:
            yield m, ctx


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=st.sampled_from(PROMPTS) | st.text(alphabet="abcdefxyz_()=:\n ", min_size=1, max_size=30),
       draft_n_max=st.integers(1, 6), depth2=st.booleans())
def test_greedy_mtp_equals_plain_greedy(pair, prompt, draft_n_max, depth2):
    name, model, ctx = pair
    # no prompt cache: both decode the prompt in one batch. With it, the two started from KV computed in other
    # splits (the earlier examples' histories), and with this f32 KV cache a split prompt rounds differently (up
    # to 7.5e-5 on a Zen 4): one run in ten parted at a near-tie, which is no MTP error
    plain = model.generate(prompt, max_tokens=40, draft_n_max=0, context=ctx, temperature=0, cache_prompt=False)
    # a prompt whose greedy continuation ends at once leaves nothing to draft (e.g. " )a)c::=(e==" on ple)
    assume(len(plain.tokens) > 1)
    spec = model.generate(prompt, max_tokens=40, draft_n_max=draft_n_max, depth2=depth2, context=ctx, temperature=0,
                          cache_prompt=False)
    assert spec.stats.n_drafted > 0
    assert_same_greedy(plain, spec, name)


@pytest.mark.parametrize("depth2", [True, False])
def test_trained_pair_greedy_mtp_equals_plain(trained, depth2):
    model, ctx = trained
    for prompt in PROMPTS:
        plain = model.generate(prompt, max_tokens=64, draft_n_max=0, context=ctx, temperature=0)
        for n in (1, 2, 3, 4):
            spec = model.generate(prompt, max_tokens=64, draft_n_max=n, depth2=depth2, context=ctx, temperature=0)
            assert_same_greedy(plain, spec, (prompt, n))


def _continuations(model, ctx, n_samples, draft_n_max, seed, verify=None):
    counts: Counter = Counter()
    for i in range(n_samples):
        r = model.generate(PROMPTS[0], max_tokens=3, temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=seed * 100003 + i,
                           draft_n_max=draft_n_max, context=ctx)
        counts[tuple(r.tokens)] += 1
    return counts


def _tv(a: Counter, b: Counter, n: int) -> float:
    return 0.5 * sum(abs(a[k] - b[k]) for k in set(a) | set(b)) / n


def _greedy_match_verify(self, rows, drafts):
    """The wrong verifier the test must catch: keep drafts equal to the argmax, sample the rest."""
    import numpy as np
    n = 0
    while n < len(drafts) and int(np.argmax(rows[n])) == drafts[n]:
        self._emit(drafts[n])
        n += 1
    return n, self.sample(rows[n])


def test_sampling_with_mtp_has_the_plain_distribution_and_greedy_match_is_caught(trained, monkeypatch):
    model, ctx = trained
    n = 1500
    ref = _continuations(model, ctx, n, 0, seed=1)
    ref2 = _continuations(model, ctx, n, 0, seed=2)
    spec = _continuations(model, ctx, n, 3, seed=3)
    floor = _tv(ref, ref2, n)
    exact = _tv(ref, spec, n)
    monkeypatch.setattr(RejectionSampler, "verify", _greedy_match_verify)
    wrong = _tv(ref, _continuations(model, ctx, n, 3, seed=4), n)
    assert exact < max(0.06, 1.6 * floor), (exact, floor)
    assert wrong > 2 * max(exact, floor) and wrong > 0.08, (wrong, exact, floor)


def test_seeded_mtp_sampling_is_reproducible(trained):
    model, ctx = trained
    a = model.generate(PROMPTS[1], max_tokens=32, temperature=0.8, seed=5, draft_n_max=3, context=ctx)
    b = model.generate(PROMPTS[1], max_tokens=32, temperature=0.8, seed=5, draft_n_max=3, context=ctx)
    assert a.tokens == b.tokens


def test_h_idx_of_the_last_accepted_token_beats_the_last_batch_row(trained):
    model, ctx = trained
    def rate(h_idx: str) -> float:
        acc = drafted = 0
        for prompt in PROMPTS:
            with h_idx_for_tests(h_idx):  # a test-only switch, not a parameter of generate
                s = model.generate(prompt, max_tokens=96, draft_n_max=4, context=ctx, temperature=0).stats
            acc, drafted = acc + s.n_accepted, drafted + s.n_drafted
        return acc / drafted

    good, bad = rate("accepted"), rate("last")  # measured: 0.43 vs 0.29
    assert good > 1.25 * bad, (good, bad)


def test_trace_events_parse_and_their_counts_equal_stats(trained):
    model, ctx = trained
    sink = io.StringIO()
    r = model.generate(PROMPTS[2], max_tokens=64, draft_n_max=3, context=ctx, trace=sink, temperature=0)
    events = [json.loads(line) for line in sink.getvalue().splitlines()]
    drafts = [e for e in events if e["event"] == "mtp_draft"]
    accepts = [e for e in events if e["event"] == "mtp_accept"]
    assert len(drafts) == len(accepts) == r.stats.n_rounds
    assert sum(e["n_accepted"] for e in accepts) == r.stats.n_accepted
    assert sum(len(e["drafts"]) for e in drafts) == r.stats.n_drafted
    assert {"iter", "path", "seq_id", "id_last", "h_idx", "attn_pos", "n_steps", "h_l2", "drafts"} <= set(drafts[0])
    assert {e["path"] for e in drafts} <= {"sync", "lazy", "skip-streak", "skip-nsteps"}


def test_trace_file_from_the_environment(trained, tmp_path, monkeypatch):
    model, ctx = trained
    path = tmp_path / "trace.ndjson"
    monkeypatch.setenv("LLAMA_MTP_ACC_TRACE", str(path))
    r = model.generate(PROMPTS[0], max_tokens=20, draft_n_max=2, context=ctx, temperature=0)
    lines = path.read_text().splitlines()
    assert sum(1 for line in lines if json.loads(line)["event"] == "mtp_accept") == r.stats.n_rounds


def test_depth2_drafts_lazily(trained):
    model, ctx = trained
    sink = io.StringIO()
    model.generate(PROMPTS[0], max_tokens=48, draft_n_max=2, context=ctx, trace=sink, depth2=True, temperature=0)
    paths = Counter(json.loads(line)["path"] for line in sink.getvalue().splitlines() if "path" in line)
    assert paths["lazy"] > paths["sync"]


def test_depth2_off_from_the_environment(trained, monkeypatch):
    model, ctx = trained
    monkeypatch.setenv("LLAMA_PIPELINE_DEPTH2", "0")
    sink = io.StringIO()
    model.generate(PROMPTS[0], max_tokens=32, draft_n_max=2, context=ctx, trace=sink, temperature=0)
    paths = Counter(json.loads(line)["path"] for line in sink.getvalue().splitlines() if "path" in line)
    assert paths["lazy"] == 0 and paths["sync"] > 0


def test_skip_streak_threshold_one_never_skips_forever(tmp_path):
    # a random assistant accepts (almost) nothing: threshold 1 must alternate, not stop drafting
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as model:
        sink = io.StringIO()
        r = model.generate(PROMPTS[0], max_tokens=60, draft_n_max=2, skip_streak=1, trace=sink, temperature=0)
        paths = [json.loads(line)["path"] for line in sink.getvalue().splitlines() if "path" in line]
        assert "skip-streak" in paths
        assert not any(a == b == "skip-streak" for a, b in zip(paths, paths[1:]))
        assert paths[-6:].count("skip-streak") < 6 and any(p in ("sync", "lazy") for p in paths[-4:])
        assert r.stats.n_skipped_rounds == paths.count("skip-streak")


def test_skip_streak_from_the_environment(monkeypatch):
    target, assistant = PAIRS["dense"]
    monkeypatch.setenv("LLAMA_MTP_SKIP_STREAK_THRESHOLD", "2")
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as model:
        r = model.generate(PROMPTS[0], max_tokens=60, draft_n_max=2, temperature=0)
        assert r.stats.n_skipped_rounds > 0


def test_stats_account_for_every_token(trained):
    model, ctx = trained
    r = model.generate(PROMPTS[3], max_tokens=50, draft_n_max=3, context=ctx, temperature=0)
    s = r.stats
    assert s.n_generated == len(r.tokens) + (1 if s.hit_eog else 0) or s.n_generated == len(r.tokens)
    assert s.n_generated - 1 == s.n_accepted + s.n_rounds
    assert sum(s.drafted_per_position) == s.n_drafted and sum(s.accepted_per_position) == s.n_accepted
    assert 0.0 <= s.acceptance_rate <= 1.0 and s.tokens_per_second > 0


def test_stop_string_and_max_tokens_with_mtp(trained):
    model, ctx = trained
    full = model.generate(PROMPTS[0], max_tokens=60, draft_n_max=3, context=ctx, temperature=0)
    assert len(full.text) >= 13, "the stop string below must come from the text"
    stop = full.text[10:13]
    r = model.generate(PROMPTS[0], max_tokens=60, draft_n_max=3, context=ctx, stop=stop, temperature=0)
    assert r.text == full.text[: full.text.index(stop)] and r.finish_reason == "stop"
    for n in (1, 2, 5, 7):
        assert len(model.generate(PROMPTS[0], max_tokens=n, draft_n_max=4, context=ctx, temperature=0).tokens) == n


def test_cancelled_stream_leaves_the_context_ready_for_the_next_request(trained):
    model, ctx = trained
    want = model.generate(PROMPTS[1], max_tokens=40, draft_n_max=3, context=ctx, temperature=0).tokens
    stream = model.generate(PROMPTS[4], max_tokens=200, draft_n_max=3, context=ctx, stream=True, temperature=0)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert model.generate(PROMPTS[1], max_tokens=40, draft_n_max=3, context=ctx, temperature=0).tokens == want


def test_end_of_generation_token_stops_with_mtp(trained):
    model, ctx = trained
    eos = model.token_eos
    # find a logit bias on EOS that makes plain greedy decoding stop a few tokens in
    for bias in (4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0):
        plain = model.generate(PROMPTS[0], max_tokens=60, draft_n_max=0, context=ctx, logit_bias={eos: bias}, temperature=0)
        if plain.finish_reason == "stop" and len(plain.tokens) >= 3:
            break
    else:
        pytest.fail("no bias made EOS appear mid-generation")
    spec = model.generate(PROMPTS[0], max_tokens=60, draft_n_max=3, context=ctx, logit_bias={eos: bias}, temperature=0)
    assert spec.tokens == plain.tokens and spec.finish_reason == "stop"
    assert eos not in spec.tokens and spec.stats.hit_eog


def test_ignore_eos_generates_through_end_of_generation(trained):
    model, ctx = trained
    eos = model.token_eos
    stopped = model.generate(PROMPTS[0], max_tokens=40, draft_n_max=2, context=ctx, logit_bias={eos: 30.0}, temperature=0)
    assert stopped.finish_reason == "stop" and len(stopped.tokens) < 40
    r = model.generate(PROMPTS[0], max_tokens=40, draft_n_max=2, context=ctx, logit_bias={eos: 30.0}, ignore_eos=True, temperature=0)
    assert len(r.tokens) == 40 and r.finish_reason == "length"


def test_logit_bias_outside_the_vocabulary_is_refused(trained):
    from mtp_bindings import InvalidParameterError
    model, ctx = trained
    with pytest.raises(InvalidParameterError, match="logit_bias"):
        model.generate(PROMPTS[0], max_tokens=4, context=ctx, logit_bias={model.n_vocab + 5: 1.0}, temperature=0)
