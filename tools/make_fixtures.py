#!/usr/bin/env python3
"""Generate the tiny Gemma 4 test fixtures and the bundled default models.

This script builds, from nothing but a seed and the CPython standard library
sources found on the machine, every model the project tests against:

* a SentencePiece BPE tokenizer (vocab 1024, byte fallback, Gemma chat
  template) exported as a Hugging Face Gemma tokenizer;
* four *random* target + assistant pairs (``dense``, ``centroid``, ``keqv``,
  ``ple``) built with transformers' own Gemma 4 classes, saved as Hugging Face
  checkpoints under ``tests/fixtures/hf/`` and converted to F32 GGUF files in
  ``tests/fixtures/`` with the pinned llama.cpp's ``convert_hf_to_gguf.py``;
* a small *trained* pair (``trained``): a target trained on stdlib Python and
  an assistant distilled from it, converted to F16 GGUF files in
  ``mtp_bindings/models/`` (the package's bundled default models);
* Hugging Face reference outputs for each pair
  (``tests/fixtures/<name>-reference.npz`` plus a ``.json`` sidecar).

Everything is seeded and training runs a fixed number of steps; running the
script twice on the same machine (same Python stdlib, same torch/transformers
versions, same thread count) gives the same files.  ``--convert-only`` re-runs just the GGUF conversion from the
stored Hugging Face checkpoints and does not import torch itself (the upstream
converter it runs as a subprocess does).

Usage::

    python tools/make_fixtures.py                   # everything
    python tools/make_fixtures.py --skip-train      # random fixtures only
    python tools/make_fixtures.py --only dense ple  # a subset
    python tools/make_fixtures.py --convert-only    # re-convert stored HF dirs
    python tools/make_fixtures.py --references-only # recompute references from them
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported lazily so that --convert-only works without it
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

LOG = logging.getLogger("make_fixtures")

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"
HF_DIR = FIXTURES_DIR / "hf"
MODELS_DIR = REPO_ROOT / "mtp_bindings" / "models"
DEFAULT_LLAMA_SRC = Path("vendor") / "llama.cpp"

# ----------------------------------------------------------------------------
# Constants shared by every fixture
# ----------------------------------------------------------------------------

VOCAB_SIZE = 1024
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
START_OF_TURN, END_OF_TURN = "<start_of_turn>", "<end_of_turn>"
NEWLINE = "\n"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
#: Token ids a greedy reference continuation must avoid (an end-of-generation
#: token would make llama.cpp stop early and the comparison ragged).
FORBIDDEN_GREEDY_IDS = frozenset(range(6))

CORPUS_CHARS = 6_000_000
TOKENIZER_SEED = 1234
MIN_TOP_GAP = 3e-3
MIN_DISTINCT_GREEDY = 12  # per 24-token greedy continuation: rejects degenerate repeaters
MAX_RESEEDS = 200

SLIDING, FULL = "sliding_attention", "full_attention"

# Reference-output sizes
N_GREEDY_TOKENS = 24
N_DRAFT_STEPS = 4
GREEDY_PROMPTS = (
    "def main(argv):\n",
    "import os\nimport sys\n",
    "class Queue:\n    def __init__(self):",
    "    return self._data[key]\n",
)
TEACHER_FORCED_TEXTS = (
    "for i in range(10):\n    print(i)\n",
    "if __name__ == '__main__':\n    main()",
    "x = {'a': 1, 'b': [2, 3]}\n",
)
DRAFT_PROMPTS = (
    "def f(x):\n    return",
    "import re\n",
    "while True:\n    line =",
)
#: Candidate prompts for the trained pair's greedy references (see robust_greedy_references).
TRAINED_PROMPT_POOL = GREEDY_PROMPTS + (
    "from collections import",
    "    def __repr__(self):\n",
    "        if not isinstance(",
    "try:\n    import",
    "def main():\n",
    "        try:\n",
    "    raise",
    "    return",
    "        return self.",
    "    \"\"\"",
    "        else:\n",
    "    for key, value in",
)
MIN_TRAINED_GAP = 2e-2
MAX_TEACHER_FORCED_TOKENS = 15  # below the random fixtures' sliding window (16)
MAX_DRAFT_PROMPT_TOKENS = 12  # leaves room for HF's W+1 / llama.cpp's W-1 SWA quirk


# ----------------------------------------------------------------------------
# Fixture specifications
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """Shape of a Gemma 4 target (a ``Gemma4ForCausalLM`` text model)."""

    hidden: int
    layer_types: tuple[str, ...]
    intermediate: int
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 32
    global_head_dim: int = 64
    sliding_window: int = 16
    k_eq_v: bool = False
    per_layer_hidden: int = 0  # per-layer embeddings (E2B style) when > 0
    kv_shared_layers: int = 0


@dataclasses.dataclass(frozen=True)
class AssistantSpec:
    """Shape of a ``Gemma4AssistantForCausalLM`` drafter."""

    hidden: int
    intermediate: int
    heads: int = 2
    layer_types: tuple[str, ...] = (SLIDING, SLIDING, SLIDING, FULL)
    centroids: int = 0  # > 0: ordered-embeddings (centroid) head
    centroid_top_k: int = 4


@dataclasses.dataclass(frozen=True)
class FixtureSpec:
    """One target + assistant pair and where its files go."""

    name: str
    seed: int
    target: TargetSpec
    assistant: AssistantSpec
    #: Reuse the target (HF dir and GGUF) of another fixture instead of building one.
    target_from: str | None = None
    trained: bool = False

    @property
    def target_name(self) -> str:
        return self.target_from or self.name

    @property
    def gguf_dir(self) -> Path:
        return MODELS_DIR if self.trained else FIXTURES_DIR

    @property
    def gguf_outtype(self) -> str:
        return "f16" if self.trained else "f32"

    def hf_target_dir(self) -> Path:
        return HF_DIR / f"{self.target_name}-target"

    def hf_assistant_dir(self) -> Path:
        return HF_DIR / f"{self.name}-assistant"

    def target_gguf(self) -> Path:
        return self.gguf_dir / f"{self.target_name}-target.gguf"

    def assistant_gguf(self) -> Path:
        return self.gguf_dir / f"{self.name}-assistant.gguf"

    def reference_npz(self) -> Path:
        return FIXTURES_DIR / f"{self.name}-reference.npz"


SMALL_TARGET = TargetSpec(hidden=64, layer_types=(SLIDING, FULL, SLIDING, FULL), intermediate=64)
SMALL_ASSISTANT = AssistantSpec(hidden=32, intermediate=64)

FIXTURES: dict[str, FixtureSpec] = {
    spec.name: spec
    for spec in (
        FixtureSpec("dense", seed=100, target=SMALL_TARGET, assistant=SMALL_ASSISTANT),
        FixtureSpec(
            "centroid",
            seed=200,
            target=SMALL_TARGET,
            assistant=dataclasses.replace(SMALL_ASSISTANT, centroids=32),
            target_from="dense",
        ),
        FixtureSpec(
            "keqv",
            seed=300,
            target=dataclasses.replace(SMALL_TARGET, k_eq_v=True),
            assistant=SMALL_ASSISTANT,
        ),
        FixtureSpec(
            "ple",
            seed=400,
            target=TargetSpec(
                hidden=64,
                layer_types=(SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL),
                intermediate=64,
                per_layer_hidden=8,
                kv_shared_layers=3,
            ),
            assistant=dataclasses.replace(SMALL_ASSISTANT, centroids=32),
        ),
        FixtureSpec(
            "trained",
            seed=500,
            target=TargetSpec(
                hidden=128,
                layer_types=(SLIDING, FULL, SLIDING, FULL),
                intermediate=512,
                heads=4,
                sliding_window=64,
            ),
            assistant=AssistantSpec(hidden=64, intermediate=256, heads=4),
            trained=True,
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Budgets and hyper-parameters of the trained pair."""

    #: Fixed step counts (not wall-clock budgets) keep training reproducible; on
    #: 2 idle cores they take about 6 and 4 minutes.
    target_steps: int = 700
    assistant_steps: int = 450
    seq_len: int = 128
    batch: int = 16
    target_lr: float = 3e-3
    assistant_lr: float = 3e-3
    draft_steps: int = 3
    val_tokens: int = 60_000


