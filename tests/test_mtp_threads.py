"""Drafting threads: synchronous drafting computes with the context's threads (its caller waits),
asynchronous drafting with a settable count (default automatic) or an attached threadpool; bad
counts and pool parameters are refused."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fixture_paths import PAIRS, fixture_path
from mtp_bindings import InvalidParameterError, Model, NoAssistantError
from mtp_bindings.mtp import graph_stats
from mtp_bindings.native.threadpool import ThreadPool
from mtp_bindings.config.threads import usable_cpus

CPUS = usable_cpus()


@pytest.fixture(scope="module")
def pair():
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m, \
            m.create_context(n_ctx=256, embeddings=True, n_threads=CPUS) as ctx:
        ctx.decode([2, 100, 200, 300], pos=0)
        yield ctx, int(np.argmax(ctx.get_logits(-1))), ctx.get_embeddings(-1), 3


@pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs: with 1 every count is 1")
def test_synchronous_drafting_uses_the_contexts_threads(pair):
    # before: the worker's automatic count, 1 thread when the context takes every CPU
    ctx, tok, h, pos = pair
    ctx.decode_mtp(attn_pos=pos, last_token=tok, h_prev=h, n_steps=2)
    assert graph_stats(ctx)["n_threads_last"] == CPUS


def test_asynchronous_drafting_uses_the_count_it_was_given(pair):
    ctx, tok, h, pos = pair
    want, _ = ctx.decode_mtp(attn_pos=pos, last_token=tok, h_prev=h, n_steps=3)
    for n in (1, 2, 3):
        ctx.set_mtp_threads(n)
        got, _ = ctx.decode_mtp_async(attn_pos=pos, last_token=tok, h_prev=h, n_steps=3).wait()
        assert graph_stats(ctx)["n_threads_last"] == n
        assert got.tolist() == want.tolist()  # the count changes speed only
    ctx.set_mtp_threads(None)
    ctx.decode_mtp_async(attn_pos=pos, last_token=tok, h_prev=h, n_steps=3).wait()
    # automatic: the CPUs the context leaves free, at most its own count, and 1 where fewer than 2 are free
    # (here none: the context takes every CPU)
    n_free = len(os.sched_getaffinity(0)) - CPUS
    assert graph_stats(ctx)["n_threads_last"] == (min(CPUS, n_free) if n_free >= 2 else 1)


@pytest.mark.parametrize("bad", [0, -1, 513, 2.0, True])
def test_bad_thread_counts_are_refused(pair, bad):
    with pytest.raises(InvalidParameterError):
        pair[0].set_mtp_threads(bad)


def test_setting_drafting_threads_without_an_assistant_is_refused():
    with Model(fixture_path(PAIRS["dense"][0])) as m, m.create_context(n_ctx=64) as ctx:
        with pytest.raises(NoAssistantError):
            ctx.set_mtp_threads(2)


# issue 17 item 4: the worker's threadpool (patch 0015)
def test_an_attached_threadpool_computes_the_asynchronous_requests(pair):
    ctx, tok, h, pos = pair
    want, _ = ctx.decode_mtp(attn_pos=pos, last_token=tok, h_prev=h, n_steps=3)
    ctx.set_mtp_threads(1)
    with ThreadPool(2, poll=0) as pool:
        ctx.attach_mtp_threadpool(pool)
        got, _ = ctx.decode_mtp_async(attn_pos=pos, last_token=tok, h_prev=h, n_steps=3).wait()
        assert graph_stats(ctx)["n_threads_last"] == 2  # the pool's count, not the set one
        assert got.tolist() == want.tolist()
        ctx.detach_mtp_threadpool()
        ctx.decode_mtp_async(attn_pos=pos, last_token=tok, h_prev=h, n_steps=3).wait()
        assert graph_stats(ctx)["n_threads_last"] == 1
    ctx.set_mtp_threads(None)


@pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs to tell the pool's count from the context's")
def test_synchronous_drafting_keeps_the_contexts_threads_with_a_threadpool_attached(pair):
    ctx, tok, h, pos = pair
    with ThreadPool(1) as pool:
        ctx.attach_mtp_threadpool(pool)
        ctx.decode_mtp(attn_pos=pos, last_token=tok, h_prev=h, n_steps=2)
        assert graph_stats(ctx)["n_threads_last"] == CPUS
        ctx.detach_mtp_threadpool()


def test_closing_an_attached_threadpool_detaches_it_first(pair):
    ctx, tok, h, pos = pair
    ctx.set_mtp_threads(1)
    pool = ThreadPool(2)
    ctx.attach_mtp_threadpool(pool)
    handle = ctx.decode_mtp_async(attn_pos=pos, last_token=tok, h_prev=h, n_steps=3)
    pool.close()  # waits for the request in flight, then the worker no longer uses the pool
    handle.wait()
    ctx.decode_mtp_async(attn_pos=pos, last_token=tok, h_prev=h, n_steps=3).wait()
    assert graph_stats(ctx)["n_threads_last"] == 1
    with pytest.raises(InvalidParameterError, match="closed"):
        ctx.attach_mtp_threadpool(pool)
    ctx.set_mtp_threads(None)


def test_a_threadpool_outlives_the_context_it_was_attached_to():
    target, assistant = PAIRS["dense"]
    with ThreadPool(1) as pool, Model(fixture_path(target), assistant=fixture_path(assistant)) as m:
        with m.create_context(n_ctx=64, embeddings=True) as ctx:
            ctx.attach_mtp_threadpool(pool)
        assert not pool.closed  # freeing the context leaves the pool to its owner


@pytest.mark.parametrize("kwargs", [{"n_threads": 0}, {"n_threads": 2.0}, {"n_threads": 1, "priority": "urgent"},
                                    {"n_threads": 1, "poll": 101}, {"n_threads": 1, "poll": -1},
                                    {"n_threads": 1, "cpus": [-1]}, {"n_threads": 1, "cpus": [4096]},
                                    {"n_threads": 1, "cpus": "01"}, {"n_threads": 1, "strict_cpu": 1}])
def test_bad_threadpool_parameters_are_refused(kwargs):
    with pytest.raises(InvalidParameterError):
        ThreadPool(**kwargs)


def test_only_a_threadpool_can_be_attached(pair):
    with pytest.raises(InvalidParameterError):
        pair[0].attach_mtp_threadpool(2)


def test_attaching_a_threadpool_without_an_assistant_is_refused():
    with ThreadPool(1) as pool, Model(fixture_path(PAIRS["dense"][0])) as m, m.create_context(n_ctx=64) as ctx:
        with pytest.raises(NoAssistantError):
            ctx.attach_mtp_threadpool(pool)
