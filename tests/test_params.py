"""Parameters: one definition of each default and bound (pure: no compiled extension needed)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from mtp_bindings import InvalidParameterError
from mtp_bindings.config.params import (DRAFT_N_MAX, ContextParams, DraftParams, SamplingParams, check_draft_overrides,
                                        resolve_flash_attn)

ROOT = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_draft_n_max_is_bounded_by_the_c_apis_maximum():
    DraftParams(draft_n_max=DRAFT_N_MAX).validate()
    with pytest.raises(InvalidParameterError, match=f"0..{DRAFT_N_MAX}"):
        DraftParams(draft_n_max=DRAFT_N_MAX + 1).validate()


def test_every_bounded_field_says_its_bounds_in_its_metadata():
    for cls in (SamplingParams, DraftParams, ContextParams):
        for f in fields(cls):
            if "min" in f.metadata:
                assert f.metadata["help"], f"{cls.__name__}.{f.name} has no help text"


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -1}, "temperature must be a number in"),
    ({"top_k": -2}, "top_k must be an int >= -1"),
    ({"seed": True}, "seed must be an int >= -1 or None"),
    ({"top_p": 0.0}, "top_p must be > 0"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
])
def test_out_of_range_sampling_settings_are_refused(kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        SamplingParams(**kwargs)


def test_unset_draft_overrides_pass_and_set_ones_are_checked():
    check_draft_overrides(None, None)
    with pytest.raises(InvalidParameterError, match="skip_streak"):
        check_draft_overrides(None, 33)


def test_auto_flash_attention_is_llama_cpp_s_auto_unless_the_v_cache_is_quantized():
    assert resolve_flash_attn("auto", "f16") == "auto"
    assert resolve_flash_attn("auto", "q8_0") == "on"
    assert resolve_flash_attn("on", "f16") == "on"
    assert ContextParams(type_v="q4_0").resolved_flash_attn == "on"


def test_the_version_is_defined_once_in_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    meta = project["tool"]["scikit-build"]["metadata"]["version"]
    source = (ROOT / meta["input"]).read_text()
    assert re.search(r'^__version__ = "\d+\.\d+\.\d+"$', source, re.M)


def test_the_sampling_defaults_are_llama_servers():
    """One set of defaults for every front end: llama-server's common_params_sampling at the pin."""
    d = SamplingParams()
    assert (d.temperature, d.top_k, d.top_p, d.min_p) == (0.8, 40, 0.95, 0.05)
    assert not d.has_penalties and not d.greedy


def test_minus_one_means_what_it_means_to_llama_cpp():
    p = SamplingParams(seed=-1, repeat_last_n=-1, top_k=-1, repeat_penalty=1.1).resolved(n_ctx=512)
    assert (p.seed, p.repeat_last_n, p.top_k) == (None, 512, 0)
    assert p.has_penalties
