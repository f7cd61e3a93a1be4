"""The near-tie rule (``mtp_bindings.generation.agreement``): when the greedy tokens of two computations
that round differently agree, and the tolerance table's entries (``tests/numerics.py``) carry their basis."""

from __future__ import annotations

import numpy as np
import pytest

from mtp_bindings.generation.agreement import compare_greedy, first_parting, is_near_tie
from numerics import TOL, assert_agree, assert_same_tokens


def _rows(gap_at_2: float) -> list[np.ndarray]:
    # three rows over a 4-token vocabulary; at position 2 token 1 leads token 3 by gap_at_2
    rows = [np.array([0.0, 5.0, 0.0, 0.0], np.float32) for _ in range(3)]
    rows[2] = np.array([0.0, 1.0 + gap_at_2, 0.0, 1.0], np.float32)
    return rows


def test_identical_sequences_have_no_parting():
    assert first_parting([1, 2, 3], [1, 2, 3]) is None
    a = compare_greedy([1, 2, 3], [1, 2, 3], lambda i: pytest.fail("no row is needed"), 1e-3)
    assert a.identical and a.agrees and a.describe() == "identical"


def test_the_first_parting_is_where_the_tokens_first_differ():
    assert first_parting([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert first_parting([1, 2], [1, 2, 3]) == 2  # one ended where the other went on


def test_a_parting_within_twice_the_tolerance_is_a_near_tie():
    rows = _rows(0.0019)
    a = compare_greedy([1, 1, 1], [1, 1, 3], rows.__getitem__, 1e-3)
    assert a.at == 2 and a.gap == pytest.approx(0.0019, abs=1e-6)
    assert a.agrees and not a.identical and "a near-tie" in a.describe()


def test_a_parting_beyond_twice_the_tolerance_disagrees():
    rows = _rows(0.0021)
    a = compare_greedy([1, 1, 1], [1, 1, 3], rows.__getitem__, 1e-3)
    assert not a.agrees and "not a near-tie" in a.describe()


def test_with_tolerance_zero_any_parting_disagrees():
    a = compare_greedy([1, 1, 1], [1, 1, 3], _rows(1e-6).__getitem__, 0.0)
    assert not a.agrees


def test_a_sequence_that_ended_early_does_not_agree():
    a = compare_greedy([1, 1, 1], [1, 1], lambda i: pytest.fail("no row to read"), 1.0)
    assert a.at == 2 and a.gap is None and not a.agrees


def test_the_rule_is_symmetric_in_the_two_computations():
    assert is_near_tie(-0.002, 1e-3) and is_near_tie(0.002, 1e-3) and not is_near_tie(0.0021, 1e-3)


def test_every_tolerance_has_a_measured_basis_and_headroom():
    for name, tol in TOL.items():
        assert tol.basis, name
        assert tol.value >= tol.measured >= 0, name
        if tol.measured:
            assert tol.headroom >= 1.5, (name, tol.headroom)  # room for another CPU's rounding
        else:
            assert tol.value == 0.0, name  # nothing measured: exact


def test_the_exact_helper_names_the_first_parting():
    assert_same_tokens([1, 2, 3], [1, 2, 3])
    with pytest.raises(AssertionError, match="parted at token 1"):
        assert_same_tokens([1, 2, 3], [1, 5, 3], "mtp")


def test_the_agreement_helper_passes_a_near_tie_and_fails_a_clear_gap():
    tol = TOL["prompt_batch"]
    near, far = _rows(1.9 * tol.value), _rows(2.1 * tol.value)
    assert assert_agree([1, 1, 1], [1, 1, 3], near.__getitem__, tol).at == 2
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_agree([1, 1, 1], [1, 1, 3], far.__getitem__, tol)
