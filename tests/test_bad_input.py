"""Bad input raises a typed exception with a clear message — never a crash."""

from __future__ import annotations

import numpy as np
import pytest

from mtp_bindings import (
    ContextOverflowError,
    InvalidParameterError,
    Model,
    ModelFileNotFoundError,
    ModelLoadError,
    TokenizeError,
)


def test_missing_model_file_raises_file_not_found(tmp_path):
    with pytest.raises(ModelFileNotFoundError, match="not found"):
        Model(tmp_path / "nope.gguf")


def test_missing_model_file_is_also_a_builtin_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        Model(tmp_path / "nope.gguf")


def test_directory_instead_of_file_is_refused(tmp_path):
    with pytest.raises(ModelFileNotFoundError, match="not a file"):
        Model(tmp_path)


def test_non_gguf_file_is_refused_with_its_magic(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip file, not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        Model(p)


def test_empty_file_is_refused(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        Model(p)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_truncated_gguf_raises_model_load_error(tmp_path, dense_target_path, keep):
    data = dense_target_path.read_bytes()
    p = tmp_path / "truncated.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="failed to load"):
        Model(p)


def test_truncated_header_raises_model_load_error(tmp_path, dense_target_path):
    p = tmp_path / "header.gguf"
    p.write_bytes(dense_target_path.read_bytes()[:40])
    with pytest.raises(ModelLoadError):
        Model(p)


def test_wrong_type_of_model_parameter_is_refused(dense_target_path):
    with pytest.raises(InvalidParameterError, match="n_gpu_layers"):
        Model(dense_target_path, n_gpu_layers="all")


@pytest.mark.parametrize("kwargs, match", [
    ({"n_ctx": 0}, "n_ctx"),
    ({"n_ctx": -5}, "n_ctx"),
    ({"n_ctx": "big"}, "n_ctx"),
    ({"n_batch": 8, "n_ubatch": 16}, "n_ubatch"),
    ({"n_threads": 0}, "n_threads"),
    ({"type_k": "q3_weird"}, "type_k"),
    ({"flash_attn": "maybe"}, "flash_attn"),
    ({"no_such_param": 1}, "unknown"),
])
def test_out_of_range_context_parameters_are_refused(dense_model, kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        dense_model.create_context(**kwargs)


def test_token_ids_outside_the_vocabulary_are_refused(dense_model):
    with dense_model.create_context(n_ctx=64) as ctx:
        with pytest.raises(TokenizeError, match="outside the vocabulary"):
            ctx.decode([1, 2, dense_model.n_vocab])
        with pytest.raises(TokenizeError, match="outside the vocabulary"):
            ctx.decode([-1])


def test_non_integer_tokens_are_refused(dense_model):
    with dense_model.create_context(n_ctx=64) as ctx:
        with pytest.raises(TokenizeError):
            ctx.decode(np.array([1.5, 2.0]))
        with pytest.raises(TokenizeError):
            ctx.decode(["a", "b"])


def test_detokenize_refuses_invalid_ids(dense_model):
    with pytest.raises(TokenizeError):
        dense_model.detokenize([10**9])


def test_tokenize_refuses_non_text(dense_model):
    with pytest.raises(TokenizeError):
        dense_model.tokenize(12345)


def test_context_overflow_raises_and_leaves_the_context_usable(dense_model):
    with dense_model.create_context(n_ctx=32) as ctx:
        n = ctx.n_ctx  # llama.cpp may round the size up
        ctx.decode([7] * (n - 10))
        with pytest.raises(ContextOverflowError, match=f"n_ctx={n}"):
            ctx.decode([7] * 20)
        assert ctx.seq_pos_max(0) == n - 11
        ctx.decode([5])  # still fits
        assert ctx.seq_pos_max(0) == n - 10


def test_invalid_seq_id_is_refused(dense_model):
    with dense_model.create_context(n_ctx=32) as ctx:
        with pytest.raises(InvalidParameterError, match="seq_id"):
            ctx.decode([1, 2], seq_id=3)


def test_output_index_out_of_range_is_refused(dense_model):
    with dense_model.create_context(n_ctx=32) as ctx:
        ctx.decode([5, 6, 7])
        with pytest.raises(InvalidParameterError, match="out of range"):
            ctx.get_logits(1)


def test_closed_context_raises_instead_of_crashing(dense_model):
    ctx = dense_model.create_context(n_ctx=32)
    ctx.close()
    from mtp_bindings import ContextError
    with pytest.raises(ContextError, match="closed"):
        ctx.decode([1])
