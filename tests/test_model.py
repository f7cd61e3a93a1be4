"""Model and Context basics on the project's fixtures: metadata, vocabulary, decoding, memory."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from mtp_bindings import Model
from mtp_bindings.exceptions import TokenizeError
from numerics import TOL


def test_model_reports_gemma4_architecture_and_shapes(dense_model):
    assert dense_model.arch == "gemma4"
    assert dense_model.n_embd == 64
    assert dense_model.n_layer == 4
    assert dense_model.n_vocab == 1024
    assert dense_model.n_params > 0


def test_metadata_is_a_dict_of_gguf_keys(dense_model):
    md = dense_model.metadata
    assert md["general.architecture"] == "gemma4"
    assert "gemma4.block_count" in md


def test_tokenize_detokenize_round_trips_text(dense_model):
    text = "def main(argv):\n    return len(argv) + 1  # ünïcode ✓"
    toks = dense_model.tokenize(text, add_special=False)
    assert all(0 <= t < dense_model.n_vocab for t in toks)
    assert dense_model.detokenize(toks) == text


def test_tokenize_adds_bos_when_the_model_wants_it(dense_model):
    with_bos = dense_model.tokenize("x = 1", add_special=True)
    without = dense_model.tokenize("x = 1", add_special=False)
    if dense_model.add_bos:
        assert with_bos == [dense_model.token_bos] + without
    else:
        assert with_bos == without


def test_token_pieces_concatenate_to_the_text(dense_model):
    text = "import os\nprint(os.getcwd())"
    toks = dense_model.tokenize(text, add_special=False)
    assert b"".join(dense_model.token_to_piece(t) for t in toks).decode() == text


@pytest.mark.parametrize("bad", [-1, 10**6, True, 2.0])
def test_token_to_piece_refuses_what_is_not_a_token_id(dense_model, bad):
    dense_model.token_to_piece(1), dense_model.token_to_piece(2)  # cached: True and 2.0 hash as 1 and 2
    with pytest.raises(TokenizeError):
        dense_model.token_to_piece(bad)


def test_token_to_piece_takes_a_numpy_id_as_the_same_token(dense_model):
    tok = dense_model.tokenize("print", add_special=False)[0]
    assert dense_model.token_to_piece(np.int32(tok)) == dense_model.token_to_piece(tok)


def test_progress_callback_sees_load_complete(dense_target_path):
    seen = []
    with Model(dense_target_path, progress=seen.append):
        pass
    assert seen and seen[-1] == pytest.approx(1.0)


def test_progress_callback_returning_false_aborts_the_load(dense_target_path):
    from mtp_bindings import ModelLoadError
    with pytest.raises(ModelLoadError):
        Model(dense_target_path, progress=lambda p: False)


def test_verbose_false_emits_no_native_log_records(dense_target_path, caplog):
    caplog.set_level(logging.DEBUG, logger="mtp_bindings.native")
    with Model(dense_target_path, verbose=False):
        pass
    assert not [r for r in caplog.records if r.name == "mtp_bindings.native"]


def test_verbose_true_routes_native_logs_to_logging(dense_target_path, caplog):
    caplog.set_level(logging.DEBUG, logger="mtp_bindings.native")
    with Model(dense_target_path, verbose=True):
        pass
    from mtp_bindings import set_verbose
    set_verbose(False)
    assert any("gemma4" in r.getMessage() for r in caplog.records if r.name == "mtp_bindings.native")


def test_logits_are_float32_arrays_of_vocab_size(dense_model):
    with dense_model.create_context(n_ctx=64) as ctx:
        n_out = ctx.decode([2, 10, 20, 30], logits="all")
        assert n_out == 4
        rows = ctx.get_logits_all()
        assert rows.shape == (4, dense_model.n_vocab) and rows.dtype == np.float32
        assert np.array_equal(rows[-1], ctx.get_logits(-1))


def test_embeddings_have_the_backbone_width(dense_model):
    with dense_model.create_context(n_ctx=64, embeddings=True) as ctx:
        ctx.decode([2, 10, 20])
        h = ctx.get_embeddings(-1)
        assert h.shape == (dense_model.n_embd,) and h.dtype == np.float32 and np.isfinite(h).all()


def test_seq_rm_then_redecode_reproduces_the_logits(dense_model):
    with dense_model.create_context(n_ctx=64) as ctx:
        ctx.decode([2, 10, 20, 30, 40])
        before = ctx.get_logits(-1)
        assert ctx.seq_pos_max(0) == 4
        ctx.seq_rm(0, 3)
        assert ctx.seq_pos_max(0) == 2
        ctx.decode([30, 40])
        np.testing.assert_array_equal(ctx.get_logits(-1), before)  # 5 rows and 2: both batch-invariant


@pytest.mark.parametrize("logits", ["all", "last", "none", [True, False, True]])
def test_a_short_token_list_decodes_as_the_same_ids_in_an_array(dense_model, logits):
    # a round's few ids are written without numpy (core/batch.py): same outputs, same rows
    toks = [2, 10, 20]
    with dense_model.create_context(n_ctx=64) as a, dense_model.create_context(n_ctx=64) as b:
        n_list = a.decode(toks, logits=logits)
        n_array = b.decode(np.array(toks, dtype=np.int64), logits=logits)
        expected = 2 if isinstance(logits, list) else {"all": 3, "last": 1, "none": 0}[logits]
        assert n_list == n_array == expected == a.n_outputs
        for i in range(1, n_list + 1):  # from the end: a non-negative index names a token of the batch
            np.testing.assert_array_equal(a.get_logits(-i), b.get_logits(-i))


# A decode of 1..8 tokens rounds each row as a one-token decode does (the batch-invariant kernels):
# those are compared exactly. Longer batches are outside them: TOL["prompt_batch"] (tests/numerics.py).
# A positional or masking bug is O(1).
BATCH_ATOL = TOL["prompt_batch"].value


def test_batched_prompt_equals_token_by_token_decoding(dense_model):
    toks = [2, 100, 200, 300, 400, 500]
    with dense_model.create_context(n_ctx=64) as a, dense_model.create_context(n_ctx=64) as b:
        a.decode(toks)
        for t in toks:
            b.decode([t])
        np.testing.assert_array_equal(a.get_logits(-1), b.get_logits(-1))  # 6 rows: batch-invariant


def test_prompt_longer_than_n_batch_is_split(dense_model):
    toks = list(range(3, 40))
    with dense_model.create_context(n_ctx=64, n_batch=8, n_ubatch=8) as a, \
            dense_model.create_context(n_ctx=64) as b:
        a.decode(toks)
        b.decode(toks)
        np.testing.assert_allclose(a.get_logits(-1), b.get_logits(-1), rtol=0, atol=BATCH_ATOL)


def test_closing_the_model_closes_its_contexts(dense_target_path):
    m = Model(dense_target_path)
    ctx = m.create_context(n_ctx=32)
    m.close()
    assert ctx.closed and m.closed


@pytest.mark.parametrize("use", [
    lambda m: m.tokenize("x"), lambda m: m.detokenize([5, 6]), lambda m: m.token_to_piece(5),
    lambda m: m.is_eog(5), lambda m: m.token_bos, lambda m: m.token_eos, lambda m: m.token_eot,
    lambda m: m.add_bos, lambda m: m.generate("x", max_tokens=2, temperature=0), lambda m: m.n_embd,
], ids=["tokenize", "detokenize", "token_to_piece", "is_eog", "token_bos", "token_eos", "token_eot", "add_bos",
        "generate", "n_embd"])
def test_a_closed_model_raises_a_typed_error_instead_of_reading_freed_memory(dense_target_path, use):
    # the vocabulary is freed with the model: reading it after close() aborted the process (issue 26, item 1)
    from mtp_bindings.exceptions import ModelLoadError

    m = Model(dense_target_path)
    m.close()
    with pytest.raises(ModelLoadError, match="closed"):
        use(m)


def test_repack_false_loads_the_weights_in_the_plain_layout_and_decodes_the_same(trained_paths):
    # llama-server's --no-repack: a public switch (the benchmark used to patch the bindings for it)
    from mtp_bindings import Model

    rows = []
    for repack in (True, False):
        with Model(trained_paths[0], assistant=trained_paths[1], repack=repack) as model:
            assert model.repack is repack
            with model.create_context(n_ctx=128, n_threads=1) as ctx:
                ctx.decode(model.tokenize("def f(x):\n"), pos=0)
                rows.append(ctx.logits_view(-1).copy())
    assert abs(rows[0] - rows[1]).max() < 1e-2  # same function, other kernels