# ----------------------------------------------------------------------------
# Corpus and tokenizer
# ----------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    """The CPython stdlib ``.py`` files used as training text, sorted for reproducibility."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3"}
    files = [p for p in root.rglob("*.py") if not skipped.intersection(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(max_chars: int = CORPUS_CHARS) -> list[str]:
    """Read stdlib sources (one string per file) until ``max_chars`` characters are collected."""
    texts: list[str] = []
    total = 0
    for path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    digest = hashlib.sha256("".join(texts).encode()).hexdigest()[:16]
    LOG.info("corpus: %d files, %d chars, sha256 %s", len(texts), total, digest)
    return texts


def train_sentencepiece(corpus: Sequence[str]) -> bytes:
    """Train the SentencePiece BPE model (deterministic: single thread, no sampling)."""
    import sentencepiece as spm

    buffer = _BytesSink()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=buffer,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        control_symbols=[START_OF_TURN, END_OF_TURN],
        user_defined_symbols=[NEWLINE],
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        character_coverage=0.9995,
        max_sentence_length=1 << 21,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=1,
        seed_sentencepiece_size=1_000_000,
        minloglevel=2,
    )
    return buffer.data


class _BytesSink:
    """Minimal writable object for SentencePiece's ``model_writer``."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def bpe_merges(vocab: dict[str, int], mergeable: set[str]) -> list[tuple[str, str]]:
    """Derive an ordered BPE merge list from a SentencePiece BPE vocabulary.

    SentencePiece BPE assigns ids in merge order, so a piece's id is its merge
    rank; every split of a piece into two mergeable pieces becomes a merge.
    """
    ranked: list[tuple[int, int, int, str, str]] = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((vocab[piece], vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def build_hf_tokenizer(spm_model: bytes, out_dir: Path) -> PreTrainedTokenizerBase:
    """Export the SentencePiece model as an HF Gemma tokenizer (tokenizer.json + config)."""
    import sentencepiece as spm
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, GemmaTokenizer

    proc = spm.SentencePieceProcessor(model_proto=spm_model)
    vocab = {proc.id_to_piece(i): i for i in range(proc.get_piece_size())}
    mergeable = {
        piece
        for piece, i in vocab.items()
        if not (proc.is_control(i) or proc.is_byte(i) or proc.is_unknown(i) or piece == NEWLINE)
    }
    tokenizer = GemmaTokenizer(
        vocab=vocab,
        merges=bpe_merges(vocab, mergeable),
        mask_token=None,
        add_bos_token=True,
        add_eos_token=False,
        extra_special_tokens=[START_OF_TURN, END_OF_TURN],
    )
    tokenizer.add_tokens([AddedToken(NEWLINE, normalized=False, special=False)])
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    _move_chat_template_into_config(out_dir)
    reloaded = AutoTokenizer.from_pretrained(out_dir)
    _check_tokenizer(reloaded)
    return reloaded


def _move_chat_template_into_config(out_dir: Path) -> None:
    """Keep the chat template in ``tokenizer_config.json`` (one place, read by HF and the converter)."""
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _check_tokenizer(tokenizer: PreTrainedTokenizerBase) -> None:
    """Fail loudly if the exported tokenizer lost its ids or special tokens."""
    expected = {"<pad>": PAD_ID, "<eos>": EOS_ID, "<bos>": BOS_ID, "<unk>": UNK_ID}
    for text, token_id in expected.items():
        if tokenizer.convert_tokens_to_ids(text) != token_id:
            raise RuntimeError(f"tokenizer: {text} is not id {token_id}")
    for text in (START_OF_TURN, END_OF_TURN):
        if text not in tokenizer.all_special_tokens:
            raise RuntimeError(f"tokenizer: {text} is not a special token")
    if len(tokenizer) != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer: {len(tokenizer)} tokens, expected {VOCAB_SIZE}")
    sample = "def f(x):\n    return x  # é\n"
    if tokenizer.decode(tokenizer(sample).input_ids, skip_special_tokens=True) != sample:
        raise RuntimeError("tokenizer: round trip failed")


def make_tokenizer(work_dir: Path) -> PreTrainedTokenizerBase:
    """Train and export the shared tokenizer into ``work_dir``."""
    model = train_sentencepiece(load_corpus())
    LOG.info("tokenizer: SentencePiece model sha256 %s", hashlib.sha256(model).hexdigest()[:16])
    return build_hf_tokenizer(model, work_dir)


# ----------------------------------------------------------------------------
# Model construction
# ----------------------------------------------------------------------------


def target_config(spec: TargetSpec) -> Any:
    """A ``Gemma4TextConfig`` for a target of the given shape."""
    from transformers import Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=len(spec.layer_types),
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        global_head_dim=spec.global_head_dim,
        num_global_key_value_heads=spec.kv_heads if spec.k_eq_v else None,
        sliding_window=spec.sliding_window,
        layer_types=list(spec.layer_types),
        max_position_embeddings=4096,
        final_logit_softcapping=30.0,
        attention_k_eq_v=spec.k_eq_v,
        hidden_size_per_layer_input=spec.per_layer_hidden,
        vocab_size_per_layer_input=VOCAB_SIZE if spec.per_layer_hidden else 0,
        num_kv_shared_layers=spec.kv_shared_layers,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        tie_word_embeddings=True,
    )
    config.architectures = ["Gemma4ForCausalLM"]
    return config


def assistant_config(spec: AssistantSpec, target: TargetSpec) -> Any:
    """A ``Gemma4AssistantConfig`` whose backbone is ``target``."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=len(spec.layer_types),
        num_attention_heads=spec.heads,
        num_key_value_heads=target.kv_heads,
        head_dim=target.head_dim,
        global_head_dim=target.global_head_dim,
        num_global_key_value_heads=target.kv_heads if target.k_eq_v else None,
        sliding_window=target.sliding_window,
        layer_types=list(spec.layer_types),
        max_position_embeddings=4096,
        final_logit_softcapping=None,  # HF's assistant never applies it; neither does llama.cpp's
        attention_k_eq_v=target.k_eq_v,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        num_kv_shared_layers=len(spec.layer_types),
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        tie_word_embeddings=True,
    )
    config = Gemma4AssistantConfig(
        text_config=text,
        backbone_hidden_size=target.hidden,
        use_ordered_embeddings=spec.centroids > 0,
        num_centroids=spec.centroids or 2048,
        centroid_intermediate_top_k=spec.centroid_top_k,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
    )
    config.architectures = ["Gemma4AssistantForCausalLM"]
    return config


