"""Every tunable parameter of the library, with its default and its bounds, defined once.

Pure Python (no native import): the command line and the server build their flags and request
schemas from these dataclasses (``dataclasses.fields(...)``; each field's ``metadata`` holds its
bounds and help text), and the fast test tier imports it without the compiled extension.

* :class:`SamplingParams` -- the sampler chain, with llama.cpp's names and llama-server's defaults:
  the one set of defaults of every front end (Python, the command line, the server).
* :class:`DraftParams` -- the speculative loop: tokens drafted per round, depth-2 overlap,
  the skip-streak threshold, the prompt cache.
* :class:`ContextParams` -- a llama.cpp context, including the flash-attention rule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..exceptions import InvalidParameterError
from .limits import DEFAULT_N_CTX

# The C API's LLAMA_MTP_MAX_STEPS (lib.LLAMA_MTP_MAX_STEPS; this pure layer cannot import it, and
# tests/test_c_api.py checks that the two agree): the most tokens one MTP request drafts.
DRAFT_N_MAX = 16
SKIP_STREAK_MAX = 32
THREADS_MAX = 512
N_CTX_MAX = 1 << 24
N_SEQ_MAX = 256
LOGPROBS_MAX = 20  # alternatives per token a generation may report (OpenAI's top_logprobs bound)

# Registering an RPC server (``rpc_servers=``, ``--rpc``) waits at most this long, seconds, for it to
# resolve, accept the connection and answer the protocol's hello: a worker that is down, busy with
# another client (an rpc-server serves one at a time) or not an rpc-server is then an error, not a hang.
RPC_TIMEOUT_S = 5.0
# ggml's rpc-server binds 127.0.0.1:50052 unless told (-H, -p): `mtp-bindings rpc-server` says so.
RPC_SERVER_HOST = "127.0.0.1"
RPC_SERVER_PORT = 50052

# Types a KV cache may hold (our names -> ggml's enum names) and flash-attention modes.
KV_TYPES = {
    "f32": "GGML_TYPE_F32", "f16": "GGML_TYPE_F16", "bf16": "GGML_TYPE_BF16",
    "q8_0": "GGML_TYPE_Q8_0", "q4_0": "GGML_TYPE_Q4_0", "q4_1": "GGML_TYPE_Q4_1",
    "q5_0": "GGML_TYPE_Q5_0", "q5_1": "GGML_TYPE_Q5_1", "iq4_nl": "GGML_TYPE_IQ4_NL",
    "turbo4": "GGML_TYPE_TURBO4_0", "turbo3": "GGML_TYPE_TURBO3_0", "turbo2": "GGML_TYPE_TURBO2_0",
}
UNQUANTIZED_KV = ("f32", "f16", "bf16")
# TurboQuant (patches 0019, 0118, 0119): 128-value codebook blocks of Hadamard-rotated rows, 4.125 / 3.125 /
# 2.125 bits a value (llama.cpp refuses a model whose head size the block does not divide)
TURBO_KV = ("turbo4", "turbo3", "turbo2")
FLASH_ATTN = {"auto": "LLAMA_FLASH_ATTN_TYPE_AUTO", "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
              "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}
# How an embedding context pools a sequence's token vectors (llama-server's --pooling; "none": one per token).
POOLING_TYPES = {"none": "LLAMA_POOLING_TYPE_NONE", "mean": "LLAMA_POOLING_TYPE_MEAN",
                 "cls": "LLAMA_POOLING_TYPE_CLS", "last": "LLAMA_POOLING_TYPE_LAST"}
EMBED_POOLING = "mean"  # Model.embed's default (llama-server takes the model's, "none" for a generative one)
# llama-server's embd_normalize default: 2 = L2 (-1 none, 0 max-abs to int16, 1 taxicab, p > 2 a p-norm)
EMBD_NORMALIZE = 2
# The most tokens one embedded input may have: a pooled embedding must be one physical batch, so the embedding
# context's n_ctx = n_batch = n_ubatch = this (llama-server's default n_ubatch, and its bound on an input too)
EMBED_N_CTX = 512


def _bounds(lo: float | None = None, hi: float | None = None, help: str = "") -> dict[str, Any]:  # noqa: A002
    return {"min": lo, "max": hi, "help": help}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


@functools.cache
def _bounded_fields(cls: type) -> tuple[tuple[str, Any, Any, bool, bool], ...]:
    """A dataclass's bounded fields: (name, min, max, int only, None allowed). Read once per class: a request builds
    and checks about five of these objects, and reading the metadata each time cost 12.8 against 5.1 us a check."""
    return tuple((f.name, f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("int", False), f.default is None)
                 for f in fields(cls) if f.metadata.get("min") is not None or f.metadata.get("max") is not None)


def check_bounds(obj: object) -> None:
    """Raise :class:`InvalidParameterError` for a field of ``obj`` (a dataclass of this module)
    outside the ``min``/``max`` of its metadata; None passes where the default is None."""
    for name, lo, hi, integral, none_ok in _bounded_fields(type(obj)):  # type: ignore[arg-type]  # a class is hashable
        v = getattr(obj, name)
        if v is None and none_ok:
            continue
        if not (_is_int(v) if integral else _is_number(v)) or (lo is not None and v < lo) or \
                (hi is not None and v > hi):
            none = " or None" if none_ok else ""
            if not integral:
                want = f"a number in [{lo}, {hi}]"
            elif hi is None:
                want = "a non-negative int" if lo == 0 else f"an int >= {lo}"
            else:
                want = f"an int in {lo}..{hi}"
            raise InvalidParameterError(f"{name} must be {want}{none}, got {v!r}")


def _int(lo: int | None, hi: int | None, help: str) -> dict[str, Any]:  # noqa: A002
    return {**_bounds(lo, hi, help), "int": True}


# ------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------

# The defaults of every front end (Model.generate / chat, the command line, the server), in this one
# place: llama-server's (``common_params_sampling`` in vendor/llama.cpp/common/common.h at the pin:
# temp 0.80, top_k 40, top_p 0.95, min_p 0.05, penalty_last_n 64 with penalty_repeat 1.0 / freq 0 /
# present 0, i.e. penalties off; typical_p 1 and top_n_sigma -1, off; xtc_probability 0 (off) with
# xtc_threshold 0.10; dry_multiplier 0 (off) with dry_base 1.75, dry_allowed_length 2,
# dry_penalty_last_n 64 and the sequence breakers "\n", ":", '"', "*"), which llama-cpp-python shares --
# so that a prompt moved here from either samples the same way. Greedy decoding is ``temperature=0``.
# Where llama.cpp reads -1 or 0 as "off" / "all" / "random", so does this (the bounds below say which).
# The samplers run in llama-server's order (SAMPLER_ORDER), through llama.cpp's own sampler chain
# (mtp_bindings.generation.chain).
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05
DEFAULT_REPEAT_LAST_N = 64
DEFAULT_TYPICAL_P = 1.0
DEFAULT_TOP_N_SIGMA = -1.0
DEFAULT_XTC_PROBABILITY = 0.0
DEFAULT_XTC_THRESHOLD = 0.1
DEFAULT_DRY_MULTIPLIER = 0.0
DEFAULT_DRY_BASE = 1.75
DEFAULT_DRY_ALLOWED_LENGTH = 2
DEFAULT_DRY_PENALTY_LAST_N = 64
DEFAULT_DRY_SEQUENCE_BREAKERS = ("\n", ":", "\"", "*")
# llama-server's sampler order (common_params_sampling::samplers at the pin), after logit_bias; the names are
# llama-server's ("samplers" in /props); temperature is last, and the final draw (dist) follows it
SAMPLER_ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
WHOLE_CONTEXT = -1  # repeat_last_n = -1: the penalties look back over the whole context (llama.cpp's)
RANDOM_SEED = -1  # seed = -1: a fresh random seed, as None (llama.cpp's LLAMA_DEFAULT_SEED)


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings (llama.cpp's names; llama-server's defaults, see ``DEFAULT_TEMPERATURE``)."""

    temperature: float = field(default=DEFAULT_TEMPERATURE, metadata=_bounds(0.0, 100.0, "temperature (0: greedy)"))
    top_k: int = field(default=DEFAULT_TOP_K, metadata=_int(-1, None, "keep the k most likely tokens (0 or -1: all)"))
    top_p: float = field(default=DEFAULT_TOP_P, metadata=_bounds(0.0, 1.0, "nucleus sampling mass (1: off)"))
    min_p: float = field(default=DEFAULT_MIN_P, metadata=_bounds(0.0, 1.0, "drop tokens below min_p x the top one "
                                                                          "(0: off)"))
    repeat_penalty: float = field(default=1.0, metadata=_bounds(0.0, 100.0, "penalty of repeated tokens (1: off)"))
    repeat_last_n: int = field(default=DEFAULT_REPEAT_LAST_N,
                               metadata=_int(WHOLE_CONTEXT, None, "tokens the penalties look back over (0: none, "
                                                                  "-1: the whole context)"))
    presence_penalty: float = field(default=0.0, metadata=_bounds(-100.0, 100.0, "presence penalty (0: off)"))
    frequency_penalty: float = field(default=0.0, metadata=_bounds(-100.0, 100.0, "frequency penalty (0: off)"))
    seed: int | None = field(default=None, metadata=_int(RANDOM_SEED, None, "random seed (None or -1: fresh)"))
    logit_bias: dict[int, float] | None = None
    typical_p: float = field(default=DEFAULT_TYPICAL_P, metadata=_bounds(0.0, 1.0, "locally typical sampling, "
                                                                                  "parameter p (1: off)"))
    top_n_sigma: float = field(default=DEFAULT_TOP_N_SIGMA,
                               metadata=_bounds(-100.0, 100.0, "keep tokens within n standard deviations of the "
                                                               "top logit (<= 0: off)"))
    xtc_probability: float = field(default=DEFAULT_XTC_PROBABILITY,
                                   metadata=_bounds(0.0, 1.0, "chance that XTC removes the top tokens (0: off)"))
    xtc_threshold: float = field(default=DEFAULT_XTC_THRESHOLD,
                                 metadata=_bounds(0.0, 1.0, "probability above which XTC removes a token "
                                                            "(> 0.5: off)"))
    dry_multiplier: float = field(default=DEFAULT_DRY_MULTIPLIER,
                                  metadata=_bounds(0.0, 100.0, "DRY repetition penalty multiplier (0: off)"))
    dry_base: float = field(default=DEFAULT_DRY_BASE, metadata=_bounds(0.0, 100.0, "DRY penalty base (< 1: DRY "
                                                                                  "off)"))
    dry_allowed_length: int = field(default=DEFAULT_DRY_ALLOWED_LENGTH,
                                    metadata=_int(0, None, "repetitions longer than this get the DRY penalty"))
    dry_penalty_last_n: int = field(default=DEFAULT_DRY_PENALTY_LAST_N,
                                    metadata=_int(WHOLE_CONTEXT, None, "tokens DRY scans for repetitions (0: off, "
                                                                       "-1: the whole context)"))
    dry_sequence_breakers: tuple[str, ...] = field(default=DEFAULT_DRY_SEQUENCE_BREAKERS,
                                                   metadata={"help": "strings that end a DRY repetition"})

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                    _is_int(k) and k >= 0 and _is_number(v) for k, v in self.logit_bias.items()):
                raise InvalidParameterError("logit_bias must map token ids (ints >= 0) to numbers")
        if isinstance(self.dry_sequence_breakers, list):  # a list is taken as given, kept as a tuple (hashable)
            object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        if not isinstance(self.dry_sequence_breakers, tuple) or not all(
                isinstance(b, str) and b for b in self.dry_sequence_breakers):
            raise InvalidParameterError("dry_sequence_breakers must be a sequence of non-empty strings")
        if self.top_p == 0.0:
            raise InvalidParameterError("top_p must be > 0")
        if self.repeat_penalty == 0.0:
            raise InvalidParameterError("repeat_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def resolved(self, n_ctx: int) -> SamplingParams:
        """These settings with llama.cpp's special values spelled out for a context of ``n_ctx``
        tokens: ``seed`` -1 -> None (fresh), ``repeat_last_n`` and ``dry_penalty_last_n`` -1 -> ``n_ctx``,
        ``top_k`` -1 -> 0 (all)."""
        return replace(self, seed=None if self.seed == RANDOM_SEED else self.seed,
                       repeat_last_n=n_ctx if self.repeat_last_n == WHOLE_CONTEXT else self.repeat_last_n,
                       dry_penalty_last_n=n_ctx if self.dry_penalty_last_n == WHOLE_CONTEXT
                       else self.dry_penalty_last_n,
                       top_k=max(self.top_k, 0))

    @property
    def has_penalties(self) -> bool:
        return (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0) \
            and self.repeat_last_n != 0

    @property
    def has_dry(self) -> bool:
        """Whether DRY is on (llama.cpp's rule: a multiplier, a base >= 1 and a window)."""
        return self.dry_multiplier != 0.0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0

    @property
    def has_xtc(self) -> bool:
        """Whether XTC can remove tokens (llama.cpp's rule: a probability and a threshold <= 0.5)."""
        return self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5


SAMPLING_DEFAULTS = SamplingParams()


# ------------------------------------------------------------------------------------------------
# drafting
# ------------------------------------------------------------------------------------------------

H_IDX_CHOICES = ("accepted", "last")


@dataclass
class DraftParams:
    """Knobs of the speculative loop (see the README's table). ``h_idx="last"`` reproduces the
    design's regression (tests only)."""

    # no default: the count is a preset's (config/presets.py, the default one ``auto``) or the caller's
    draft_n_max: int = field(metadata=_int(0, DRAFT_N_MAX, "tokens drafted per round (0: plain)"))
    # auto: draft_n_max is the ceiling of a count chosen each round (the ``auto`` preset), not a fixed count
    auto: bool = False
    depth2: bool = True
    skip_streak: int = field(default=0, metadata=_int(0, SKIP_STREAK_MAX, "skip a round after this many "
                                                                        "zero-accept rounds (0: never)"))
    h_idx: str = "accepted"
    # greedy picks taken in the graph where nothing needs the logits rows (MTP_BINDINGS_GRAPH_GREEDY=0: on the host)
    graph_greedy: bool = True
    ignore_eos: bool = False
    # llama-server's cache_prompt (default on there too): keep the KV of the prompt's longest common
    # prefix with what the context's sequence holds, decode only the rest
    cache_prompt: bool = field(default=True, metadata={"help": "reuse the KV of the prompt's common prefix with "
                                                               "the previous request on the same context"})

    def validate(self) -> None:
        check_bounds(self)
        if self.h_idx not in H_IDX_CHOICES:
            raise InvalidParameterError(f"h_idx must be 'accepted' or 'last', got {self.h_idx!r}")


@dataclass(frozen=True)
class SpeculativeParams:
    """How a generation drafts (as vLLM's ``speculative_config``): each field left None takes the
    preset's value, or the environment's (``LLAMA_PIPELINE_DEPTH2``,
    ``LLAMA_MTP_SKIP_STREAK_THRESHOLD``). ``preset``: a name of :mod:`mtp_bindings.config.presets`
    (default ``auto``: each round drafts the count, up to ``draft_n_max``, with the most expected
    tokens/s); ``draft_n_max`` alone: a fixed count per round (0: plain decoding); ``depth2``: overlap
    the next round's draft with this round's verify; ``skip_streak``: skip drafting for a round after
    this many zero-accept rounds (0: never). Bounds: :class:`DraftParams`'."""

    preset: str | None = None
    draft_n_max: int | None = None
    depth2: bool | None = None
    skip_streak: int | None = None


def check_draft_overrides(draft_n_max: int | None = None, skip_streak: int | None = None) -> None:
    """Validate optional draft settings (None: the preset's) against :class:`DraftParams`' bounds."""
    check_bounds(DraftParams(draft_n_max=0 if draft_n_max is None else draft_n_max,
                             skip_streak=0 if skip_streak is None else skip_streak))


# ------------------------------------------------------------------------------------------------
# contexts
# ------------------------------------------------------------------------------------------------

def resolve_swa_type(swa: str | None, full: str) -> str:
    """The sliding-window layers' cache type: ``swa`` when given, else the other layers' ``full`` type, as
    llama.cpp's ``-ctk`` / ``-ctv`` set both. Not f16 by default: the pin's contexts keep a full-size window cache
    (``swa_full``, which MTP's rollback and the prompt cache rely on), so an f16 window costs what an f16
    full-attention layer costs (``bench/results/kv_types.md``); f16 there buys accuracy, not memory."""
    return full if swa is None else swa


# what "auto" means (resolve_flash_attn), as the CLI's help says it
FLASH_ATTN_AUTO = ("llama.cpp's own auto, on where the cache's device computes flash attention (every CPU); on for a "
                   "quantized V cache or a TurboQuant K")


def resolve_flash_attn(flash_attn: str, type_v: str, type_k: str = "f16") -> str:
    """``auto`` is llama.cpp's own ``auto`` (llama-server's default: on wherever the device that holds the cache
    computes flash attention, every CPU among them), except that a quantized V cache (which needs it) or a
    TurboQuant K (whose dot products flash attention takes on the codes) turns it on.

    Speculative verification decodes k+1 tokens at once and must give the logits a one-token
    decode gives; on the CPU it does, bit for bit, with flash attention off and on (every kernel of a
    decode of 1..8 tokens is batch-invariant: the patches ``tests/numerics.py`` lists,
    ``tests/test_matmul_few_columns.py``). Until 0108 only "off" kept that, and off was the default for an f16
    cache. With the f16 cache of the E2B-sized pair after a 4096-token prompt, on against off: prompt 88-90 against
    101-108 s, a one-token decode 59-62 against 70-76 ms (fastest of 9, two contexts each; within the noise at 100
    and 1024 tokens) [AMD EPYC; avx2]."""
    if flash_attn != "auto":
        return flash_attn
    return "on" if type_v not in UNQUANTIZED_KV or type_k in TURBO_KV else "auto"


@dataclass
class ContextParams:
    """Parameters of a context (llama.cpp's names; validated on creation)."""

    n_ctx: int = field(default=DEFAULT_N_CTX, metadata=_int(1, N_CTX_MAX, "context window, tokens"))
    n_batch: int = field(default=512, metadata=_int(1, None, "logical batch size"))
    n_ubatch: int = field(default=512, metadata=_int(1, None, "physical batch size"))
    n_seq_max: int = field(default=1, metadata=_int(1, N_SEQ_MAX, "sequences"))
    n_threads: int | None = field(default=None, metadata=_int(1, THREADS_MAX, "compute threads"))
    n_threads_batch: int | None = field(default=None, metadata=_int(1, THREADS_MAX, "prompt threads"))
    embeddings: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    # the sliding-window layers' cache (see resolve_swa_type); None: as type_k / type_v
    type_k_swa: str | None = None
    type_v_swa: str | None = None
    flash_attn: str = "auto"
    offload_kqv: bool = True
    pooling: str | None = None  # a POOLING_TYPES key for an embedding context; None: the model's own
    # compute with the part of the thread budget other work leaves free (see Context.adapt_threads);
    # None: adapt exactly when n_threads is not given
    adapt_threads: bool | None = None

    @property
    def adapts_threads(self) -> bool:
        return (self.n_threads is None and self.n_threads_batch is None) if self.adapt_threads is None \
            else bool(self.adapt_threads)

    def validate(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise InvalidParameterError(f"{name} must be a positive int, got {v!r}")
        if self.n_ctx > N_CTX_MAX:
            raise InvalidParameterError(f"n_ctx {self.n_ctx} is unreasonably large")
        if self.n_seq_max > N_SEQ_MAX:
            raise InvalidParameterError(f"n_seq_max must be <= {N_SEQ_MAX}, got {self.n_seq_max}")
        if self.n_ubatch > self.n_batch:
            raise InvalidParameterError(f"n_ubatch ({self.n_ubatch}) must be <= n_batch ({self.n_batch})")
        for name in ("n_threads", "n_threads_batch"):
            v = getattr(self, name)
            if v is not None and not valid_thread_count(v):
                raise InvalidParameterError(f"{name} must be an int in 1..{THREADS_MAX} or None, got {v!r}")
        if self.adapt_threads is not None and not isinstance(self.adapt_threads, bool):
            raise InvalidParameterError(f"adapt_threads must be a bool or None, got {self.adapt_threads!r}")
        for name in ("type_k", "type_v", "type_k_swa", "type_v_swa"):
            v = getattr(self, name)
            if v not in KV_TYPES and (v is not None or not name.endswith("_swa")):
                raise InvalidParameterError(f"{name} must be one of {sorted(KV_TYPES)}"
                                            f"{' or None' if name.endswith('_swa') else ''}, got {v!r}")
        if self.pooling is not None and self.pooling not in POOLING_TYPES:
            raise InvalidParameterError(f"pooling must be one of {sorted(POOLING_TYPES)} or None, got {self.pooling!r}")
        if self.flash_attn not in FLASH_ATTN:
            raise InvalidParameterError(f"flash_attn must be one of {sorted(FLASH_ATTN)}, got {self.flash_attn!r}")
        if self.flash_attn == "off" and any(t not in UNQUANTIZED_KV for t in (self.type_v, self.resolved_type_v_swa)):
            raise InvalidParameterError("a quantized V cache needs flash_attn 'on' or 'auto'")

    @property
    def resolved_type_k_swa(self) -> str:
        """The sliding-window layers' K cache type (see :func:`resolve_swa_type`)."""
        return resolve_swa_type(self.type_k_swa, self.type_k)

    @property
    def resolved_type_v_swa(self) -> str:
        """The sliding-window layers' V cache type (see :func:`resolve_swa_type`)."""
        return resolve_swa_type(self.type_v_swa, self.type_v)

    @property
    def resolved_flash_attn(self) -> str:
        """The flash-attention mode this context gets (see :func:`resolve_flash_attn`; the sliding-window layers' V
        counts too)."""
        type_v = self.type_v if self.type_v not in UNQUANTIZED_KV else self.resolved_type_v_swa
        type_k = self.type_k if self.type_k in TURBO_KV else self.resolved_type_k_swa
        return resolve_flash_attn(self.flash_attn, type_v, type_k)


def valid_thread_count(v: object) -> bool:
    """Whether ``v`` is a thread count the library accepts (an int in 1..THREADS_MAX)."""
    return _is_int(v) and 1 <= v <= THREADS_MAX  # type: ignore[operator]
