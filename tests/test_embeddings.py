"""``Model.embed``: embeddings pooled and normalised as llama-server makes them, on the bundled trained pair.

Tolerances, and what they rest on: llama.cpp's mean pooling is a float32 matrix product with 1/n
weights, ours here a float64 mean of the unpooled vectors, so they differ in summation order only:
measured 3.6e-7 at most (vector entries up to 1.7) on the sentence below; the tests allow 1e-5.
``last`` and ``cls`` pick one row, and a list is embedded one input per decode: those are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from mtp_bindings import Model
from mtp_bindings.embeddings import normalize_vector
from mtp_bindings.exceptions import (ContextOverflowError, InvalidParameterError, ModelLoadError,
                                     TokenizeError)

TEXT = "Hello world, this is a test of the embedding path."
OTHER = "def parse_args(argv):\n    return argv[1:]\n"
POOL_ATOL = 1e-5  # see the module docstring: measured 3.6e-7


@pytest.fixture(scope="module")
def model(trained_paths):
    target, assistant = trained_paths
    with Model(target, assistant=assistant) as m:
        yield m


def test_a_text_gives_one_unit_vector_of_the_models_width(model):
    e = model.embed(TEXT)
    assert e.shape == (128,) and e.dtype == np.float32
    assert np.linalg.norm(e) == pytest.approx(1.0, abs=1e-6)


def test_mean_pooling_is_the_normalised_mean_of_the_per_token_vectors(model):
    per_token = model.embed(TEXT, pooling="none", normalize=False)
    assert per_token.shape == (len(model.tokenize(TEXT, add_special=True, parse_special=True)), 128)
    mean = per_token.astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(model.embed(TEXT, pooling="mean", normalize=False), mean, atol=POOL_ATOL, rtol=0)
    np.testing.assert_allclose(model.embed(TEXT, pooling="mean"), mean / np.linalg.norm(mean), atol=POOL_ATOL, rtol=0)


def test_last_and_cls_pooling_pick_the_last_and_first_token_vectors(model):
    per_token = model.embed(TEXT, pooling="none", normalize=False)
    np.testing.assert_array_equal(model.embed(TEXT, pooling="last", normalize=False), per_token[-1])
    np.testing.assert_array_equal(model.embed(TEXT, pooling="cls", normalize=False), per_token[0])


def test_unpooled_vectors_are_normalised_one_by_one_when_asked(model):
    raw = model.embed(TEXT, pooling="none", normalize=False)
    unit = model.embed(TEXT, pooling="none")
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6, rtol=0)


def test_the_same_text_gives_the_same_vector(model):
    first = model.embed(TEXT)
    model.embed(OTHER)  # something else in between: nothing of it may stay in the KV
    np.testing.assert_array_equal(model.embed(TEXT), first)


def test_different_texts_give_different_vectors(model):
    a, b = model.embed(TEXT), model.embed(OTHER)
    assert float(a @ b) < 0.999


def test_a_list_gives_exactly_what_each_input_gives_alone(model):
    texts = [TEXT, OTHER, "x"]
    batch = model.embed(texts)
    assert batch.shape == (3, 128)
    for row, text in zip(batch, texts):
        np.testing.assert_array_equal(row, model.embed(text))


def test_an_unpooled_list_gives_one_array_per_input(model):
    out = model.embed([TEXT, "x"], pooling="none")
    assert isinstance(out, list) and [a.shape[0] for a in out] == \
        [len(model.tokenize(t, add_special=True, parse_special=True)) for t in (TEXT, "x")]


def test_token_lists_embed_like_their_text(model):
    tokens = model.tokenize(TEXT, add_special=True, parse_special=True)
    np.testing.assert_array_equal(model.embed(tokens), model.embed(TEXT))
    np.testing.assert_array_equal(model.embed([tokens, tokens])[1], model.embed(TEXT))


def test_normalize_takes_llama_servers_embd_normalize_values(model):
    raw = model.embed(TEXT, normalize=False)
    np.testing.assert_allclose(model.embed(TEXT, normalize=1), raw / np.abs(raw).sum(), atol=1e-7)
    assert np.abs(model.embed(TEXT, normalize=0)).max() == pytest.approx(32760.0, rel=1e-6)
    np.testing.assert_array_equal(normalize_vector(np.zeros(4, dtype=np.float32)), np.zeros(4))


def test_an_input_longer_than_the_embedding_context_is_refused_naming_n_ctx(model):
    with pytest.raises(ContextOverflowError, match="n_ctx=16"):
        model.embed(TEXT * 4, n_ctx=16)


@pytest.mark.parametrize("bad, error", [([], InvalidParameterError), (3.5, TokenizeError),
                                        ([TEXT, 7.0], TokenizeError), ([10**9], TokenizeError)])
def test_bad_inputs_are_refused_with_a_typed_error(model, bad, error):
    with pytest.raises(error):
        model.embed(bad)


@pytest.mark.parametrize("kwargs", [{"pooling": "rank"}, {"pooling": "max"}, {"normalize": -2}, {"normalize": "l2"}])
def test_bad_settings_are_refused_with_a_typed_error(model, kwargs):
    with pytest.raises(InvalidParameterError):
        model.embed(TEXT, **kwargs)


def test_embedding_does_not_disturb_generation(model):
    before = model.generate(OTHER, max_tokens=8, temperature=0).text
    model.embed(TEXT)
    assert model.generate(OTHER, max_tokens=8, temperature=0).text == before


def test_a_closed_model_refuses_embed(trained_paths):
    m = Model(trained_paths[0])
    m.embed(TEXT)
    m.close()
    with pytest.raises(ModelLoadError):
        m.embed(TEXT)


def test_a_context_refuses_an_unknown_pooling_type():
    from mtp_bindings.config.params import ContextParams

    with pytest.raises(InvalidParameterError, match="pooling"):
        ContextParams(pooling="max").validate()