def build_models(spec: FixtureSpec) -> tuple[PreTrainedModel, PreTrainedModel]:
    """Instantiate (default-initialised) target and assistant in float32, eager attention."""
    import torch
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    torch.manual_seed(spec.seed)
    target = Gemma4ForCausalLM(target_config(spec.target)).float().eval()
    assistant = Gemma4AssistantForCausalLM(assistant_config(spec.assistant, spec.target)).float().eval()
    for model in (target, assistant):
        model.config._attn_implementation = "eager"
        model.config.get_text_config()._attn_implementation = "eager"
    return target, assistant


def _fill(tensor: torch.Tensor, gen: torch.Generator, std: float) -> None:
    """Overwrite ``tensor`` with N(0, std^2) samples from ``gen``."""
    import torch

    tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * std)


def randomize_weights(model: PreTrainedModel, gen: torch.Generator) -> None:
    """Give every weight of a target or assistant a distinctive random value.

    Norm weights and ``layer_scalar`` are drawn away from 1 so that a port that
    drops one of them (or uses ``1 + w``) fails the comparison.  Embeddings are
    small and the post-attention / post-FFN / final norms large: with tied
    embeddings a random model whose residual stream is dominated by the input
    embedding just repeats its input token, which would make a weak test.
    The assistant's ``post_projection`` is scaled down because random drafters
    are chaotic (errors grow several-fold per chained draft step).
    """
    import torch

    def uniform(tensor: torch.Tensor, low: float, high: float) -> None:
        tensor.copy_(low + (high - low) * torch.rand(tensor.shape, generator=gen))

    with torch.no_grad():
        for name, tensor in _named_tensors(model):
            if name.endswith("token_ordering"):
                tensor.copy_(torch.randperm(tensor.numel(), generator=gen))
            elif name.endswith("layer_scalar"):
                uniform(tensor, 0.5, 1.5)
            elif name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
                uniform(tensor, 2.0, 4.0)
            elif name == "model.norm.weight":
                uniform(tensor, 2.0, 4.0)
            elif "norm" in name:
                uniform(tensor, 0.6, 1.4)
            elif name.endswith(("embed_tokens.weight", "embed_tokens_per_layer.weight")):
                _fill(tensor, gen, 0.1)
            elif name == "post_projection.weight":
                _fill(tensor, gen, 0.25 / math.sqrt(tensor.shape[1]))
            elif tensor.dim() == 2:
                _fill(tensor, gen, 1.0 / math.sqrt(tensor.shape[1]))
            else:
                raise RuntimeError(f"randomize_weights: unhandled tensor {name}")


