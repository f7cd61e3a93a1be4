"""The public API as a user meets it: every name of ``__all__`` resolves, ``generate`` / ``chat``
show every keyword argument (no ``**kwargs``, no test-only switch), and the speculative settings
object means what its flat keywords mean."""

from __future__ import annotations

import inspect

import mtp_bindings
from mtp_bindings import Model, SamplingParams, SpeculativeParams


def test_every_name_of_all_resolves():
    for name in mtp_bindings.__all__:
        assert getattr(mtp_bindings, name) is not None, name


def test_generate_and_chat_show_every_keyword_argument():
    for fn in (Model.generate, Model.chat):
        params = inspect.signature(fn).parameters
        assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params.values()), fn
        assert {"sampling", "speculative", "stream", "max_tokens", "temperature"} <= set(params), fn
        assert "h_idx" not in params  # a test switch: mtp_bindings.generation.driver.h_idx_for_tests


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
