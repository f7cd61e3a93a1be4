"""Greedy picks taken in the graph (llama.cpp's backend sampling): a greedy generation that needs no logits
row reads each row's argmax as a token id, and emits exactly the tokens the host's argmax of the rows gives;
a context never hands out stale logits after such a decode, and any decode asking for logits gets them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mtp_bindings import ContextError
from mtp_bindings.config.env import ENV_GRAPH_GREEDY
from mtp_bindings.llama_context import LlamaContext

PROMPT = "def parse_args(argv):\n"
N = 48


@pytest.fixture(scope="module")
def pair(trained_paths: Any) -> Iterator[Any]:
    from mtp_bindings import Model

    t, a = trained_paths
    with Model(t, assistant=a) as m:
        yield m


def _tokens(model: Any, draft_n_max: int, **kwargs: Any) -> list[int]:
    with model.create_context(n_ctx=512, embeddings=True) as ctx:
        r = model.generate(PROMPT, context=ctx, max_tokens=N, ignore_eos=True, temperature=0.0,
                           draft_n_max=draft_n_max, **kwargs)
        return list(r.tokens)


@pytest.mark.parametrize("draft_n_max", [0, 1, 3, 6])
def test_graph_picks_emit_the_tokens_of_the_hosts_argmax(pair: Any, monkeypatch: pytest.MonkeyPatch,
                                                         draft_n_max: int) -> None:
    in_graph = _tokens(pair, draft_n_max)
    monkeypatch.setenv(ENV_GRAPH_GREEDY, "0")
    on_host = _tokens(pair, draft_n_max)
    assert in_graph == on_host and len(in_graph) == N


def test_a_greedy_generation_reads_no_logits_row(pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rows(self: LlamaContext, i: int = -1) -> np.ndarray:
        raise AssertionError("a logits row was read")

    monkeypatch.setattr(LlamaContext, "logits_view", no_rows)
    assert len(_tokens(pair, 3)) == N


def test_greedy_with_logprobs_still_reads_the_rows(pair: Any) -> None:
    # logprobs need the rows: the graph does not pick there, and the tokens are the same
    with pair.create_context(n_ctx=512, embeddings=True) as ctx:
        r = pair.generate(PROMPT, context=ctx, max_tokens=N, ignore_eos=True, temperature=0.0, draft_n_max=3,
                          logprobs=0)
    assert list(r.tokens) == _tokens(pair, 3) and len(r.logprobs) == N


def test_sampled_picks_are_the_argmax_of_the_rows(pair: Any) -> None:
    toks = pair.tokenize(PROMPT)
    with pair.create_context(n_ctx=256) as ctx:
        ctx.decode(toks, logits="all")
        want = [int(np.argmax(ctx.logits_view(i))) for i in range(len(toks))]
        ctx.seq_rm(0, 0, -1)
        assert ctx.set_graph_greedy(0, True)
        ctx.decode(toks, logits="all", sampled=True)
        assert ctx.sampled_tokens(len(toks)) == want


def test_the_pick_after_a_prompt_is_the_argmax_of_its_last_row(pair: Any) -> None:
    toks = pair.tokenize(PROMPT)
    with pair.create_context(n_ctx=256) as ctx:
        ctx.decode(toks)
        want = int(np.argmax(ctx.logits_view(-1)))
        ctx.seq_rm(0, 0, -1)
        ctx.set_graph_greedy(0, True)
        ctx.decode(toks, sampled=True)  # one output row, at the batch's last token
        assert ctx.sampled_tokens(1) == [want]


def test_a_sampled_decode_hands_out_no_logits(pair: Any) -> None:
    with pair.create_context(n_ctx=256) as ctx:
        ctx.set_graph_greedy(0, True)
        ctx.decode(pair.tokenize(PROMPT), sampled=True)
        with pytest.raises(ContextError, match="no logits"):
            ctx.logits_view(-1)


def test_a_decode_asking_for_logits_turns_graph_picking_off(pair: Any) -> None:
    toks = pair.tokenize(PROMPT)
    with pair.create_context(n_ctx=256) as ctx:
        ctx.decode(toks[:-1])
        ctx.decode(toks[-1:], pos=len(toks) - 1)
        want = ctx.get_logits(-1)
        ctx.seq_rm(0, 0, -1)
        ctx.set_graph_greedy(0, True)
        ctx.decode(toks[:-1], sampled=True)
        ctx.decode(toks[-1:], pos=len(toks) - 1)
        assert np.array_equal(ctx.get_logits(-1), want)
        with pytest.raises(ContextError, match="not made with sampled=True"):
            ctx.sampled_tokens(1)
        with pytest.raises(ContextError, match="set_graph_greedy"):
            ctx.decode(toks[:1], pos=len(toks), sampled=True)


def test_a_context_keeps_graph_picking_between_generations(pair: Any) -> None:
    with pair.create_context(n_ctx=512, embeddings=True) as ctx:
        pair.generate(PROMPT, context=ctx, max_tokens=8, temperature=0.0, draft_n_max=3)
        assert 0 in ctx.graph_greedy_seqs  # the next greedy generation pays no graph reservation for it