def _named_tensors(model: PreTrainedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """Persistent parameters and buffers, each once (tied weights are skipped)."""
    seen: set[int] = set()
    state = model.state_dict()
    for name, tensor in state.items():
        if "rotary_emb" in name or id(tensor) in seen or name == "lm_head.weight":
            continue
        seen.add(id(tensor))
        yield name, _live_tensor(model, name)


def _live_tensor(model: PreTrainedModel, name: str) -> torch.Tensor:
    """The module attribute behind a state-dict key (so in-place writes reach the model)."""
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    return getattr(module, attr)


# ----------------------------------------------------------------------------
# HF reference computations
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class DraftRound:
    """HF's first drafting round after prefill of one prompt."""

    prompt: list[int]
    x: int  # the target's greedy token after the prompt (the assistant's first input token)
    h: np.ndarray  # [H_t] hidden state HF feeds with ``x`` to the first draft step
    h_pre_norm: np.ndarray  # [H_t] the same position before the target's final norm (for diagnosis)
    tokens: list[int]  # drafted ids, one per step
    logits: np.ndarray  # [steps, V] draft logits as used for drafting
    projected: np.ndarray  # [steps, H_t] post_projection output of each step (next step's h)
    positions: list[int]  # position id of each step


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` with the leading BOS."""
    return list(tokenizer(text).input_ids)


def target_logits(target: PreTrainedModel, ids: Sequence[int]) -> np.ndarray:
    """Full-vocab logits (after softcapping) at every position, one forward pass, no cache."""
    import torch

    with torch.no_grad():
        out = target(torch.tensor([list(ids)]), use_cache=False, logits_to_keep=0)
    return out.logits[0].float().numpy()


def greedy_tokens(target: PreTrainedModel, prompt: Sequence[int], n: int) -> tuple[list[int], float]:
    """Greedy continuation by full recomputation; returns tokens and the smallest top-1/top-2 gap."""
    ids = list(prompt)
    min_gap = math.inf
    for _ in range(n):
        row = target_logits(target, ids)[-1]
        top2 = np.sort(row)[-2:]
        min_gap = min(min_gap, float(top2[1] - top2[0]))
        ids.append(int(row.argmax()))
    return ids[len(prompt) :], min_gap


def greedy_with_generate(target: PreTrainedModel, prompt: Sequence[int], n: int) -> list[int]:
    """Greedy continuation via ``generate`` (KV cache), used to cross-check ``greedy_tokens``."""
    import torch

    with torch.no_grad():
        out = target.generate(
            torch.tensor([list(prompt)]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=PAD_ID,
        )
    return out[0, len(prompt) :].tolist()


@contextlib.contextmanager
def record_calls(module: torch.nn.Module) -> Iterator[list[tuple[dict[str, Any], Any]]]:
    """Record (kwargs, output) of every forward call of ``module``."""
    calls: list[tuple[dict[str, Any], Any]] = []

    def hook(_mod: Any, _args: Any, kwargs: dict[str, Any], output: Any) -> None:
        calls.append((dict(kwargs), output))

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def configure_assisted(assistant: PreTrainedModel, n_draft: int) -> None:
    """Fix HF's drafting length (no heuristic schedule)."""
    assistant.generation_config.num_assistant_tokens = n_draft
    assistant.generation_config.num_assistant_tokens_schedule = "constant"


def first_draft_round(
    target: PreTrainedModel, assistant: PreTrainedModel, prompt: Sequence[int], n_steps: int
) -> DraftRound:
    """Capture HF's own first drafting round (assisted ``generate``) and cross-check it.

    The assistant calls made by ``SinglePositionMultiTokenCandidateGenerator``
    are recorded with a forward hook; the hidden state ``h`` is taken from the
    first call's ``inputs_embeds`` (``concat(embed(x) * sqrt(H_t), h)``).
    """
    import torch

    configure_assisted(assistant, n_steps)
    h_t = target.config.hidden_size
    with record_calls(assistant) as calls, torch.no_grad():
        out = target.generate(
            torch.tensor([list(prompt)]),
            assistant_model=assistant,
            do_sample=False,
            max_new_tokens=n_steps + 2,
            pad_token_id=PAD_ID,
        )
    first = calls[:n_steps]
    if len(first) != n_steps:
        raise RuntimeError(f"expected {n_steps} assistant calls, saw {len(calls)}")
    x = int(out[0, len(prompt)])
    inputs0 = first[0][0]["inputs_embeds"][0, 0]
    h = inputs0[h_t:].float().numpy()
    tokens = [int(o.logits[0, -1].argmax()) for _, o in first]
    logits = np.stack([o.logits[0, -1].float().numpy() for _, o in first])
    projected = np.stack([o.last_hidden_state[0, -1].float().numpy() for _, o in first])
    positions = [int(kw["position_ids"].reshape(-1)[-1]) for kw, _ in first]

    # Cross-check: x's embedding in the input, and where h comes from.
    embed = target.get_input_embeddings()(torch.tensor([x]))[0]
    if not torch.equal(inputs0[:h_t], embed):
        raise RuntimeError("assistant input does not start with the scaled target embedding of x")
    with torch.no_grad():
        states = target(torch.tensor([list(prompt)]), output_hidden_states=True, use_cache=False)
    post = states.hidden_states[-1][0, -1]
    if not torch.allclose(post, inputs0[h_t:], atol=1e-5, rtol=1e-5):
        raise RuntimeError("h is not the target's hidden_states[-1] at the last prompt position")
    if positions != [len(prompt)] * n_steps:
        raise RuntimeError(f"draft positions {positions}, expected all {len(prompt)} (the position of x)")
    pre = _pre_norm_last_hidden(target, prompt)
    return DraftRound(
        prompt=list(prompt),
        x=x,
        h=h,
        h_pre_norm=pre,
        tokens=tokens,
        logits=logits,
        projected=projected,
        positions=positions,
    )


def _pre_norm_last_hidden(target: PreTrainedModel, prompt: Sequence[int]) -> np.ndarray:
    """The last prompt position's residual stream *before* the target's final RMSNorm."""
    import torch

    captured: list[torch.Tensor] = []
    handle = target.model.norm.register_forward_hook(lambda _m, args, _o: captured.append(args[0]))
    try:
        with torch.no_grad():
            target(torch.tensor([list(prompt)]), use_cache=False)
    finally:
        handle.remove()
    return captured[-1][0, -1].float().numpy()


def h_is_post_norm(target: PreTrainedModel, rounds: Sequence[DraftRound]) -> bool:
    """Whether HF's ``h`` equals the final-norm output (True) or the pre-norm stream (False)."""
    import torch

    norm = target.model.norm
    for rnd in rounds:
        with torch.no_grad():
            normed = norm(torch.from_numpy(rnd.h_pre_norm)[None]).numpy()[0]
        if not np.allclose(normed, rnd.h, atol=1e-5, rtol=1e-5):
            if np.allclose(rnd.h_pre_norm, rnd.h, atol=1e-5, rtol=1e-5):
                return False
            raise RuntimeError("h is neither the pre- nor the post-norm hidden state")
    return True


def draft_min_gap(rounds: Sequence[DraftRound]) -> float:
    """Smallest top-1/top-2 logit gap over all recorded draft steps."""
    gap = math.inf
    for rnd in rounds:
        for row in rnd.logits:
            top2 = np.sort(row)[-2:]
            gap = min(gap, float(top2[1] - top2[0]))
    return gap


@contextlib.contextmanager
def count_acceptance() -> Iterator[dict[str, int]]:
    """Count drafted and accepted tokens of HF's MTP candidate generator."""
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator as Gen

    stats = {"drafted": 0, "accepted": 0, "rounds": 0}
    original = Gen.update_candidate_strategy

    def update(self: Any, input_ids: Any, scores: Any, num_matches: int) -> None:
        stats["drafted"] += int(scores.shape[1]) - 1
        stats["accepted"] += int(num_matches)
        stats["rounds"] += 1
        original(self, input_ids, scores, num_matches)

    Gen.update_candidate_strategy = update  # type: ignore[method-assign]
    try:
        yield stats
    finally:
        Gen.update_candidate_strategy = original  # type: ignore[method-assign]


def measure_acceptance(
    target: PreTrainedModel,
    assistant: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    n_draft: int,
    n_new: int,
) -> tuple[float, int, int]:
    """Greedy assisted generation: per-draft acceptance over all prompts.

    Also checks that assisted output equals plain greedy output.
    """
    import torch

    configure_assisted(assistant, n_draft)
    with count_acceptance() as stats, torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)])
            kwargs = dict(max_new_tokens=n_new, do_sample=False, pad_token_id=PAD_ID)
            assisted = target.generate(ids, assistant_model=assistant, **kwargs)
            plain = target.generate(ids, **kwargs)
            if not torch.equal(assisted, plain):
                LOG.warning("assisted output differs from plain greedy for a prompt")
    drafted, accepted = stats["drafted"], stats["accepted"]
    return (accepted / drafted if drafted else 0.0), accepted, drafted


# ----------------------------------------------------------------------------
# Reference bundles
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class References:
    """Everything written to ``<name>-reference.npz``."""

    greedy_prompts: list[list[int]]
    greedy_texts: list[str]
    greedy: list[list[int]]
    greedy_min_gap: float
    tf_ids: list[list[int]] = dataclasses.field(default_factory=list)
    tf_texts: list[str] = dataclasses.field(default_factory=list)
    tf_logits: list[np.ndarray] = dataclasses.field(default_factory=list)
    drafts: list[DraftRound] = dataclasses.field(default_factory=list)
    draft_texts: list[str] = dataclasses.field(default_factory=list)
    h_post_norm: bool | None = None
    acceptance: dict[str, Any] | None = None


def greedy_references(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> References:
    """Greedy continuations of the fixed prompts."""
    prompts = [encode(tokenizer, text) for text in GREEDY_PROMPTS]
    outputs: list[list[int]] = []
    min_gap = math.inf
    for prompt in prompts:
        tokens, gap = greedy_tokens(target, prompt, N_GREEDY_TOKENS)
        outputs.append(tokens)
        min_gap = min(min_gap, gap)
    return References(
        greedy_prompts=prompts, greedy_texts=list(GREEDY_PROMPTS), greedy=outputs, greedy_min_gap=min_gap
    )


def robust_greedy_references(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> References:
    """Greedy continuations of the trained target, from prompts without near-ties.

    A trained model cannot be re-seeded, so the first ``len(GREEDY_PROMPTS)``
    prompts of ``TRAINED_PROMPT_POOL`` whose every greedy step has a top-1/top-2
    gap of at least ``MIN_TRAINED_GAP`` are kept (an F16 GGUF with an F16 KV
    cache moves logits by ~6e-3); failing that, the prompts with the largest gaps.
    """
    scored = []
    for text in TRAINED_PROMPT_POOL:
        prompt = encode(tokenizer, text)
        tokens, gap = greedy_tokens(target, prompt, N_GREEDY_TOKENS)
        if not FORBIDDEN_GREEDY_IDS.intersection(tokens):
            scored.append((text, prompt, tokens, gap))
    robust = [item for item in scored if item[3] >= MIN_TRAINED_GAP]
    if len(robust) < len(GREEDY_PROMPTS):
        LOG.warning("trained: only %d prompts with greedy gaps >= %.0e", len(robust), MIN_TRAINED_GAP)
        robust = sorted(scored, key=lambda item: -item[3])
    chosen = robust[: len(GREEDY_PROMPTS)]
    return References(
        greedy_prompts=[item[1] for item in chosen],
        greedy_texts=[item[0] for item in chosen],
        greedy=[item[2] for item in chosen],
        greedy_min_gap=min(item[3] for item in chosen),
    )


def full_references(
    target: PreTrainedModel, assistant: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> References:
    """Greedy tokens, teacher-forced logits and first-round drafts."""
    refs = greedy_references(target, tokenizer)
    for text in TEACHER_FORCED_TEXTS:
        ids = encode(tokenizer, text)[:MAX_TEACHER_FORCED_TOKENS]
        refs.tf_ids.append(ids)
        refs.tf_texts.append(text)
        refs.tf_logits.append(target_logits(target, ids))
    for text in DRAFT_PROMPTS:
        prompt = encode(tokenizer, text)
        if len(prompt) > MAX_DRAFT_PROMPT_TOKENS:
            raise RuntimeError(f"draft prompt {text!r} is {len(prompt)} tokens")
        refs.drafts.append(first_draft_round(target, assistant, prompt, N_DRAFT_STEPS))
        refs.draft_texts.append(text)
    refs.h_post_norm = h_is_post_norm(target, refs.drafts)
    return refs


def references_ok(refs: References) -> tuple[bool, str]:
    """Whether references are robust enough for exact comparisons (gaps, no EOG tokens)."""
    if refs.greedy_min_gap < MIN_TOP_GAP:
        return False, f"greedy gap {refs.greedy_min_gap:.2e}"
    for tokens in refs.greedy:
        if FORBIDDEN_GREEDY_IDS.intersection(tokens):
            return False, "greedy output contains a special token"
        if len(set(tokens)) < MIN_DISTINCT_GREEDY:
            return False, f"greedy output is repetitive ({len(set(tokens))} distinct tokens)"
    if refs.drafts:
        gap = draft_min_gap(refs.drafts)
        if gap < MIN_TOP_GAP:
            return False, f"draft gap {gap:.2e}"
    return True, "ok"


def save_references(refs: References, spec: FixtureSpec, extra: dict[str, Any]) -> None:
    """Write ``<name>-reference.npz`` and its ``.json`` sidecar."""
    arrays: dict[str, np.ndarray] = {}
    for i, (prompt, tokens) in enumerate(zip(refs.greedy_prompts, refs.greedy)):
        arrays[f"greedy{i}_prompt"] = np.asarray(prompt, dtype=np.int32)
        arrays[f"greedy{i}_tokens"] = np.asarray(tokens, dtype=np.int32)
    for i, (ids, logits) in enumerate(zip(refs.tf_ids, refs.tf_logits)):
        arrays[f"tf{i}_ids"] = np.asarray(ids, dtype=np.int32)
        arrays[f"tf{i}_logits"] = logits.astype(np.float32)
    for i, rnd in enumerate(refs.drafts):
        arrays[f"draft{i}_prompt"] = np.asarray(rnd.prompt, dtype=np.int32)
        arrays[f"draft{i}_x"] = np.asarray([rnd.x], dtype=np.int32)
        arrays[f"draft{i}_h"] = rnd.h.astype(np.float32)
        arrays[f"draft{i}_h_pre_norm"] = rnd.h_pre_norm.astype(np.float32)
        arrays[f"draft{i}_tokens"] = np.asarray(rnd.tokens, dtype=np.int32)
        arrays[f"draft{i}_logits"] = rnd.logits.astype(np.float32)
        arrays[f"draft{i}_projected"] = rnd.projected.astype(np.float32)
        arrays[f"draft{i}_positions"] = np.asarray(rnd.positions, dtype=np.int32)
    path = spec.reference_npz()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    sidecar = {
        "fixture": spec.name,
        "target_gguf": _rel(spec.target_gguf()),
        "assistant_gguf": _rel(spec.assistant_gguf()),
        "hf_target": _rel(spec.hf_target_dir()),
        "hf_assistant": _rel(spec.hf_assistant_dir()),
        "dtype": "float32 computation, eager attention",
        "greedy": {
            "count": len(refs.greedy),
            "n_tokens": N_GREEDY_TOKENS,
            "prompt_texts": refs.greedy_texts,
            "min_top_gap": refs.greedy_min_gap,
            "arrays": "greedy{i}_prompt [n] int32 (BOS first); greedy{i}_tokens [n_tokens] int32",
        },
        "teacher_forced": {
            "count": len(refs.tf_ids),
            "texts": refs.tf_texts,
            "arrays": "tf{i}_ids [n] int32; tf{i}_logits [n, vocab] float32: target logits "
            "(after final_logit_softcapping) at every position",
        },
        "drafts": {
            "count": len(refs.drafts),
            "n_steps": N_DRAFT_STEPS,
            "prompt_texts": refs.draft_texts,
            "h": (
                "target final hidden state AFTER the final RMSNorm (hidden_states[-1]) at the last prompt position"
                if refs.h_post_norm
                else "target hidden state BEFORE the final RMSNorm at the last prompt position"
            ),
            "arrays": {
                "draft{i}_prompt": "[n] int32 prompt ids (BOS first)",
                "draft{i}_x": "[1] int32 target greedy token after the prompt = assistant input token of step 0",
                "draft{i}_h": "[H_target] float32 h fed with x to draft step 0",
                "draft{i}_h_pre_norm": "[H_target] float32 same position before the target's final norm",
                "draft{i}_tokens": "[n_steps] int32 drafted ids (argmax of each step's logits)",
                "draft{i}_logits": "[n_steps, vocab] float32 assistant logits of each step as HF drafts "
                "with them (no softcap; centroid head: non-candidates filled with min(candidates) - 1)",
                "draft{i}_projected": "[n_steps, H_target] float32 post_projection(norm(out)) of each step "
                "(the h of the next step)",
                "draft{i}_positions": "[n_steps] int32 position ids HF uses for each step "
                "(all equal to len(prompt), the position of x)",
            },
        },
        **extra,
    }
    if refs.acceptance is not None:
        sidecar["acceptance"] = refs.acceptance
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    LOG.info("%s: wrote %s", spec.name, _rel(path))


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------
# Random fixtures
# ----------------------------------------------------------------------------


def build_random_pair(
    spec: FixtureSpec,
    tokenizer: PreTrainedTokenizerBase,
    fixed_target: PreTrainedModel | None,
) -> tuple[PreTrainedModel, PreTrainedModel, References, int]:
    """Draw random weights, re-seeding until the references are robust.

    With ``fixed_target`` only the assistant is re-drawn.
    """
    import torch

    for attempt in range(MAX_RESEEDS):
        seed = spec.seed + attempt
        target, assistant = build_models(dataclasses.replace(spec, seed=seed))
        gen = torch.Generator().manual_seed(seed)
        if fixed_target is None:
            randomize_weights(target, gen)
        else:
            target = fixed_target
        randomize_weights(assistant, gen)
        refs = full_references(target, assistant, tokenizer)
        ok, why = references_ok(refs)
        if ok:
            LOG.info("%s: seed %d accepted (greedy gap %.2e, draft gap %.2e)",
                     spec.name, seed, refs.greedy_min_gap, draft_min_gap(refs.drafts))
            return target, assistant, refs, seed
        LOG.info("%s: seed %d rejected: %s", spec.name, seed, why)
    raise RuntimeError(f"{spec.name}: no acceptable seed in {MAX_RESEEDS} tries")


def save_hf(model: PreTrainedModel, tokenizer_dir: Path, out_dir: Path, fp16: bool = False) -> None:
    """Save a checkpoint (config + safetensors) and copy the tokenizer files beside it."""
    import torch

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    to_save = model
    if fp16:
        to_save = model.to(torch.float16)
    to_save.save_pretrained(out_dir, safe_serialization=True)
    if fp16:
        model.to(torch.float32)
    (out_dir / "generation_config.json").unlink(missing_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, out_dir / name)
    _normalise_config(out_dir / "config.json")


def _normalise_config(path: Path) -> None:
    """Drop volatile keys (library version, attention backend) so that regenerations diff cleanly."""
    config = json.loads(path.read_text())
    for key in ("transformers_version", "_attn_implementation_autoset"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def make_random_fixture(
    spec: FixtureSpec,
    tokenizer: PreTrainedTokenizerBase,
    tokenizer_dir: Path,
    targets: dict[str, PreTrainedModel],
) -> None:
    """Build, save and reference one random pair."""
    fixed = targets.get(spec.target_from) if spec.target_from else None
    if spec.target_from and fixed is None:
        fixed = load_hf_target(spec.hf_target_dir())
    target, assistant, refs, seed = build_random_pair(spec, tokenizer, fixed)
    targets[spec.name] = target
    if spec.target_from is None:
        save_hf(target, tokenizer_dir, spec.hf_target_dir())
    save_hf(assistant, tokenizer_dir, spec.hf_assistant_dir())
    _check_generate_matches(target, refs)
    save_references(refs, spec, {"seed": seed, "kind": "random"})


def _check_generate_matches(target: PreTrainedModel, refs: References) -> None:
    """HF ``generate`` (with KV cache) must agree with the recomputed greedy reference."""
    for prompt, tokens in zip(refs.greedy_prompts, refs.greedy):
        cached = greedy_with_generate(target, prompt, len(tokens))
        if cached != tokens:
            raise RuntimeError("generate() with cache disagrees with full-recompute greedy")


def load_hf_target(path: Path) -> PreTrainedModel:
    """Load a stored target checkpoint in float32 with eager attention."""
    import torch
    from transformers import Gemma4ForCausalLM

    return Gemma4ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def load_hf_assistant(path: Path) -> PreTrainedModel:
    """Load a stored assistant checkpoint in float32 with eager attention."""
    import torch
    from transformers import Gemma4AssistantForCausalLM

    return Gemma4AssistantForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


# ----------------------------------------------------------------------------
# Trained pair
# ----------------------------------------------------------------------------


def token_stream(tokenizer: PreTrainedTokenizerBase, corpus: Sequence[str]) -> np.ndarray:
    """Concatenate ``BOS + tokens`` of every file into one int32 array."""
    pieces = [np.asarray(tokenizer(text).input_ids, dtype=np.int32) for text in corpus]
    return np.concatenate(pieces)


def sample_batch(data: np.ndarray, gen: np.random.Generator, batch: int, seq_len: int) -> torch.Tensor:
    """Random contiguous windows of ``seq_len + 1`` tokens."""
    import torch

    starts = gen.integers(0, len(data) - seq_len - 1, size=batch)
    return torch.from_numpy(np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64))


def cosine_lr(step: int, total: int, peak: float, warmup: int = 50) -> float:
    """Linear warm-up then cosine decay to 10% of ``peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def train_target(
    target: PreTrainedModel, data: np.ndarray, val: np.ndarray, settings: TrainSettings, seed: int
) -> float:
    """Train the target as a causal LM for ``settings.target_steps`` steps; returns val perplexity."""
    import torch

    gen = np.random.default_rng(seed)
    target.train()
    opt = torch.optim.AdamW(target.parameters(), lr=settings.target_lr, weight_decay=0.01, betas=(0.9, 0.95))
    total = settings.target_steps
    LOG.info("trained: target %d params, %d steps", _n_params(target), total)
    start = time.perf_counter()
    for step in range(total):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, total, settings.target_lr)
        loss = _target_step(target, opt, sample_batch(data, gen, settings.batch, settings.seq_len))
        if step % 100 == 0 or step == total - 1:
            LOG.info("trained: target step %d/%d loss %.3f (%.0fs)", step, total, loss, time.perf_counter() - start)
    target.eval()
    return evaluate_perplexity(target, val, settings.seq_len)


def _target_step(target: PreTrainedModel, opt: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """One next-token cross-entropy step on ``batch`` [B, L+1]; returns the loss."""
    import torch

    logits = target(batch[:, :-1], use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _n_params(model: PreTrainedModel) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters())


def evaluate_perplexity(target: PreTrainedModel, val: np.ndarray, seq_len: int) -> float:
    """Perplexity on consecutive held-out windows."""
    import torch

    losses = []
    with torch.no_grad():
        for start in range(0, len(val) - seq_len - 1, seq_len * 8):
            window = torch.from_numpy(val[start : start + seq_len + 1].astype(np.int64))[None]
            logits = target(window[:, :-1], use_cache=False).logits
            losses.append(float(torch.nn.functional.cross_entropy(logits[0], window[0, 1:])))
    return float(math.exp(sum(losses) / len(losses)))


def distill_assistant(
    target: PreTrainedModel,
    assistant: PreTrainedModel,
    data: np.ndarray,
    settings: TrainSettings,
    seed: int,
) -> None:
    """Distil the assistant from the frozen target with a few draft steps unrolled.

    For every position ``t`` of a window the target provides ``h_t`` (its final
    hidden state, as HF feeds it) and the K/V of its last sliding/full layers.
    Draft step ``k`` (k = 0..K-1) sees token ``x_{t+1+k}`` (the ground truth
    continuation, which greedy decoding mostly follows), the previous step's
    projected state (``h_t`` for step 0), and the position ``t + 1``; it is
    trained to match the target's next-token distribution at ``t + 1 + k`` (KL).
    The K/V visible to the query at ``t`` is masked to positions <= t (and
    within the sliding window), as during drafting.
    """
    import torch

    gen = np.random.default_rng(seed)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    assistant.train()
    opt = torch.optim.AdamW(assistant.parameters(), lr=settings.assistant_lr, weight_decay=0.01, betas=(0.9, 0.95))
    seq_len = settings.seq_len
    total = settings.assistant_steps
    LOG.info("trained: assistant %d params, %d steps", _n_params(assistant), total)
    start = time.perf_counter()
    for step in range(total):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, total, settings.assistant_lr)
        batch = sample_batch(data, gen, settings.batch // 2, seq_len + settings.draft_steps)
        loss = _distill_step(target, assistant, opt, batch, settings)
        if step % 50 == 0 or step == total - 1:
            LOG.info("trained: assistant step %d/%d KL %.3f (%.0fs)", step, total, loss, time.perf_counter() - start)
    assistant.eval()


def _distill_step(
    target: PreTrainedModel,
    assistant: PreTrainedModel,
    opt: torch.optim.Optimizer,
    batch: torch.Tensor,
    settings: TrainSettings,
) -> float:
    """One distillation step (see ``distill_assistant``); returns the mean KL per draft step."""
    import torch
    import torch.nn.functional as F

    steps = settings.draft_steps
    n = batch.shape[1] - steps  # context positions t = 0..n-1 (each drafts t+1 .. t+steps)
    with torch.no_grad():
        out = target(batch, use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
        probs = F.log_softmax(out.logits.float(), dim=-1)  # [B, n+steps, V]
        hidden = out.hidden_states[-1][:, : n - 1]  # h_t for t = 0..n-2
        shared = {k: (v[0][:, :, : n - 1], v[1][:, :, : n - 1]) for k, v in out.shared_kv_states.items()}
        embed = target.get_input_embeddings()
    b, m = hidden.shape[:2]  # m queries: t = 0..n-2
    positions = torch.arange(1, m + 1)[None].expand(b, m)  # x_{t+1} sits at position t+1
    masks = _distill_masks(assistant, m, b)
    h = hidden
    loss = torch.zeros(())
    for k in range(steps):
        tokens = batch[:, 1 + k : 1 + k + m]
        inputs = torch.cat([embed(tokens), h], dim=-1)
        pre = assistant.pre_projection(inputs)
        # output_hidden_states=True stops Gemma4TextModel from slicing all-KV-shared layers
        # down to the last query (its generate-time optimisation), which would crash here.
        res = assistant.model(
            inputs_embeds=pre,
            attention_mask=masks,
            position_ids=positions,
            shared_kv_states=shared,
            use_cache=False,
            output_hidden_states=True,
        )
        last = res.last_hidden_state
        logits = assistant.lm_head(last)
        teacher = probs[:, 1 + k : 1 + k + m]
        loss = loss + F.kl_div(F.log_softmax(logits, dim=-1), teacher, log_target=True, reduction="batchmean") / m
        h = assistant.post_projection(last)
    loss = loss / steps
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(assistant.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _distill_masks(assistant: PreTrainedModel, m: int, batch: int) -> dict[str, torch.Tensor]:
    """Additive masks: query t sees target K/V at positions <= t (sliding: the last W of them)."""
    import torch

    window = assistant.config.get_text_config().sliding_window
    q = torch.arange(m)[:, None]
    k = torch.arange(m)[None, :]
    causal = k <= q
    sliding = causal & (q - k < window)
    neg = torch.finfo(torch.float32).min

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(m, m).masked_fill(~allowed, neg)
        return mask[None, None].expand(batch, 1, m, m)

    return {FULL: additive(causal), SLIDING: additive(sliding)}


def round_to_fp16(model: PreTrainedModel) -> None:
    """Round every weight to fp16 precision (kept as float32) so HF and the F16 GGUF agree."""
    import torch

    with torch.no_grad():
        for name, tensor in _named_tensors(model):
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(torch.float16).to(torch.float32))


def make_trained_fixture(
    spec: FixtureSpec, tokenizer: PreTrainedTokenizerBase, tokenizer_dir: Path, settings: TrainSettings
) -> None:
    """Train the target, distil the assistant, save both, record greedy references and acceptance."""
    import torch

    corpus = load_corpus()
    stream = token_stream(tokenizer, corpus)
    split = len(stream) - settings.val_tokens
    data, val = stream[:split], stream[split:]
    LOG.info("trained: %d training tokens, %d held out", len(data), len(val))
    target, assistant = build_models(spec)
    gen = torch.Generator().manual_seed(spec.seed)
    _init_for_training(target, gen)
    _init_for_training(assistant, gen)
    ppl = train_target(target, data, val, settings, spec.seed)
    LOG.info("trained: target val perplexity %.2f", ppl)
    round_to_fp16(target)
    distill_assistant(target, assistant, data, settings, spec.seed + 1)
    round_to_fp16(assistant)
    save_hf(target, tokenizer_dir, spec.hf_target_dir(), fp16=True)
    save_hf(assistant, tokenizer_dir, spec.hf_assistant_dir(), fp16=True)
    trained_references(spec, tokenizer, {"kind": "trained", "val_perplexity": round(ppl, 3), "seed": spec.seed})


def trained_references(spec: FixtureSpec, tokenizer: PreTrainedTokenizerBase, extra: dict[str, Any]) -> None:
    """Greedy references and HF acceptance of the stored (fp16-rounded) trained pair."""
    target = load_hf_target(spec.hf_target_dir())
    assistant = load_hf_assistant(spec.hf_assistant_dir())
    refs = robust_greedy_references(target, tokenizer)
    prompts = [encode(tokenizer, text) for text in GREEDY_PROMPTS + TEACHER_FORCED_TEXTS + DRAFT_PROMPTS]
    acceptance: dict[str, Any] = {"n_new_tokens": 64, "prompts": len(prompts)}
    for n_draft in (1, 2, 3, 4):
        rate, accepted, drafted = measure_acceptance(target, assistant, prompts, n_draft, 64)
        acceptance[f"n_draft_{n_draft}"] = {"rate": round(rate, 4), "accepted": accepted, "drafted": drafted}
        LOG.info("trained: HF acceptance with %d drafts: %.1f%% (%d/%d)", n_draft, 100 * rate, accepted, drafted)
    refs.acceptance = acceptance
    save_references(refs, spec, extra)


def _init_for_training(model: PreTrainedModel, gen: torch.Generator) -> None:
    """Standard initialisation for training: norms 1, layer_scalar 1, small normal weights."""
    import torch

    with torch.no_grad():
        for name, tensor in _named_tensors(model):
            if name.endswith("token_ordering"):
                tensor.copy_(torch.arange(tensor.numel()))
            elif name.endswith("layer_scalar") or "norm" in name:
                tensor.fill_(1.0)
            elif name.endswith("embed_tokens.weight"):
                _fill(tensor, gen, 1.0 / math.sqrt(tensor.shape[1]))
            elif tensor.dim() == 2:
                _fill(tensor, gen, 1.0 / math.sqrt(tensor.shape[1]))


# ----------------------------------------------------------------------------
# GGUF conversion and inspection (no torch needed on our side)
# ----------------------------------------------------------------------------


def convert(hf_dir: Path, out: Path, outtype: str, llama_src: Path) -> None:
    """Run upstream's ``convert_hf_to_gguf.py`` on ``hf_dir``."""
    script = llama_src / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} not found (pass --llama-src)")
    env = dict(os.environ, PYTHONPATH=str(llama_src / "gguf-py"))
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(script), str(hf_dir), "--outfile", str(out), "--outtype", outtype]
    LOG.info("convert: %s -> %s (%s)", _rel(hf_dir), _rel(out), outtype)
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"conversion of {hf_dir} failed:\n{result.stdout}\n{result.stderr}")


def _import_gguf(llama_src: Path) -> Any:
    """Import the pinned gguf-py (not any installed copy)."""
    path = str(llama_src / "gguf-py")
    if path not in sys.path:
        sys.path.insert(0, path)
    import gguf

    return gguf


def inspect_gguf(path: Path, llama_src: Path, role: str, spec: FixtureSpec) -> dict[str, Any]:
    """Read a GGUF with the pinned gguf-py and check architecture, tensor names and tokenizer keys."""
    gguf = _import_gguf(llama_src)
    reader = gguf.GGUFReader(path)

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    names = {t.name for t in reader.tensors}
    expected_arch = "gemma4" if role == "target" else "gemma4-assistant"
    if arch != expected_arch:
        raise RuntimeError(f"{path}: architecture {arch!r}, expected {expected_arch!r}")
    required, forbidden = _expected_tensors(role, spec)
    if missing := sorted(required - names):
        raise RuntimeError(f"{path}: missing tensors {missing}")
    if unexpected := sorted(forbidden & names):
        raise RuntimeError(f"{path}: unexpected tensors {unexpected}")
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    if len(tokens) != VOCAB_SIZE or field("tokenizer.ggml.eos_token_id") != EOS_ID:
        raise RuntimeError(f"{path}: unexpected vocab size or EOS id")
    control = gguf.TokenType.CONTROL
    for text in ("<eos>", START_OF_TURN, END_OF_TURN):
        if types[tokens.index(text)] != control:
            raise RuntimeError(f"{path}: {text} is not a control token")
    if field("tokenizer.chat_template") is None:
        raise RuntimeError(f"{path}: no chat template")
    info: dict[str, Any] = {"arch": arch, "tensors": len(names), "bytes": path.stat().st_size}
    if role == "target":
        info["final_logit_softcapping"] = field(f"{arch}.final_logit_softcapping")
        if info["final_logit_softcapping"] != 30.0:
            raise RuntimeError(f"{path}: final_logit_softcapping is {info['final_logit_softcapping']}")
    else:
        info["centroid_tensors"] = sorted(n for n in names if "masked_embd" in n)
        if spec.assistant.centroids and not info["centroid_tensors"]:
            LOG.warning("%s: no centroid-head tensors (upstream's converter drops masked_embedding.*)", _rel(path))
        for tensor in reader.tensors:
            if "masked_embd" in tensor.name and "ordering" in tensor.name:
                ordering = np.asarray(tensor.data).reshape(-1)
                if sorted(ordering.tolist()) != list(range(VOCAB_SIZE)):
                    raise RuntimeError(f"{path}: {tensor.name} is not a permutation of the vocabulary")
    return info


def _expected_tensors(role: str, spec: FixtureSpec) -> tuple[set[str], set[str]]:
    """(required, forbidden) tensor names for upstream's conversion of this model."""
    required = {"token_embd.weight", "output_norm.weight", "rope_freqs.weight"}
    forbidden: set[str] = set()
    if role == "assistant":
        required |= {"nextn.pre_projection.weight", "nextn.post_projection.weight"}
        for i in range(len(spec.assistant.layer_types)):
            required |= {f"blk.{i}.{t}.weight" for t in ("attn_q", "attn_output", "layer_output_scale")}
            forbidden |= {f"blk.{i}.{t}.weight" for t in ("attn_k", "attn_v")}
        return required, forbidden
    target = spec.target
    n_with_kv = len(target.layer_types) - target.kv_shared_layers
    for i, kind in enumerate(target.layer_types):
        required |= {f"blk.{i}.{t}.weight" for t in ("attn_q", "attn_output", "layer_output_scale")}
        has_kv = i < n_with_kv
        has_v = has_kv and not (target.k_eq_v and kind == FULL)
        (required if has_kv else forbidden).add(f"blk.{i}.attn_k.weight")
        (required if has_v else forbidden).add(f"blk.{i}.attn_v.weight")
    if target.per_layer_hidden:
        required |= {"per_layer_token_embd.weight", "per_layer_model_proj.weight"}
    return required, forbidden


def convert_fixture(spec: FixtureSpec, llama_src: Path, done: set[Path]) -> dict[str, Any]:
    """Convert (once) and inspect the target and assistant GGUFs of one fixture."""
    summary: dict[str, Any] = {}
    for role, hf_dir, out in (
        ("target", spec.hf_target_dir(), spec.target_gguf()),
        ("assistant", spec.hf_assistant_dir(), spec.assistant_gguf()),
    ):
        if out not in done:
            convert(hf_dir, out, spec.gguf_outtype, llama_src)
            done.add(out)
        summary[role] = inspect_gguf(out, llama_src, role, spec)
    return summary


# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(FIXTURES), metavar="NAME",
                        help=f"fixtures to (re)build, from {', '.join(FIXTURES)}")
    parser.add_argument("--skip-train", action="store_true", help="skip the trained pair")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--convert-only", action="store_true",
                      help="only re-run GGUF conversion from the stored HF checkpoints")
    mode.add_argument("--references-only", action="store_true",
                      help="recompute the HF references from the stored HF checkpoints (no re-seeding, no training)")
    parser.add_argument("--llama-src", type=Path, default=None,
                        help=f"llama.cpp source tree (default: <repo>/{DEFAULT_LLAMA_SRC})")
    parser.add_argument("--train-steps", type=int, nargs=2, default=None, metavar=("TARGET", "ASSISTANT"),
                        help="optimizer steps of the trained pair (default %d %d)"
                        % (TrainSettings.target_steps, TrainSettings.assistant_steps))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: results can depend on it; oversubscribed cores make 2 slower)")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def selected_fixtures(args: argparse.Namespace) -> list[FixtureSpec]:
    """The fixtures to process, those reusing another's target last."""
    names = args.only or list(FIXTURES)
    specs = [FIXTURES[n] for n in names if not (args.skip_train and FIXTURES[n].trained)]
    return sorted(specs, key=lambda s: s.target_from is not None)


def setup_torch(threads: int) -> None:
    """Deterministic CPU torch."""
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def generate(specs: Sequence[FixtureSpec], args: argparse.Namespace) -> None:
    """Build HF checkpoints and references for ``specs`` (needs torch)."""
    setup_torch(args.threads)
    tokenizer_dir = Path(tempfile.mkdtemp(prefix="mtp-fixtures-tokenizer-"))
    tokenizer = make_tokenizer(tokenizer_dir)
    targets: dict[str, PreTrainedModel] = {}
    settings = TrainSettings()
    if args.train_steps:
        settings = dataclasses.replace(settings, target_steps=args.train_steps[0], assistant_steps=args.train_steps[1])
    for spec in specs:
        if spec.trained:
            make_trained_fixture(spec, tokenizer, tokenizer_dir, settings)
        else:
            make_random_fixture(spec, tokenizer, tokenizer_dir, targets)


def recompute_references(specs: Sequence[FixtureSpec], args: argparse.Namespace) -> None:
    """Recompute references from the stored checkpoints, keeping the sidecars' provenance keys."""
    from transformers import AutoTokenizer

    setup_torch(args.threads)
    for spec in specs:
        tokenizer = AutoTokenizer.from_pretrained(spec.hf_target_dir())
        sidecar = spec.reference_npz().with_suffix(".json")
        previous = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
        extra = {k: previous[k] for k in ("kind", "seed", "val_perplexity") if k in previous}
        if spec.trained:
            trained_references(spec, tokenizer, extra)
            continue
        target = load_hf_target(spec.hf_target_dir())
        assistant = load_hf_assistant(spec.hf_assistant_dir())
        refs = full_references(target, assistant, tokenizer)
        ok, why = references_ok(refs)
        if not ok:
            LOG.warning("%s: stored checkpoint no longer gives robust references: %s", spec.name, why)
        _check_generate_matches(target, refs)
        save_references(refs, spec, extra)


def main(argv: Sequence[str] | None = None) -> int:
    """Generate (or recompute / re-convert), then convert and check every selected fixture."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    llama_src = (args.llama_src or REPO_ROOT / DEFAULT_LLAMA_SRC).resolve()
    specs = selected_fixtures(args)
    if args.references_only:
        recompute_references(specs, args)
    elif not args.convert_only:
        generate(specs, args)
    converted: set[Path] = set()
    summary = {spec.name: convert_fixture(spec, llama_src, converted) for spec in specs}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
