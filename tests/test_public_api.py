"""The public API as a user meets it: every name of ``__all__`` resolves, ``generate`` / ``chat``
show every keyword argument (no ``**kwargs``, no test-only switch), so do ``Model(...)``,
``Model.from_pretrained`` and ``create_context`` (their forwarded keywords spelled out), and the
speculative settings object means what its flat keywords mean."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import mtp_bindings
from mtp_bindings import Model, SamplingParams, SpeculativeParams
from mtp_bindings.config.params import ContextParams
from mtp_bindings.config.signatures import ContextOptions, LoadOptions
from mtp_bindings.llama_model import LlamaModel

CONTEXT_FIELDS = {f.name for f in dataclasses.fields(ContextParams)}
LOAD_SETTINGS = {"n_gpu_layers", "devices", "rpc_servers", "use_mmap", "vocab_only", "repack", "progress", "verbose"}


def test_every_name_of_all_resolves():
    for name in mtp_bindings.__all__:
        assert getattr(mtp_bindings, name) is not None, name


def test_generate_and_chat_show_every_keyword_argument():
    for fn in (Model.generate, Model.chat):
        params = inspect.signature(fn).parameters
        assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params.values()), fn
        assert {"sampling", "speculative", "stream", "max_tokens", "temperature"} <= set(params), fn
        assert "h_idx" not in params  # a test switch: mtp_bindings.generation.driver.h_idx_for_tests


@pytest.mark.parametrize("fn, wanted", [
    (Model, {"assistant", "n_gpu_layers_draft", "devices_draft"} | LOAD_SETTINGS | CONTEXT_FIELDS),
    (Model.from_pretrained, {"assistant_filename", "revision", "n_gpu_layers_draft"} | LOAD_SETTINGS | CONTEXT_FIELDS),
    (Model.create_context, {"params"} | CONTEXT_FIELDS),
    (LlamaModel, LOAD_SETTINGS | CONTEXT_FIELDS),
], ids=["Model", "from_pretrained", "create_context", "LlamaModel"])
def test_loading_and_contexts_show_every_keyword_argument(fn, wanted):
    params = inspect.signature(fn).parameters
    assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params.values())
    assert wanted <= set(params), wanted - set(params)


def test_a_shown_default_is_the_one_its_owner_applies():
    shown = inspect.signature(Model).parameters
    assert shown["n_ctx"].default == ContextParams().n_ctx
    assert shown["flash_attn"].default == ContextParams().flash_attn
    assert shown["repack"].default is True


def test_the_typed_keyword_dicts_name_exactly_what_their_owners_take():
    assert set(ContextOptions.__annotations__) == CONTEXT_FIELDS
    loading = set(inspect.signature(LlamaModel).parameters) - {"path"}
    assert set(LoadOptions.__annotations__) | set(ContextOptions.__annotations__) == loading


def test_an_unknown_keyword_is_still_a_type_error(trained_paths):
    target, _ = trained_paths
    with pytest.raises(TypeError, match="n_ctxx"):
        Model(target, n_ctxx=512)


def test_speculative_params_are_the_flat_keywords(trained_paths):
    target, assistant = trained_paths
    with Model(target, assistant=assistant) as m:
        flat = m.generate("Once upon a time", max_tokens=12, draft_n_max=2, depth2=False, temperature=0)
        obj = m.generate("Once upon a time", max_tokens=12, speculative=SpeculativeParams(draft_n_max=2, depth2=False),
                         sampling=SamplingParams(temperature=0))
        over = m.generate("Once upon a time", max_tokens=12, speculative=SpeculativeParams(draft_n_max=2),
                          draft_n_max=0, temperature=0)  # a flat keyword overrides the object's field
    assert obj.tokens == flat.tokens == over.tokens
    assert obj.stats.n_drafted == flat.stats.n_drafted > 0 and over.stats.n_drafted == 0
