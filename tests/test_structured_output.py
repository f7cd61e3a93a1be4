"""Structured output exact under speculative verification (issue 16, item 3).

The trained pair writes gibberish Python; constrained decoding must still give output that parses
and validates against the schema (hypothesis-generated object schemas), the same tokens with and
without drafting at temperature 0, and never a token the grammar forbids: a draft it forbids is
rejected (counted here against a replay of the grammar), never emitted. The rejection sampler's
masking is also checked without a model, with a hand-made constraint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixture_paths import BUNDLED

pytest.importorskip("llguidance")

from mtp_bindings.exceptions import InvalidParameterError  # noqa: E402
from mtp_bindings.generation.constraint import Grammar, TokenConstraint  # noqa: E402
from mtp_bindings.generation.rejection import RejectionSampler  # noqa: E402
from mtp_bindings.generation.chain import sampler_for  # noqa: E402
from mtp_bindings.generation.sampling import Sampler  # noqa: E402
from mtp_bindings.config.params import SamplingParams  # noqa: E402

try:
    import jsonschema
except ImportError:  # pragma: no cover - the structure is then checked by hand
    jsonschema = None

PROMPT = "def parse_args(argv):\n"
MAX_TOKENS = 600  # room for any schema below (strings <= 8 chars, 4 properties, bounded whitespace)


# --- the rejection sampler's masking, without a model -----------------------------------------------

class OnlyTokens:
    """A constraint that allows only ``allowed`` at every position (records what it consumed)."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed
        self.consumed: list[int] = []

    def mask(self, row: np.ndarray) -> np.ndarray:
        keep = np.zeros(row.size, dtype=bool)
        keep[list(self.allowed)] = True
        return np.where(keep, row, -np.inf).astype(row.dtype)

    def consume(self, token: int) -> None:
        assert token in self.allowed, f"a forbidden token {token} was emitted"
        self.consumed.append(token)


def _rows(favourite: int, n: int = 3, vocab: int = 8) -> list[np.ndarray]:
    """Rows where ``favourite`` has by far the highest logit, token 2 the second highest."""
    rows = []
    for _ in range(n):
        row = np.zeros(vocab, dtype=np.float32)
        row[favourite], row[2] = 20.0, 5.0
        rows.append(row)
    return rows


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_the_constraint_forbids_is_rejected_even_when_the_target_prefers_it(temperature: float) -> None:
    for seed in range(50 if temperature else 1):
        c = OnlyTokens({2, 3})
        sp = SamplingParams(temperature=temperature, seed=seed, top_k=0, top_p=1.0, min_p=0.0)
        rs = RejectionSampler(sampler_for(sp, 8), c)  # type: ignore[arg-type]
        n_acc, y = rs.verify(_rows(5), [5, 5])
        assert n_acc == 0 and y in (2, 3) and c.consumed == [y]


def test_allowed_drafts_are_accepted_and_consumed_in_order() -> None:
    c = OnlyTokens({2, 5})
    rs = RejectionSampler(sampler_for(SamplingParams(temperature=0.0), 8), c)  # type: ignore[arg-type]
    n_acc, y = rs.verify(_rows(5), [5, 2])  # row 1's argmax is 5, not the draft 2: rejected there
    assert (n_acc, y) == (1, 5) and c.consumed == [5, 5]


def test_without_a_constraint_the_rows_are_not_copied() -> None:
    rows = _rows(5)
    seen = []

    class Spy(Sampler):
        def greedy_pick(self, row: np.ndarray) -> int:
            seen.append(row)
            return super().greedy_pick(row)

    class NumpyRound:  # the real chain without its native round: the numpy path, whose reads this test sees
        def __init__(self, chain: Any) -> None:
            self.chain, self.changes_argmax = chain, chain.changes_argmax

        def apply(self, row: np.ndarray) -> Any:
            return self.chain.apply(row)

        def accept(self, token: int) -> None:
            self.chain.accept(token)

        def close(self) -> None:
            self.chain.close()

    sp = SamplingParams(temperature=0.0)
    RejectionSampler(Spy(sp, NumpyRound(sampler_for(sp, 8).chain))).verify(rows, [5, 5])  # type: ignore[arg-type]
    assert len(seen) == 3 and all(a is b for a, b in zip(seen, rows))


# --- the real model -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    from mtp_bindings import Model

    with Model(BUNDLED / "trained-target.gguf", assistant=BUNDLED / "trained-assistant.gguf") as m:
        with m.create_context(n_ctx=2048, n_threads=1, embeddings=True) as ctx:
            m._test_ctx = ctx
            yield m


def run(model: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("temperature", 0.0)
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    return model.generate(kwargs.pop("prompt", PROMPT), context=model._test_ctx, **kwargs)


_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_PROPERTY = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-1000, 1000), st.integers(0, 10**6)),
    st.just({"type": "boolean"}),
    st.builds(lambda vals: {"enum": vals}, st.lists(st.text(alphabet="xyz ", min_size=1, max_size=4) | st.integers(-9, 9),
                                                    min_size=1, max_size=3, unique=True)),
)


