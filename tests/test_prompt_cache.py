"""The prompt cache (issue 16 item 1): a kept context decodes only what follows the longest common
token prefix with its last generation, the output is the uncached run's, MTP's acceptance is
unchanged, ``cache_prompt=False`` decodes everything, a KV edit or a hole left by the sliding
window forgets the cache, and a server slot reuses its previous request's prompt."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mtp_bindings import Model
from mtp_bindings.chat.template import CHAT_TOKENIZE, render_chat
from mtp_bindings.generation.prompt_cache import common_prefix
from numerics import TOL, assert_agree, forced_rows
from test_server import KEY, TIMEOUT_S, ref_chat, reference, server  # noqa: F401  (the loopback server fixtures)

TURNS = ["Write a function that parses command line arguments.", "Now add a --verbose flag.",
         "Explain the code.", "Make it a class.", "Add type hints.", "Write a test for it.",
         "What about errors?", "Add logging.", "Shorten it.", "Summarise what we did."]
MAX_TOKENS = 40
# A cached prefix's KV was computed in other batch splits (the last prompt's batches, the reply's verify
# batches) than an uncached run's, and a prompt batch of more than 8 tokens is outside the batch-invariant
# kernels: greedy outputs agree by the near-tie rule for TOL["prompt_batch"] (tests/numerics.py), judged on
# the uncached run's rows. (Measured: identical with this f16 KV cache on every variant this machine runs.)
PROMPT_BATCH = TOL["prompt_batch"]


@pytest.fixture(scope="module")
def trained_model(trained_paths: Any) -> Any:
    t, a = trained_paths
    with Model(t, assistant=a) as m:
        yield m


def _context(model: Any) -> Any:
    # fixed threads: a thread count chosen by the load would change the drafting graph's rounding
    return model.create_context(n_ctx=2048, embeddings=True, n_threads=1)


def _prompt(model: Any, messages: list[dict[str, str]]) -> list[int]:
    return model.tokenize(render_chat(model, messages), **CHAT_TOKENIZE)


@pytest.fixture(scope="module")
def chat_runs(trained_model: Any) -> dict[str, Any]:
    """A ten-turn chat on one kept context with the cache (each reply fed back), and each turn's
    prompt again with ``cache_prompt=False`` on a second context."""
    model = trained_model
    runs: dict[str, Any] = {"prompts": [], "cached": [], "uncached": []}
    with _context(model) as kept, _context(model) as other:
        messages: list[dict[str, str]] = []
        for text in TURNS:
            messages.append({"role": "user", "content": text})
            runs["prompts"].append(_prompt(model, messages))
            runs["cached"].append(model.chat(messages, max_tokens=MAX_TOKENS, draft_n_max=3, context=kept, temperature=0))
            runs["uncached"].append(model.chat(messages, max_tokens=MAX_TOKENS, draft_n_max=3, context=other,
                                               cache_prompt=False, temperature=0))
            messages.append({"role": "assistant", "content": runs["cached"][-1].text})
    return runs


def _held_after(prompt: list[int], result: Any) -> list[int]:
    """The tokens whose KV a generation leaves: the prompt and each emitted token but the last one
    sampled (never decoded), unless an end-of-generation token came after it."""
    return prompt + (result.tokens if result.finish_reason == "stop" else result.tokens[:-1])


def test_tenth_turn_decodes_only_the_new_tokens(chat_runs: dict[str, Any]) -> None:
    prompts, cached = chat_runs["prompts"], chat_runs["cached"]
    stats = cached[9].stats
    reusable = min(common_prefix(_held_after(prompts[8], cached[8]), prompts[9]), len(prompts[9]) - 1)
    assert reusable >= len(prompts[8]), "the previous turn's whole prompt should be a prefix of this one"
    assert stats.n_prompt == len(prompts[9])
    assert stats.n_prompt_cached == reusable
    assert stats.n_prompt_decoded == len(prompts[9]) - reusable
    assert stats.n_prompt_decoded < stats.n_prompt // 4, stats
    assert cached[0].stats.n_prompt_cached == 0  # a fresh context has nothing to reuse


def _assert_agree(model: Any, prompt: list[int], cached: list[int], uncached: list[int]) -> Any:
    """``cached`` equals ``uncached``, or they part first at a near-tie of the uncached run's row (replayed
    by teacher forcing: a fresh context, the prompt as prefill decodes it, then the uncached tokens)."""
    if cached == uncached:
        return None
    with model.create_context(n_ctx=2048, n_threads=1) as ctx:
        rows = forced_rows(ctx, prompt, uncached)
    return assert_agree(uncached, cached, rows.__getitem__, PROMPT_BATCH, "cached vs uncached")


def test_cached_turns_agree_with_the_uncached_ones(trained_model: Any, chat_runs: dict[str, Any]) -> None:
    for prompt, c, u in zip(chat_runs["prompts"], chat_runs["cached"], chat_runs["uncached"]):
        assert u.stats.n_prompt_cached == 0
        _assert_agree(trained_model, prompt, c.tokens, u.tokens)


def test_mtp_acceptance_is_unchanged_by_the_cache(chat_runs: dict[str, Any]) -> None:
    turns = [(c.stats, u.stats) for c, u in zip(chat_runs["cached"], chat_runs["uncached"])
             if c.tokens == u.tokens]  # a near-tie parting (none measured) changes what is drafted after it
    assert len(turns) >= 8
    for c, u in turns:
        assert (c.n_drafted, c.n_accepted) == (u.n_drafted, u.n_accepted)
    assert sum(c.n_accepted for c, _ in turns) > 0


def test_cache_prompt_false_decodes_everything(trained_model: Any) -> None:
    prompt = trained_model.tokenize("def parse_args(argv):\n")
    with _context(trained_model) as ctx:
        first = trained_model.generate(prompt, max_tokens=8, context=ctx, temperature=0)
        again = trained_model.generate(prompt, max_tokens=8, context=ctx, cache_prompt=False, temperature=0)
    assert first.stats.n_prompt_cached == 0
    assert again.stats.n_prompt_cached == 0 and again.stats.n_prompt_decoded == len(prompt)
    assert again.tokens == first.tokens


def test_a_prompt_fully_cached_still_decodes_its_last_token(trained_model: Any) -> None:
    prompt = trained_model.tokenize("class Queue:\n    def __init__(self):")
    with _context(trained_model) as ctx:
        first = trained_model.generate(prompt, max_tokens=12, context=ctx, temperature=0)
        again = trained_model.generate(prompt, max_tokens=12, context=ctx, temperature=0)
    assert again.stats.n_prompt_cached == len(prompt) - 1 and again.stats.n_prompt_decoded == 1
    assert again.tokens == first.tokens


def test_a_kv_edit_forgets_the_cache(trained_model: Any) -> None:
    prompt = trained_model.tokenize("import os\nimport sys\n")
    with _context(trained_model) as ctx:
        trained_model.generate(prompt, max_tokens=8, context=ctx, temperature=0)
        ctx.seq_rm(0, 2, -1)  # someone else's edit: the record no longer says what the KV holds
        after_rm = trained_model.generate(prompt, max_tokens=8, context=ctx, temperature=0)
        ctx.clear()
        after_clear = trained_model.generate(prompt, max_tokens=8, context=ctx, temperature=0)
    assert after_rm.stats.n_prompt_cached == 0 and after_clear.stats.n_prompt_cached == 0


def test_a_rollback_past_the_sliding_window_still_reuses_the_prefix(trained_model: Any) -> None:
    # Our contexts keep the full sliding-window cache (llama.cpp's swa_full default): after a generation
    # far past the window (n_swa 64) every position is still held, so a prompt that parts early keeps its
    # prefix. (PromptCache's guard for a cache that let cells go is for KV memories we never create; the
    # fake context that used to test it here tested a path the package does not reach.)
    model = trained_model
    assert 0 < model.n_swa < 200
    prompt = model.tokenize("def parse_args(argv):\n")
    with _context(model) as ctx:
        first = model.generate(prompt, max_tokens=300, context=ctx, draft_n_max=3, ignore_eos=True, temperature=0)
        held = prompt + first.tokens[:-1]
        assert ctx.seq_pos_min(0) == 0 and ctx.seq_pos_max(0) == len(held) - 1
        again = model.generate(held[:30] + held[:2], max_tokens=4, context=ctx, draft_n_max=3, temperature=0)
        fresh = model.generate(held[:30] + held[:2], max_tokens=4, context=ctx, draft_n_max=3, temperature=0,
                               cache_prompt=False)
    assert again.stats.n_prompt_cached == 30 and fresh.stats.n_prompt_cached == 0
    _assert_agree(model, held[:30] + held[:2], again.tokens, fresh.tokens)


def test_a_server_slot_reuses_its_previous_prompt(server: Any, reference: Any) -> None:  # noqa: F811
    messages = [{"role": "user", "content": "Write a function that reverses a string."}]
    body: dict[str, Any] = {"messages": messages, "max_tokens": 16, "temperature": 0}
    before = server.metrics()
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT_S) as c:
        first = c.post("/v1/chat/completions", json=body).json()
        messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "Now in place."}]
        second = c.post("/v1/chat/completions", json=body).json()
        off = c.post("/v1/chat/completions", json={**body, "cache_prompt": False}).json()
    t1, t2, t3 = first["timings"], second["timings"], off["timings"]
    assert t2["cache_n"] >= first["usage"]["prompt_tokens"], (t1, t2)
    assert t2["cache_n"] + t2["prompt_n"] == second["usage"]["prompt_tokens"]
    assert t3["cache_n"] == 0 and t3["prompt_n"] == off["usage"]["prompt_tokens"]
    # the uncached reply is the in-process uncached run's exactly (one computation); cached against uncached
    # is the near-tie rule's, which needs the token rows an HTTP reply does not carry: the in-process tests above
    ref = ref_chat(reference, messages, max_tokens=16, cache_prompt=False)
    assert off["choices"][0]["message"]["content"] == ref.text
    cached = server.metrics()["mtp_prompt_tokens_cached_total"] - before["mtp_prompt_tokens_cached_total"]
    assert cached == t1["cache_n"] + t2["cache_n"]
