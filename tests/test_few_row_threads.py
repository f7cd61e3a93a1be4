"""Threads for short decodes (``config.threads.FewRowThreads``): a context left at the default thread count
times its decodes of a few rows on the load's budget and on one thread, and keeps the faster. Pure Python."""

from __future__ import annotations

from mtp_bindings.config.threads import (FEW_ROWS_MAX, OVERHEAD_BOUND_S, THREAD_RECHECK, THREAD_SAMPLES,
                                         FewRowThreads)


def run(policy: FewRowThreads, rows: int, budget: int, cost: dict[int, float], n: int) -> list[int]:
    """``n`` decodes of ``rows`` rows whose time depends only on the threads (``cost``); the threads used."""
    used = []
    for _ in range(n):
        t = policy.threads(rows, budget)
        policy.record(rows, t, budget, cost[t])
        used.append(t)
    return used


def test_a_short_decode_faster_on_one_thread_runs_on_one_thread():
    p = FewRowThreads()
    used = run(p, 1, 2, {2: 375e-6, 1: 235e-6}, 2 * THREAD_SAMPLES + 20)
    assert used[:THREAD_SAMPLES] == [2] * THREAD_SAMPLES  # the budget is timed first
    assert set(used[2 * THREAD_SAMPLES:]) == {1}
    assert p.one is True


def test_the_choice_covers_every_short_batch_size():
    p = FewRowThreads()
    run(p, 1, 2, {2: 375e-6, 1: 235e-6}, 2 * THREAD_SAMPLES)
    assert [p.threads(rows, 2) for rows in (1, 4, FEW_ROWS_MAX)] == [1, 1, 1]


def test_a_long_decode_never_tries_one_thread():
    p = FewRowThreads()
    used = run(p, 1, 2, {2: 10 * OVERHEAD_BOUND_S, 1: 0.0}, 50)
    assert set(used) == {2}
    assert p.one is False


def test_a_short_decode_slower_on_one_thread_keeps_the_budget():
    p = FewRowThreads()
    used = run(p, 4, 2, {2: 500e-6, 1: 700e-6}, 2 * THREAD_SAMPLES + 20)
    assert set(used[2 * THREAD_SAMPLES:]) == {2}
    assert p.one is False


def test_a_large_batch_always_takes_the_budget():
    p = FewRowThreads()
    run(p, 1, 2, {2: 375e-6, 1: 235e-6}, 2 * THREAD_SAMPLES)
    assert p.threads(FEW_ROWS_MAX + 1, 2) == 2
    assert p.threads(512, 8) == 8


def test_a_budget_of_one_thread_is_not_measured():
    p = FewRowThreads()
    assert set(run(p, 1, 1, {1: 1e-4}, 50)) == {1}
    assert p.one is None


def test_the_choice_is_measured_again_after_a_while():
    p = FewRowThreads()
    run(p, 1, 2, {2: 375e-6, 1: 235e-6}, 2 * THREAD_SAMPLES)
    assert p.one is True
    # the machine changed: one thread is now the slower
    used = run(p, 1, 2, {2: 200e-6, 1: 400e-6}, THREAD_RECHECK + 2 * THREAD_SAMPLES + 5)
    assert p.one is False
    assert used[-1] == 2
