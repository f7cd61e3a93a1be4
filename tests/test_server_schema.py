"""The server's request schema takes its bounds and defaults from the library's one source
(:mod:`mtp_bindings.config.params`), in process, without a model."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mtp_bindings.exceptions import InvalidParameterError
from mtp_bindings.config.params import DRAFT_N_MAX, SAMPLING_DEFAULTS, SamplingParams
from mtp_bindings.server import CompletionRequest, DraftDefaults, generation_kwargs

VALUES = [-101.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 64.0, 100.0, 100.5]


def server_accepts(**fields: Any) -> bool:
    try:
        CompletionRequest.model_validate({"prompt": "x", **fields})
    except ValidationError:
        return False
    return True


def library_accepts(**fields: Any) -> bool:
    try:
        SamplingParams(**fields)
    except InvalidParameterError:
        return False
    return True


@pytest.mark.parametrize("name", ["top_p", "min_p", "repeat_penalty", "typical_p", "top_n_sigma", "xtc_probability",
                                  "xtc_threshold", "dry_multiplier", "dry_base"])
def test_a_sampling_value_is_refused_exactly_when_the_library_refuses_it(name: str) -> None:
    for v in VALUES:
        assert server_accepts(**{name: v}) == library_accepts(**{name: v}), (name, v)


@pytest.mark.parametrize("name", ["top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n"])
def test_a_count_is_refused_exactly_when_the_library_refuses_it_or_is_minus_one(name: str) -> None:
    for v in (-2, -1, 0, 1, 40, 10**6):
        expected = library_accepts(**{name: v}) or (name == "repeat_last_n" and v == -1)  # -1: the whole context
        assert server_accepts(**{name: v}) == expected, (name, v)


@pytest.mark.parametrize("name, lo, hi", [("temperature", 0.0, 2.0), ("presence_penalty", -2.0, 2.0),
                                          ("frequency_penalty", -2.0, 2.0)])
def test_openai_ranges_narrow_the_librarys(name: str, lo: float, hi: float) -> None:
    for v in VALUES:
        assert server_accepts(**{name: v}) == (library_accepts(**{name: v}) and lo <= v <= hi), (name, v)


@pytest.mark.parametrize("body", [lambda n: {"draft_n_max": n}, lambda n: {"speculative.n_max": n},
                                  lambda n: {"speculative": {"n_max": n}}], ids=["flat", "dotted", "nested"])
def test_draft_n_max_goes_up_to_the_librarys_maximum(body: Any) -> None:
    assert server_accepts(**body(DRAFT_N_MAX)) and server_accepts(**body(0))
    assert not server_accepts(**body(DRAFT_N_MAX + 1)) and not server_accepts(**body(-1))


def test_a_request_that_sets_nothing_gets_the_librarys_defaults_temperature_included() -> None:
    kwargs = generation_kwargs(CompletionRequest.model_validate({"prompt": "x"}), DraftDefaults(), n_prompt=1,
                               n_ctx=100, n_vocab=10)
    for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
                 "frequency_penalty", "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier",
                 "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers"):
        assert kwargs[name] == getattr(SAMPLING_DEFAULTS, name), name  # one set of defaults, no server copy


def _kwargs(**fields: Any) -> dict[str, Any]:
    return generation_kwargs(CompletionRequest.model_validate({"prompt": "x", **fields}), DraftDefaults(), n_prompt=1,
                             n_ctx=100, n_vocab=10)


def test_a_dry_base_below_one_gets_the_default_as_llama_server_does() -> None:
    assert _kwargs(dry_base=0.5)["dry_base"] == SAMPLING_DEFAULTS.dry_base
    assert _kwargs(dry_base=2.0)["dry_base"] == 2.0


def test_dry_penalty_last_n_minus_one_is_the_whole_context() -> None:
    assert _kwargs(dry_penalty_last_n=-1)["dry_penalty_last_n"] == 100


def test_dry_sequence_breakers_are_a_non_empty_list_of_non_empty_strings() -> None:
    assert _kwargs(dry_sequence_breakers=["\n", "##"])["dry_sequence_breakers"] == ("\n", "##")
    for bad in ([], [""], "\n", [1]):
        assert not server_accepts(dry_sequence_breakers=bad), bad


def test_a_samplers_field_passes_only_as_llama_servers_own_order() -> None:
    from mtp_bindings.config.params import SAMPLER_ORDER
    from mtp_bindings.server.errors import APIError
    from mtp_bindings.server.unsupported import refuse_unsupported

    refuse_unsupported({"samplers": list(SAMPLER_ORDER)})
    with pytest.raises(APIError, match="samplers"):
        refuse_unsupported({"samplers": ["temperature", "top_k"]})


def test_server_drafting_defaults_are_checked_against_the_librarys_bounds() -> None:
    DraftDefaults(draft_n_max=DRAFT_N_MAX).validate()
    with pytest.raises(InvalidParameterError, match="draft_n_max"):
        DraftDefaults(draft_n_max=DRAFT_N_MAX + 1).validate()


def _limit(**fields: Any) -> int:
    return generation_kwargs(CompletionRequest.model_validate({"prompt": "x", **fields}), DraftDefaults(), n_prompt=1,
                             n_ctx=100, n_vocab=10, n_predict=50)["max_tokens"]


@pytest.mark.parametrize("name", ["n_predict", "max_completion_tokens", "max_tokens"])
def test_a_length_of_minus_one_is_the_servers_limit_and_zero_generates_nothing(name: str) -> None:
    assert _limit(**{name: -1}) == 50 and _limit(**{name: 0}) == 0 and _limit(**{name: 7}) == 7
    assert not server_accepts(**{name: -2})


def test_n_predict_wins_over_max_tokens_as_in_llama_server() -> None:
    assert _limit(n_predict=3, max_tokens=9) == 3 and _limit(max_completion_tokens=4, max_tokens=9) == 4
    assert _limit(n_predict=-1, max_tokens=9) == 50  # llama-server: -1 is the server's -n, whatever the aliases say


def test_drafting_asked_of_a_server_without_an_assistant_is_a_client_error():
    from mtp_bindings.exceptions import NoAssistantError
    from mtp_bindings.server.errors import generation_error

    err = generation_error(NoAssistantError("this model has no MTP assistant: draft_n_max=2 cannot draft"))
    assert err.status == 400 and "no MTP assistant" in err.message
