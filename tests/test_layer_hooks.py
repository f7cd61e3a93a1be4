"""The seams between the layers: a context's event hooks and observer, a plain (non-MTP) context
under the generation loop, and the lower model that knows no generation."""

from __future__ import annotations

import pytest

from fixture_paths import PAIRS, fixture_path
from mtp_bindings import Model
from mtp_bindings.llama_context import LlamaContext
from mtp_bindings.llama_model import LlamaModel, negative_needs, read_grown, snprintf_needs
from mtp_bindings.mtp import MTPContext, current_session


@pytest.fixture(scope="module")
def pair():
    target, assistant = PAIRS["dense"]
    with Model(fixture_path(target), assistant=fixture_path(assistant)) as m:
        yield m


def test_kv_edit_callbacks_run_before_seq_rm_and_clear(pair):
    with pair.create_context(n_ctx=64) as ctx:
        calls: list[str] = []
        ctx.on_kv_edit(lambda: calls.append("edit"))
        ctx.decode([2, 10, 20], pos=0)
        ctx.seq_rm(0, 1, -1)
        ctx.clear()
        assert calls == ["edit", "edit"]


def test_close_callbacks_run_once_before_the_context_is_freed(pair):
    ctx = pair.create_context(n_ctx=64)
    seen: list[bool] = []
    ctx.on_close(lambda: seen.append(not ctx.closed))
    ctx.close()
    ctx.close()
    assert seen == [True]


def test_the_observer_hears_every_decode_and_mtp_call(pair):
    with pair.create_context(n_ctx=128, embeddings=True) as ctx:
        heard: list[str] = []
        ctx.observer = lambda name, seconds: heard.append(name) if seconds >= 0 else None
        pair.generate("def f(x):", max_tokens=8, draft_n_max=2, context=ctx, temperature=0)
        assert "llama_decode" in heard
        assert "llama_decode_mtp_async" in heard and "llama_decode_mtp_wait" in heard


def test_no_observer_by_default(pair):
    with pair.create_context(n_ctx=64) as ctx:
        assert ctx.observer is None


def test_the_public_model_makes_mtp_contexts_and_the_lower_one_plain_contexts(pair):
    with pair.create_context(n_ctx=64) as ctx:
        assert isinstance(ctx, MTPContext)
    with LlamaModel(pair.path) as low, low.create_context(n_ctx=64) as ctx:
        assert type(ctx) is LlamaContext
        assert not hasattr(low, "generate") and not hasattr(ctx, "decode_mtp_async")


def test_drafting_works_on_a_plain_context_through_its_session(pair):
    want = pair.generate("import os\n", max_tokens=12, draft_n_max=2, temperature=0).tokens
    with LlamaContext(pair, n_ctx=256, embeddings=True) as ctx:
        got = pair.generate("import os\n", max_tokens=12, draft_n_max=2, context=ctx, temperature=0)
        assert got.tokens == want and got.stats.n_drafted > 0
        assert current_session(ctx) is not None and current_session(ctx).in_flight is None


def test_read_grown_retries_with_the_size_the_call_asks_for():
    sizes: list[int] = []

    def fill(buf, size: int) -> int:
        sizes.append(size)
        return -40 if size < 40 else 7

    _, n = read_grown("char[]", 8, fill, negative_needs)
    assert (n, sizes) == (7, [8, 40])
    assert snprintf_needs(10, 10) == 11 and snprintf_needs(9, 10) is None
