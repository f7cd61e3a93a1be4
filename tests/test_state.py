"""KV state save and restore (``Model.save_state`` / ``load_state``, :mod:`mtp_bindings.generation.state`)
on the bundled trained pair with MTP drafting on, at temperature 0: a restored sequence goes on
exactly as if it had never been interrupted.
"""

from __future__ import annotations

import numpy as np
import pytest

from mtp_bindings import Model
from mtp_bindings.exceptions import ContextError, InvalidParameterError, MTPBusyError
from mtp_bindings.generation.prompt_cache import prompt_cache
from mtp_bindings.generation.state import load_state, save_state
from mtp_bindings.mtp import current_session, n_embd_backbone

PROMPT = "def parse_args(argv):\n"
N, M = 12, 20
N_CTX = 512


@pytest.fixture(scope="module")
def model(trained_paths):
    target, assistant = trained_paths
    with Model(target, assistant=assistant) as m:
        yield m


def fresh(model):
    return model.create_context(n_ctx=N_CTX, embeddings=True)


def test_without_a_context_save_and_restore_use_the_one_generate_uses(model, trained_paths, tmp_path):
    prompt = model.tokenize(PROMPT)
    first = model.generate(prompt, max_tokens=N, temperature=0)
    saved = model.save_state(tmp_path / "s.bin")
    assert saved.tokens == prompt + first.tokens[:-1]  # the last sampled token is not decoded yet
    target, assistant = trained_paths
    with Model(target, assistant=assistant) as other:
        assert other.load_state(tmp_path / "s.bin").tokens == saved.tokens
        again = other.generate(prompt + first.tokens, max_tokens=M, temperature=0)
    assert again.stats.n_prompt_cached == len(saved.tokens)
    assert again.tokens == model.generate(prompt + first.tokens, max_tokens=M, temperature=0).tokens


def test_restore_into_a_fresh_context_goes_on_as_if_never_interrupted(model, tmp_path):
    prompt = model.tokenize(PROMPT)
    with fresh(model) as ctx, fresh(model) as restored, fresh(model) as whole:
        # fixed counts where drafting must happen: auto may choose plain rounds
        first = model.generate(prompt, max_tokens=N, context=ctx, temperature=0, draft_n_max=3)
        assert first.stats.n_drafted > 0, "MTP drafting must be on for this test to mean anything"
        saved = model.save_state(tmp_path / "s.bin", context=ctx)
        reference = model.generate(prompt + first.tokens, max_tokens=M, context=ctx, temperature=0)

        loaded = model.load_state(tmp_path / "s.bin", context=restored)
        assert loaded.tokens == saved.tokens and loaded.n_bytes == saved.n_bytes
        again = model.generate(prompt + first.tokens, max_tokens=M, context=restored, temperature=0, draft_n_max=3)
        assert again.tokens == reference.tokens
        assert again.stats.n_drafted > 0
        # and both are what one uninterrupted generation of N + M tokens gives
        assert first.tokens + again.tokens == model.generate(prompt, max_tokens=N + M, context=whole, temperature=0).tokens


def test_a_restored_sequence_is_reused_by_the_prompt_cache_not_decoded_again(model, tmp_path):
    prompt = model.tokenize(PROMPT)
    with fresh(model) as ctx, fresh(model) as restored:
        first = model.generate(prompt, max_tokens=N, context=ctx, temperature=0)
        saved = save_state(ctx, tmp_path / "s.bin")
        load_state(restored, tmp_path / "s.bin")
        assert prompt_cache(restored).held[0] == saved.tokens
        again = model.generate(prompt + first.tokens, max_tokens=4, context=restored, temperature=0)
        assert again.stats.n_prompt_cached == len(saved.tokens) == len(prompt) + N - 1


def test_the_saved_tokens_are_the_prompt_and_reply_whose_kv_the_sequence_holds(model, tmp_path):
    prompt = model.tokenize(PROMPT)
    with fresh(model) as ctx:
        first = model.generate(prompt, max_tokens=N, context=ctx, temperature=0)
        saved = save_state(ctx, tmp_path / "s.bin")
        # the last sampled token is not decoded yet: its KV is not there
        assert saved.tokens == prompt + first.tokens[:-1]
        assert ctx.seq_pos_max(0) + 1 == len(saved.tokens)


