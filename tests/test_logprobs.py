"""``generate(logprobs=k)``: each emitted token's log-probability and its ``k`` best alternatives,
exact for drafted tokens (issue 16, item 4).

The reference is plain decoding's log-softmax: the prompt and the emitted tokens fed to the target alone
as plain generation decodes them (teacher forcing), each row's log-softmax in float64; the library's
(float32 exponentials, float64 sum) matches it within TOL["logprob_vs_float64"] (tests/numerics.py). MTP on
and off give the same logprobs bit for bit: a verify batch's rows are one-token decodes' rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from fixture_paths import BUNDLED
from numerics import TOL as TOLERANCES
from numerics import forced_rows

PROMPT = "def parse_args(argv):\n"
N = 24
K = 4
TOL = TOLERANCES["logprob_vs_float64"].value  # the emitted token's logprob and its alternatives'


@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    from mtp_bindings import Model

    target, assistant = BUNDLED / "trained-target.gguf", BUNDLED / "trained-assistant.gguf"
    with Model(target, assistant=assistant) as m:
        with m.create_context(n_ctx=512, n_threads=1, embeddings=True) as ctx:
            m._test_ctx = ctx
            yield m


def run(model: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("temperature", 0.0)
    return model.generate(PROMPT, max_tokens=N, context=model._test_ctx, **kwargs)


def plain_log_softmax(model: Any, tokens: list[int]) -> np.ndarray:
    """Rows of the log-softmax the target gives each of ``tokens`` after the prompt, decoding
    one token at a time (plain decoding), float64."""
    z = forced_rows(model._test_ctx, model.tokenize(PROMPT, add_special=True), tokens).astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))


def check_against_plain(model: Any, result: Any, k: int) -> None:
    ref = plain_log_softmax(model, result.tokens)
    assert [lp.token for lp in result.logprobs] == result.tokens
    for row, lp in zip(ref, result.logprobs):
        assert abs(lp.logprob - row[lp.token]) < TOL
        assert len(lp.top) == k
        for tok, value in lp.top:
            assert abs(value - row[tok]) < TOL
        assert np.allclose([v for _, v in lp.top], np.sort(row)[::-1][:k], rtol=0, atol=TOL)  # the k best, best first


def test_logprobs_with_mtp_equal_plain_log_softmax(model: Any) -> None:
    result = run(model, logprobs=K, draft_n_max=3)
    assert result.stats.n_accepted > 0, "nothing accepted: the test would not cover drafted tokens"
    check_against_plain(model, result, K)


def test_logprobs_without_drafting_equal_plain_log_softmax(model: Any) -> None:
    check_against_plain(model, run(model, logprobs=K, draft_n_max=0), K)


def test_mtp_on_and_off_give_the_same_logprobs_bit_for_bit(model: Any) -> None:
    on, off = run(model, logprobs=K, draft_n_max=3), run(model, logprobs=K, draft_n_max=0)
    assert on.stats.n_accepted > 0
    assert on.tokens == off.tokens
    assert on.logprobs == off.logprobs  # tokens, logprobs and alternatives, floats compared exactly


def test_sampled_tokens_get_the_targets_logprobs(model: Any) -> None:
    check_against_plain(model, run(model, logprobs=2, draft_n_max=3, temperature=0.9, seed=3), 2)


def test_greedy_token_is_the_top_alternative(model: Any) -> None:
    for lp in run(model, logprobs=1).logprobs:
        assert lp.top[0][0] == lp.token and abs(lp.top[0][1] - lp.logprob) < 1e-9


def test_streamed_pieces_carry_the_logprobs_of_their_tokens(model: Any) -> None:
    whole = run(model, logprobs=K)
    pieces = list(run(model, logprobs=K, stream=True))
    for p in pieces:
        assert [lp.token for lp in p.logprobs] == p.tokens
    assert [lp for p in pieces for lp in p.logprobs] == whole.logprobs


def test_each_logprob_carries_its_tokens_text_and_bytes(model: Any) -> None:
    result = run(model, logprobs=2)
    for lp in result.logprobs:
        assert lp.bytes == model.token_to_piece(lp.token) and lp.text == lp.bytes.decode("utf-8", errors="replace")
        assert lp.top_bytes == [model.token_to_piece(t) for t, _ in lp.top] and len(lp.top_text) == 2
    assert b"".join(lp.bytes for lp in result.logprobs).decode("utf-8", errors="replace") == result.text


def test_logprobs_zero_gives_the_chosen_tokens_only(model: Any) -> None:
    result = run(model, logprobs=0)
    assert len(result.logprobs) == len(result.tokens) and all(lp.top == [] for lp in result.logprobs)


def test_no_logprobs_unless_asked(model: Any) -> None:
    result = run(model)
    assert result.logprobs is None
    assert all(p.logprobs is None for p in run(model, stream=True))


@pytest.mark.parametrize("bad", [-1, 21, True, 1.5])
def test_bad_logprobs_are_refused(model: Any, bad: Any) -> None:
    from mtp_bindings import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="logprobs"):
        run(model, logprobs=bad)
