"""Structured output: a grammar that every emitted token must follow, enforced with llguidance's
token masks (issue 16, item 3).

A :class:`Grammar` is a compiled, model-independent grammar (from a JSON schema, a GBNF or Lark
grammar, or "any JSON object"); a :class:`TokenConstraint` is one generation's matcher of it over
the model's vocabulary. The rejection sampler consults the constraint for every row it reads:
row ``i`` of a verify decode is masked (disallowed tokens' logits set to -inf) in the matcher's state
after ``drafts[:i]`` (all of a round's masks computed at once, :meth:`TokenConstraint.round_masks`, and
applied in C by the round itself; :meth:`TokenConstraint.mask` masks a copy, for the numpy path), so a draft the grammar forbids has probability 0 and is
rejected, and the token drawn instead is one the grammar allows. A draft enters the matcher only
once it is accepted, so the matcher always holds exactly the emitted tokens; :meth:`rollback`
undoes consumed tokens for a caller that takes some back. At the end of the grammar only the
end-of-generation tokens are allowed, and :attr:`TokenConstraint.stopped` tells the loop to stop.

llguidance is an optional dependency (``pip install mtp-bindings[structured]``); it is imported
only when a grammar is asked for.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ..exceptions import InvalidParameterError, MTPBindingsError

if TYPE_CHECKING:
    from ..llama_model import LlamaModel

# JSON whitespace between tokens: at most this many characters in a row (as llama.cpp's own
# JSON-schema grammars bound it); unbounded whitespace lets a weak model pad until max_tokens.
# A schema's own top-level "x-guidance" options override it.
JSON_DEFAULTS: dict[str, Any] = {"whitespace_pattern": r"[ \t\n\r]{0,20}"}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
# llama.cpp token attributes (llama.h's enum llama_token_attr)
_ATTR_CONTROL = 1 << 3
_ATTR_USER_DEFINED = 1 << 4


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise InvalidParameterError("structured output (grammar / json_schema) needs llguidance: "
                                    "pip install 'mtp-bindings[structured]'") from None
    return llguidance


class Grammar:
    """A compiled grammar in llguidance's format, checked for errors; reusable across
    generations and models. Build one with :meth:`from_json_schema`, :meth:`from_gbnf` or
    :meth:`json_object`."""

    def __init__(self, compiled: str, source: str) -> None:
        self.compiled = compiled
        self.source = source  # what it was made from, for error messages

    def __repr__(self) -> str:
        return f"Grammar({self.source})"

    @classmethod
    def from_json_schema(cls, schema: dict[str, Any] | str) -> Grammar:
        """Outputs that are JSON valid under ``schema`` (a JSON schema as a dict or a JSON
        string; properties are emitted in the schema's order). Raises
        :class:`InvalidParameterError` naming the problem when the schema is not valid or uses
        a feature llguidance does not support."""
        llg = _llguidance()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise InvalidParameterError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise InvalidParameterError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        try:
            compiled = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
        except (ValueError, TypeError) as e:
            raise InvalidParameterError(f"invalid json_schema: {e}") from None
        return cls._checked(compiled, "json_schema")

    @classmethod
    def from_gbnf(cls, text: str) -> Grammar:
        """Outputs of a GBNF grammar (llama.cpp's format, start rule ``root``) or of a Lark
        grammar (llguidance's format, start rule ``start``)."""
        llg = _llguidance()
        if not isinstance(text, str) or not text.strip():
            raise InvalidParameterError("grammar must be a non-empty string (GBNF or Lark)")
        try:
            compiled = llg.grammar_from("gbnf", text)
        except ValueError as e:
            raise InvalidParameterError(f"invalid grammar: {e}") from None
        return cls._checked(compiled, "grammar")

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.from_json_schema(ANY_JSON_OBJECT)

    @classmethod
    def _checked(cls, compiled: str, source: str) -> Grammar:
        is_error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(compiled)
        if is_error:
            raise InvalidParameterError(f"invalid {source}: {messages[0]}")
        return cls(compiled, source)


def as_grammar(grammar: Grammar | str | None, json_schema: dict[str, Any] | str | None) -> Grammar | None:
    """The one grammar ``generate`` was given: ``grammar`` (a :class:`Grammar` or GBNF/Lark text)
    or ``json_schema``; None for neither; both is an error."""
    if grammar is not None and json_schema is not None:
        raise InvalidParameterError("give grammar or json_schema, not both")
    if isinstance(grammar, Grammar):
        return grammar
    if grammar is not None:
        return Grammar.from_gbnf(grammar)
    if json_schema is not None:
        return Grammar.from_json_schema(json_schema)
    return None


class _Vocabulary:
    """The model's vocabulary as llguidance's ``TokenizerWrapper`` reads it: each token's bytes
    (control tokens marked with a leading 0xff, llguidance's convention for special tokens), the
    end tokens, and the model's tokenizer."""

    def __init__(self, model: LlamaModel) -> None:
        from ..native._native import lib

        vocab = model.vocab  # raises once the model is closed
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for tok in range(model.n_vocab):
            piece = model.token_to_piece(tok, special=True)
            attr = int(lib.llama_vocab_get_attr(vocab, tok))
            if attr & _ATTR_CONTROL or (attr & _ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + piece
                self.special_token_ids.append(tok)
            self.tokens.append(piece)
        self.eos_token_id = model.token_eos
        self.bos_token_id = model.token_bos
        self._model = weakref.ref(model)  # weak: the tokenizer is cached per model, keyed weakly by it

    def __call__(self, text: bytes | str) -> list[int]:
        model = self._model()
        if model is None:
            raise MTPBindingsError("the model of this vocabulary is gone")
        return model.tokenize(text, add_special=False, parse_special=False)


_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def tokenizer_for(model: LlamaModel) -> Any:
    """llguidance's tokenizer of ``model``'s vocabulary (built once per model: one pass over the
    vocabulary); its end tokens are all of the model's end-of-generation tokens."""
    with _tokenizers_lock:
        tok = _tokenizers.get(model)
        if tok is None:
            llg = _llguidance()
            vocab = _Vocabulary(model)
            eog = [t for t in range(model.n_vocab) if model.is_eog(t)] or [model.token_eos]
            tok = llg.LLTokenizer(llg.TokenizerWrapper(vocab), n_vocab=model.n_vocab, eos_token=eog)
            _tokenizers[model] = tok
        return tok


class TokenConstraint:
    """One generation's matcher of a :class:`Grammar`: masks logits rows and follows the emitted
    tokens (see the module's docstring)."""

    def __init__(self, model: LlamaModel, grammar: Grammar) -> None:
        llg = _llguidance()
        self.n_vocab = model.n_vocab
        self.matcher = llg.LLMatcher(tokenizer_for(model), grammar.compiled, log_level=0)
        self.n_masks = 0  # rows masked (for tests and stats)
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise InvalidParameterError(f"the grammar cannot be used: {self.matcher.get_error()}")

    def allowed(self) -> np.ndarray:
        """Which tokens the grammar allows next (bool per token)."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.n_vocab].view(np.bool_)

    def bitmask(self) -> np.ndarray:
        """llguidance's mask of the tokens the grammar allows next, packed: token ``t`` is allowed where bit
        ``t % 32`` of word ``t // 32`` is set (uint32, ``ceil(n_vocab / 32)`` words)."""
        words = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint32)
        if words.size * 32 < self.n_vocab:
            raise MTPBindingsError(f"llguidance's mask covers {words.size * 32} tokens, the vocabulary {self.n_vocab}")
        self.n_masks += 1
        return words[: (self.n_vocab + 31) // 32]

    def round_masks(self, drafts: list[int]) -> np.ndarray:
        """The masks of a verify round's rows, all at once: row ``i`` in the state after ``drafts[:i]``, up to
        the first draft the grammar forbids (the rows after it are never read: that draft has probability 0),
        the matcher taken back to where it was. One row of uint32 words per mask (:meth:`bitmask`)."""
        masks = [self.bitmask()]
        consumed = 0
        try:
            for d in drafts:
                m = masks[-1]
                if not (0 <= d < self.n_vocab and (int(m[d >> 5]) >> (d & 31)) & 1):
                    break
                if not self.matcher.consume_token(int(d)):
                    break
                consumed += 1
                masks.append(self.bitmask())
        finally:
            self.rollback(consumed)
        return np.stack(masks)

    def mask(self, row: np.ndarray) -> np.ndarray:
        """A copy of the logits ``row`` with every token the grammar forbids next at -inf."""
        ok = self.allowed()
        if not ok.any():
            raise MTPBindingsError(f"the grammar allows no next token: {self.matcher.get_error() or 'dead end'}")
        self.n_masks += 1
        return np.where(ok, row[: self.n_vocab], np.float32(-np.inf)).astype(row.dtype, copy=False)

    def consume(self, token: int) -> None:
        """Advance past an emitted ``token`` (one the last mask allowed)."""
        if not self.matcher.consume_token(int(token)):
            raise MTPBindingsError(f"token {token} does not follow the grammar: {self.matcher.get_error()}")

    def rollback(self, n: int) -> None:
        """Take back the last ``n`` consumed tokens."""
        if n and not self.matcher.rollback(n):
            raise MTPBindingsError(f"could not roll the grammar back {n} tokens: {self.matcher.get_error()}")

    @property
    def stopped(self) -> bool:
        """The grammar is complete and allows nothing more (except end-of-generation)."""
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        """The tokens so far form a complete output of the grammar."""
        return bool(self.matcher.is_accepting())


__all__ = ["Grammar", "TokenConstraint", "as_grammar", "tokenizer_for", "JSON_DEFAULTS"]