def test_restoring_replaces_what_the_context_held_and_the_prompt_cache_record(model, tmp_path):
    with fresh(model) as a, fresh(model) as b:
        model.generate(model.tokenize(PROMPT), max_tokens=N, context=a, temperature=0)
        saved = save_state(a, tmp_path / "a.bin")
        model.generate(model.tokenize("The quick brown fox jumps over"), max_tokens=30, context=b, temperature=0)
        load_state(b, tmp_path / "a.bin")
        assert prompt_cache(b).held[0] == saved.tokens
        assert b.seq_pos_max(0) + 1 == len(saved.tokens)


def test_a_drafting_request_in_flight_is_drained_before_the_state_is_copied_or_replaced(model, tmp_path):
    with fresh(model) as ctx:
        tokens = model.tokenize(PROMPT)
        ctx.decode(tokens)
        h = ctx.get_embeddings(-1)[: n_embd_backbone(model)]
        handle = ctx.decode_mtp_async(attn_pos=ctx.seq_pos_max(0), last_token=tokens[-1], h_prev=h, n_steps=3)
        assert handle.pending
        save_state(ctx, tmp_path / "s.bin", tokens=tokens)
        assert not handle.pending and current_session(ctx).in_flight is None
        drafts, _ = handle.wait()  # a save edits nothing: the owner still gets its drafts
        assert drafts.shape == (3,)
        handle2 = ctx.decode_mtp_async(attn_pos=ctx.seq_pos_max(0), last_token=tokens[-1], h_prev=h, n_steps=3)
        load_state(ctx, tmp_path / "s.bin")  # a restore replaces the cells the draft read: it is dropped
        assert not handle2.pending
        with pytest.raises(MTPBusyError):
            handle2.wait()


def test_the_state_of_tokens_decoded_by_hand_round_trips_with_the_tokens_given(model, tmp_path):
    tokens = model.tokenize(PROMPT)
    with fresh(model) as a, fresh(model) as b:
        a.decode(tokens)
        logits = a.get_logits(-1)
        save_state(a, tmp_path / "s.bin", tokens=tokens)
        assert load_state(b, tmp_path / "s.bin").tokens == tokens
        # the next token's logits after the restored cells equal those after the original ones
        a.decode([tokens[-1]], pos=len(tokens))
        b.decode([tokens[-1]], pos=len(tokens))
        np.testing.assert_array_equal(a.get_logits(-1), b.get_logits(-1))
        assert logits.shape == a.get_logits(-1).shape


def test_a_missing_or_foreign_state_file_is_a_context_error(model, tmp_path):
    with fresh(model) as ctx:
        with pytest.raises(ContextError, match="no saved state"):
            load_state(ctx, tmp_path / "missing.bin")
        junk = tmp_path / "junk.bin"
        junk.write_bytes(b"not a state file at all" * 10)
        with pytest.raises(ContextError, match="cannot restore"):
            load_state(ctx, junk)
        assert ctx.seq_pos_max(0) == -1


def test_more_tokens_than_the_sequence_holds_are_refused(model, tmp_path):
    with fresh(model) as ctx:
        ctx.decode(model.tokenize(PROMPT))
        with pytest.raises(InvalidParameterError, match="holds"):
            save_state(ctx, tmp_path / "s.bin", tokens=model.tokenize(PROMPT * 3))


def test_saving_in_the_middle_of_a_stream_leaves_the_stream_exact(model, tmp_path):
    prompt = model.tokenize(PROMPT)
    with fresh(model) as ctx, fresh(model) as other:
        # a fixed count: auto may choose a plain round, with no draft in flight to save around
        stream = model.generate(prompt, max_tokens=N + M, context=ctx, stream=True, temperature=0, draft_n_max=3)
        head = [next(stream) for _ in range(3)]
        assert current_session(ctx).in_flight is not None  # the depth-2 overlap: a draft is being computed
        save_state(ctx, tmp_path / "mid.bin")
        text = "".join(head) + "".join(stream)
        assert text == model.generate(prompt, max_tokens=N + M, context=other, temperature=0).text
