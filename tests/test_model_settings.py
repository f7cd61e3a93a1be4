"""What ``Model(...)`` takes and refuses at load, as a llama-cpp-python user would type it: context
settings (``n_ctx``, ``n_threads``, ...) that the contexts ``generate`` / ``chat`` make use, a clear
TypeError for a keyword it does not take, an assistant file refused as a target, and drafting
asked of a model with no assistant refused instead of silently decoding plainly."""

from __future__ import annotations

import pytest

from mtp_bindings import (ContextOverflowError, InvalidParameterError, Model, NoAssistantError,
                          NotATargetModelError)
from mtp_bindings.config.limits import DEFAULT_N_CTX


@pytest.fixture(scope="module")
def target(trained_paths):
    return trained_paths[0]


@pytest.fixture(scope="module")
def assistant(trained_paths):
    return trained_paths[1]


def test_model_takes_n_ctx_n_threads_and_n_batch_as_the_defaults_of_its_contexts(target):
    with Model(target, n_ctx=512, n_threads=2, n_batch=128, n_ubatch=128) as m:
        with m.generation_context() as ctx:  # the one generate / chat would use
            assert (ctx.n_ctx, ctx.n_threads, ctx.n_batch) == (512, 2, 128)
        with m.create_context() as ctx:
            assert ctx.n_ctx == 512
        with m.create_context(n_ctx=256) as ctx:  # create_context's own arguments win
            assert ctx.n_ctx == 256
        assert len(m.generate("def f(x):", max_tokens=4, temperature=0).tokens) == 4


def test_without_n_ctx_a_generation_context_holds_the_default_capped_at_the_training_context(target):
    with Model(target) as m:
        want = min(DEFAULT_N_CTX, m.n_ctx_train) if m.n_ctx_train else DEFAULT_N_CTX
        assert m.generation_n_ctx == want


def test_n_ctx_zero_is_the_models_training_context(target):
    with Model(target, n_ctx=0) as m:
        assert m.generation_n_ctx == (m.n_ctx_train or DEFAULT_N_CTX)


def test_an_unknown_model_keyword_is_a_type_error_naming_model(target):
    with pytest.raises(TypeError, match=r"^Model\(\) got an unexpected keyword argument 'n_gpu'") as e:
        Model(target, n_gpu=3)
    assert "LlamaModel" not in str(e.value) and "n_ctx" in str(e.value)  # it lists the settings it takes


def test_a_bad_context_setting_is_refused_at_load(target):
    with pytest.raises(InvalidParameterError, match="n_ctx"):
        Model(target, n_ctx=-5)
    with pytest.raises(InvalidParameterError, match="n_threads"):
        Model(target, n_threads=0)


def test_a_prompt_longer_than_the_generation_context_names_the_n_ctx_setting(target):
    with Model(target, n_ctx=32) as m:
        with pytest.raises(ContextOverflowError, match=r"context holds 32: Model\(\.\.\., n_ctx=\.\.\.\)"):
            m.generate("word " * 100, max_tokens=4)


def test_a_prompt_longer_than_a_given_context_says_how_to_make_a_longer_one(target):
    with Model(target) as m, m.create_context(n_ctx=32) as ctx:
        with pytest.raises(ContextOverflowError, match=r"create_context\(n_ctx=\.\.\.\)"):
            m.generate("word " * 100, max_tokens=4, context=ctx)


def test_max_tokens_minus_one_generates_until_the_context_is_full(target):
    with Model(target, n_ctx=48) as m:
        r = m.generate("def f(x):", max_tokens=-1, temperature=0, ignore_eos=True)
        assert r.stats.n_prompt + len(r.tokens) <= 48 and len(r.tokens) > 8


def test_an_assistant_file_loaded_as_a_target_is_refused_at_load(assistant):
    with pytest.raises(NotATargetModelError, match="is an MTP assistant.*assistant="):
        Model(assistant)


@pytest.mark.parametrize("asked", [{"draft_n_max": 2}, {"preset": "quality"}, {"preset": "auto"}])
def test_drafting_asked_of_a_model_without_an_assistant_raises_no_assistant_error(target, asked):
    with Model(target) as m:
        with pytest.raises(NoAssistantError, match="has no MTP assistant"):
            m.generate("def f(x):", max_tokens=4, **asked)


def test_a_model_without_an_assistant_decodes_plainly_by_default(target):
    with Model(target) as m:
        r = m.generate("def f(x):", max_tokens=4, temperature=0)
        assert len(r.tokens) == 4 and r.stats.n_drafted == 0
        assert m.generate("def f(x):", max_tokens=4, temperature=0, draft_n_max=0).tokens == r.tokens
        # a preset with draft_n_max=0 says "plain" explicitly: no drafting asked for
        assert m.generate("def f(x):", max_tokens=4, temperature=0, preset="quality", draft_n_max=0).tokens == r.tokens
