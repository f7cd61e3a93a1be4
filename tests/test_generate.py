"""The generation driver on plain decoding (no assistant): greedy equivalence, streaming,
stop strings, limits, cancellation, seeds. The MTP variants live in test_speculative.py."""

from __future__ import annotations

import numpy as np
import pytest

from mtp_bindings import InvalidParameterError
from mtp_bindings.generation.results import GenerationResult, TextPiece

PROMPT = "def main(argv):\n"


def test_greedy_generate_equals_plain_greedy_decoding(dense_model):
    toks = dense_model.tokenize(PROMPT)
    with dense_model.create_context(n_ctx=256) as ctx:
        want = ctx.generate_greedy(toks, 40)
        got = dense_model.generate(toks, max_tokens=40, draft_n_max=0, context=ctx, temperature=0)
    # exact: the same decodes, the prompt batch aside (measured bit for bit with this f16 KV cache on every
    # variant, tests/numerics.py "prompt_batch")
    assert isinstance(got, GenerationResult)
    assert got.tokens == want[: len(got.tokens)]
    assert got.finish_reason in ("length", "stop")


def test_result_text_is_the_detokenized_tokens(dense_model):
    r = dense_model.generate(PROMPT, max_tokens=30, draft_n_max=0, temperature=0)
    assert r.text == dense_model.detokenize(r.tokens)


def test_max_tokens_limits_the_output(dense_model):
    r = dense_model.generate(PROMPT, max_tokens=7, draft_n_max=0, temperature=0)
    assert len(r.tokens) == 7 and r.finish_reason == "length"
    assert r.stats.n_generated == 7


def test_zero_max_tokens_generates_nothing(dense_model):
    r = dense_model.generate(PROMPT, max_tokens=0, draft_n_max=0, temperature=0)
    assert r.tokens == [] and r.text == ""


def test_stream_pieces_join_to_the_text_and_the_last_carries_stats(dense_model):
    full = dense_model.generate(PROMPT, max_tokens=30, draft_n_max=0, temperature=0)
    pieces = list(dense_model.generate(PROMPT, max_tokens=30, draft_n_max=0, stream=True, temperature=0))
    assert all(isinstance(p, TextPiece) for p in pieces)
    assert "".join(pieces) == full.text
    assert [t for p in pieces for t in p.tokens] == full.tokens
    assert pieces[-1].stats is not None and pieces[-1].finish_reason == full.finish_reason
    assert all(p.stats is None for p in pieces[:-1])


def test_text_pieces_never_split_a_utf8_character(dense_model):
    from mtp_bindings.generation.text import TextAssembler

    text = "s = 'ünïcödé ✓ 漢字 🙂'\n"
    toks = dense_model.tokenize(text, add_special=False)
    assert len(toks) > len(text.encode()) // 4  # byte-fallback tokens do split characters here
    asm = TextAssembler(dense_model, stop=[])
    pieces = [asm.feed([t]) for t in toks] + [asm.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_stop_string_ends_generation_before_it(dense_model):
    full = dense_model.generate(PROMPT, max_tokens=40, draft_n_max=0, temperature=0)
    assert len(full.text) > 10
    stop = full.text[5:8]
    r = dense_model.generate(PROMPT, max_tokens=40, draft_n_max=0, stop=[stop], temperature=0)
    assert r.finish_reason == "stop"
    assert r.text == full.text[: full.text.index(stop)]


def test_cancel_callback_stops_and_the_context_stays_usable(dense_model):
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) >= 3

    r = dense_model.generate(PROMPT, max_tokens=50, draft_n_max=0, cancel=cancel, temperature=0)
    assert r.finish_reason == "cancelled" and len(r.tokens) < 50
    again = dense_model.generate(PROMPT, max_tokens=20, draft_n_max=0, temperature=0)
    assert again.tokens == dense_model.generate(PROMPT, max_tokens=20, draft_n_max=0, temperature=0).tokens


def test_breaking_out_of_a_stream_leaves_the_context_reusable(dense_model):
    want = dense_model.generate(PROMPT, max_tokens=20, draft_n_max=0, temperature=0).tokens
    stream = dense_model.generate(PROMPT, max_tokens=50, draft_n_max=0, stream=True, temperature=0)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    assert dense_model.generate(PROMPT, max_tokens=20, draft_n_max=0, temperature=0).tokens == want


def test_seeded_sampling_is_reproducible(dense_model):
    a = dense_model.generate(PROMPT, max_tokens=25, temperature=0.9, seed=11, draft_n_max=0)
    b = dense_model.generate(PROMPT, max_tokens=25, temperature=0.9, seed=11, draft_n_max=0)
    c = dense_model.generate(PROMPT, max_tokens=25, temperature=0.9, seed=12, draft_n_max=0)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


def test_chat_renders_the_gguf_template(dense_model):
    from mtp_bindings.chat.template import render_chat

    text = render_chat(dense_model, [{"role": "user", "content": "hi"}])
    assert "<start_of_turn>user\nhi<end_of_turn>" in text and text.endswith("<start_of_turn>model\n")
    r = dense_model.chat([{"role": "user", "content": "hi"}], max_tokens=5, draft_n_max=0, temperature=0)
    assert len(r.tokens) <= 5


@pytest.mark.parametrize("kwargs", [
    {"max_tokens": -2}, {"max_tokens": "ten"}, {"temperature": -0.5}, {"draft_n_max": 99},
    {"draft_n_max": -1}, {"preset": "warp"}, {"stop": [3]}, {"skip_streak": 100},
])
def test_invalid_generation_arguments_are_refused(dense_model, kwargs):
    with pytest.raises(InvalidParameterError):
        dense_model.generate(PROMPT, **kwargs)


def test_chat_refuses_malformed_messages(dense_model):
    with pytest.raises(InvalidParameterError):
        dense_model.chat([{"role": "user"}], max_tokens=3, temperature=0)
    with pytest.raises(InvalidParameterError):
        dense_model.chat([], max_tokens=3, temperature=0)


def test_prompt_longer_than_the_context_is_refused(dense_model):
    from mtp_bindings import ContextOverflowError

    with dense_model.create_context(n_ctx=64) as ctx:
        with pytest.raises(ContextOverflowError):
            dense_model.generate(list(np.full(ctx.n_ctx + 5, 7)), max_tokens=3, context=ctx, temperature=0)