@st.composite
def object_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Object schemas with string / integer / boolean / enum properties and a required list."""
    names = draw(st.lists(_NAMES, min_size=1, max_size=4, unique=True))
    props = {n: draw(_PROPERTY) for n in names}
    required = [n for n in names if draw(st.booleans())]
    # no additional properties: with them a gibberish model may add keys until max_tokens
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def check_valid(text: str, schema: dict[str, Any]) -> Any:
    value = json.loads(text)
    if jsonschema is not None:
        jsonschema.validate(value, schema)
    else:  # the structure by hand
        assert isinstance(value, dict) and set(schema["required"]) <= set(value)
    return value


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(schema=object_schemas())
def test_output_validates_against_generated_schemas_and_mtp_on_off_agree(model: Any, schema: dict[str, Any]) -> None:
    spec = run(model, json_schema=schema, draft_n_max=3)
    assert spec.finish_reason == "stop", spec.text
    check_valid(spec.text, schema)
    plain = run(model, json_schema=schema, draft_n_max=0)
    assert plain.tokens == spec.tokens  # exact: one model, batch-invariant verify rows (tests/numerics.py)
    assert spec.stats.n_drafted > 0


def test_sampled_output_validates_too(model: Any) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}}, "required": ["name", "n", "ok"],
              # without this a sampled gibberish model may add keys until max_tokens (a heavy tail:
              # ~2 % of seeds ran to 600 tokens, with or without drafting)
              "additionalProperties": False}
    for seed in range(5):
        r = run(model, json_schema=json.dumps(schema), temperature=0.9, seed=seed, draft_n_max=3)
        assert r.finish_reason == "stop"
        check_valid(r.text, schema)


def test_json_object_and_gbnf_grammars(model: Any) -> None:
    r = run(model, grammar=Grammar.json_object(), draft_n_max=3)
    assert isinstance(json.loads(r.text), dict) and r.finish_reason == "stop"
    r = run(model, grammar='root ::= "yes" | "no" | "maybe"', draft_n_max=3)
    assert r.text in ("yes", "no", "maybe") and r.finish_reason == "stop"
    r = run(model, grammar='start: "a" | "b"', draft_n_max=3)  # Lark
    assert r.text in ("a", "b")


def _forbidden_drafts(model: Any, grammar: Grammar, rounds: list[tuple[list[int], int]],
                      emitted: list[int]) -> list[tuple[int, int]]:
    """Replay the grammar over the emitted tokens: the first draft of each round that the grammar
    forbade, as (its position in the round, how many drafts that round accepted)."""
    replay = TokenConstraint(model, grammar)
    replay.consume(emitted[0])  # the first token comes before any round
    pos, out = 1, []
    for drafts, n_acc in rounds:
        advanced = 0
        for i, d in enumerate(drafts):
            if not replay.allowed()[d]:
                out.append((i, n_acc))
                break
            replay.consume(d)
            advanced += 1
        replay.rollback(advanced)
        for t in emitted[pos:pos + n_acc + 1]:
            replay.consume(t)
        pos += n_acc + 1
    return out


def test_a_forbidden_draft_is_rejected_never_emitted(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    literal = '{"status": "ok", "items": [1, 2, 3]}'
    grammar = Grammar.from_gbnf("root ::= " + json.dumps(literal))  # one output only
    rounds: list[tuple[list[int], int]] = []
    verify = RejectionSampler.verify

    def recording(self: RejectionSampler, rows: Any, drafts: Any) -> tuple[int, int]:
        n_acc, y = verify(self, rows, drafts)
        rounds.append((list(drafts), n_acc))
        return n_acc, y

    monkeypatch.setattr(RejectionSampler, "verify", recording)
    r = run(model, grammar=grammar, draft_n_max=3)
    assert r.text == literal and r.finish_reason == "stop"
    st_ = r.stats
    assert st_.n_drafted > st_.n_accepted, "every draft was accepted: nothing shows a rejection"
    forbidden = _forbidden_drafts(model, grammar, rounds, r.tokens)
    assert forbidden, "the MTP head never drafted a forbidden token: the test shows nothing"
    assert all(n_acc <= i for i, n_acc in forbidden)  # each forbidden draft was past the accepted prefix
    assert r.text == model.detokenize(r.tokens)


@pytest.mark.parametrize("kwargs,needle", [
    ({"json_schema": {"type": "nonsense"}}, "json_schema"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"json_schema": {"type": "string", "format": "no-such-format"}}, "json_schema"),
    ({"grammar": 'root ::= "a" ('}, "grammar"),
    ({"grammar": "root ::= undefined_rule"}, "grammar"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "not both"),
])
def test_an_invalid_schema_or_grammar_is_refused_naming_the_problem(model: Any, kwargs: dict[str, Any],
                                                                   needle: str) -> None:
    with pytest.raises(InvalidParameterError, match=needle):
        run(model, **kwargs)
