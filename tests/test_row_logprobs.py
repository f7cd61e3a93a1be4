"""One row's log-softmax in C (``log_softmax_at``, ``mtp_row_logprobs``): the chosen token's and the ``k`` best
tokens' log-probabilities agree with a float64 numpy reference at Gemma 4's vocabulary (where the top-k
prefilter finds the candidates) and at a small one (every token a candidate), ties put the lower id first, and
a token outside the row is refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from mtp_bindings.exceptions import InvalidParameterError
from mtp_bindings.generation.logprobs import LogprobRecorder, log_softmax_at

from numerics import TOL

ATOL = TOL["logprob_vs_float64"].value


def reference(row: np.ndarray) -> np.ndarray:
    z = row.astype(np.float64)
    m = z.max()
    return z - (m + np.log(np.exp(z - m).sum()))


@pytest.mark.parametrize("n", [262144, 1024, 7])
@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_logprobs_agree_with_a_float64_reference(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    row = (rng.normal(size=n) * 3.0).astype(np.float32)
    row[rng.integers(n)] = -np.inf  # a banned token: probability 0, no harm to the sum
    ref = reference(row)
    token = int(rng.integers(n))
    lp = log_softmax_at(row, token, k)
    assert lp.logprob == pytest.approx(ref[token], abs=ATOL) or (np.isinf(ref[token]) and lp.logprob == -np.inf)
    k = min(k, n)
    assert [t for t, _ in lp.top] == np.argsort(-row, kind="stable")[:k].tolist()
    assert np.allclose([v for _, v in lp.top], ref[np.argsort(-row, kind="stable")[:k]], rtol=0, atol=ATOL)


def test_tied_alternatives_come_lower_id_first() -> None:
    row = np.full(262144, -5.0, dtype=np.float32)
    row[[90000, 7, 200000]] = 3.0
    lp = log_softmax_at(row, 7, 3)
    assert [t for t, _ in lp.top] == [7, 90000, 200000]
    assert lp.top[0][1] == lp.top[1][1] == lp.top[2][1] == lp.logprob


def test_a_recorder_gives_each_row_its_own_logprobs() -> None:
    rng = np.random.default_rng(3)
    rows = [(rng.normal(size=262144) * 2.0).astype(np.float32) for _ in range(3)]
    rec = LogprobRecorder(5)
    for r in rows:
        rec.record(r, 11)
    for r, lp in zip(rows, rec.take(3)):
        assert lp.logprob == pytest.approx(reference(r)[11], abs=ATOL)
        assert lp.top[0][0] == int(np.argmax(r))


@pytest.mark.parametrize("token", [-1, 1024])
def test_a_token_outside_the_row_is_refused(token: int) -> None:
    with pytest.raises(InvalidParameterError, match="outside"):
        log_softmax_at(np.zeros(1024, dtype=np.float32), token, 2)


def test_the_avx2_and_the_baseline_exp_sums_agree() -> None:
    from mtp_bindings.low_level import lib

    rng = np.random.default_rng(9)
    row = (rng.normal(size=262144) * 3.0).astype(np.float32)
    fast = log_softmax_at(row, 5, 4)
    lib.mtp_sampling_use_baseline(1)
    try:
        base = log_softmax_at(row, 5, 4)
    finally:
        lib.mtp_sampling_use_baseline(0)
    assert base.logprob == pytest.approx(fast.logprob, abs=1e-6) and base.logprob == pytest.approx(reference(row)[5], abs=ATOL)
    assert [t for t, _ in base.top] == [t for t, _ in fast.top]
