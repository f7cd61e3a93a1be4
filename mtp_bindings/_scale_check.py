"""``scale-pair --check``: run the trained pair and a scaled pair side by side and report how far
apart they are (target logits on the trained vocabulary, greedy tokens, first-round drafts of the
dense and centroid heads, MTP generations with their acceptance per draft position, the largest
padding-token probability). Quantized files are compared too, but only their padding-token
probability must pass: quantization changes the function (the trained pair's own q8_0 / q4_K
differ from its f16 by 0.22 / 2.0 in logits on the same prompts)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _scale_tensors as st
from .api import Model
from .models import ASSISTANT, TARGET

PROMPTS = (
    "def main(argv):\n",
    "import os\nimport sys\n",
    "class Queue:\n    def __init__(self):",
    "    return self._data[key]\n",
    "for i in range(10):\n    print(i)\n",
    "from collections import",
)
N_GREEDY = 24
N_DRAFT = 4
#: MTP generations compared (tokens and acceptance per draft position): prompts, tokens, drafts.
N_GEN_PROMPTS, N_GEN_TOKENS, N_GEN_DRAFT = 3, 32, 3
#: f16 tolerance on target logits (same weights; only accumulation order, rounding of the rescaled
#: norm outputs to f16 and RoPE angles computed for wider heads differ); measured ~1e-3.
LOGIT_TOL = 2e-2
PAD_PROB_MAX = 1e-6


@dataclass
class Run:
    """Greedy continuation of one prompt: its tokens and the logits of every position."""

    tokens: list[int]
    logits: np.ndarray  # [n_prompt + n_greedy, n_vocab]
    h: np.ndarray       # hidden state after the prompt (the first draft round's h_prev)
    drafts: dict[str, list[int]] = field(default_factory=dict)
    h_last: dict[str, np.ndarray] = field(default_factory=dict)
    generated: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)  # tokens, accepted per position


def greedy_run(ctx: Any, prompt: list[int], n: int) -> Run:
    """Decode ``prompt`` (all logits), then ``n`` greedy tokens one at a time."""
    ctx.clear()
    ctx.decode(prompt, pos=0, logits="all")
    rows = list(ctx.get_logits_all())
    h = ctx.get_embeddings(-1)
    out: list[int] = []
    for _ in range(n):
        tok = int(np.argmax(rows[-1]))
        out.append(tok)
        ctx.decode([tok])
        rows.append(ctx.get_logits(-1))
    return Run(out, np.stack(rows), h)


def first_drafts(ctx: Any, prompt: list[int], n_steps: int) -> tuple[list[int], np.ndarray]:
    """The first MTP round after ``prompt``: drafts and the last step's projected h."""
    ctx.clear()
    ctx.decode(prompt, pos=0)
    x = int(np.argmax(ctx.get_logits(-1)))
    drafts, h_last = ctx.decode_mtp(attn_pos=len(prompt) - 1, last_token=x, h_prev=ctx.get_embeddings(-1),
                                    n_steps=n_steps)
    return [int(d) for d in drafts], h_last


def pad_probability(logits: np.ndarray, n_real: int) -> float:
    """Largest probability of any token id >= ``n_real`` over the rows of ``logits``."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return float(p[:, n_real:].max()) if logits.shape[1] > n_real else 0.0


def check(pair: Any, config: Any, wtype: str = "f16", *, target: Path | None = None,
          assistant: Path | None = None, n_threads: int | None = None) -> dict[str, Any]:
    """Compare the trained pair with ``pair``'s ``wtype`` files; returns the figures and ``ok``.
    ``pair`` is a :class:`~mtp_bindings.scale_pair.ScaledPair` and ``config`` its ``ScaleConfig``
    (typed loosely: scale_pair imports this module, so importing it back would be a cycle)."""
    start = time.perf_counter()
    src_t = target or TARGET
    src_a = assistant or ASSISTANT
    runs: dict[str, list[Run]] = {}
    small_vocab = 0
    p = 0
    for name, t_path, heads in (("small", src_t, {"dense": src_a}),
                                ("scaled", pair.target[wtype], {"dense": pair.dense[wtype],
                                                                "centroid": pair.centroid[wtype]})):
        with Model(t_path) as m, m.create_context(n_ctx=256, embeddings=True, n_threads=n_threads) as ctx:
            if name == "small":
                small_vocab, prompts = m.n_vocab, [m.tokenize(text) for text in PROMPTS]
                p = st.feature_dim(m.n_embd, config.hidden)
            runs[name] = [greedy_run(ctx, pr, N_GREEDY) for pr in prompts]
        for head, a_path in heads.items():
            with Model(t_path, assistant=a_path) as m, m.create_context(n_ctx=256, embeddings=True,
                                                                        n_threads=n_threads) as ctx:
                for run, pr in zip(runs[name], prompts):
                    run.drafts[head], run.h_last[head] = first_drafts(ctx, pr, N_DRAFT)
                for run, pr in zip(runs[name][:N_GEN_PROMPTS], prompts):
                    res = m.generate(pr, max_tokens=N_GEN_TOKENS, temperature=0.0, draft_n_max=N_GEN_DRAFT,
                                     context=ctx)
                    run.generated[head] = (list(res.tokens), list(res.stats.accepted_per_position))
    report = compare(runs["small"], runs["scaled"], small_vocab, p)
    report.update(type=wtype, files={str(x): x.stat().st_size for x in (pair.target[wtype], pair.centroid[wtype],
                                                                          pair.dense[wtype])},
                  seconds=round(time.perf_counter() - start, 1))
    strict = wtype == "f16"  # quantized weights change the function: their figures are reported only
    report["ok"] = report["max_pad_prob"] <= PAD_PROB_MAX and (not strict or (
        report["max_logit_diff"] <= LOGIT_TOL and report["greedy_equal"] == report["prompts"]
        and all(v == report["prompts"] for v in report["drafts_equal"].values())
        and all(v == N_GEN_PROMPTS for v in report["mtp_generation_equal"].values())))
    return report


def compare(small: list[Run], big: list[Run], n_real: int, p: int) -> dict[str, Any]:
    """Figures of one comparison (logit differences over the common greedy prefix)."""
    diffs, pads, feats, greedy = [], [], [], 0
    drafts = {"dense": 0, "centroid": 0}
    gens = {"dense": 0, "centroid": 0}
    for s, b in zip(small, big):
        n_same = next((i for i, (x, y) in enumerate(zip(s.tokens, b.tokens)) if x != y), len(s.tokens))
        greedy += n_same == len(s.tokens)
        # rows computed from the same history: the prompt's and those after each shared greedy token
        # (the row after the first different token is not comparable)
        rows = s.logits.shape[0] - len(s.tokens) + n_same + (n_same == len(s.tokens))
        diffs.append(float(np.abs(s.logits[:rows] - b.logits[:rows, :n_real]).max()))
        pads.append(pad_probability(b.logits, n_real))
        feats.append(float(b.h[p]))
        for head in drafts:
            drafts[head] += b.drafts[head] == s.drafts["dense"]
            if head in b.generated:
                gens[head] += b.generated[head] == s.generated["dense"]
    return {"prompts": len(small), "max_logit_diff": max(diffs), "greedy_equal": greedy,
            "max_pad_prob": max(pads), "drafts_equal": drafts, "mtp_generation_equal": gens,
            "feature_h_p": [min(feats), max(feats)],
            "feature_assistant": {h: [float(b.h_last[h][p]) for b in big] for h in drafts}}


def format_report(r: dict[str, Any]) -> str:
    n = r["prompts"]
    lines = [
        f"check ({r['type']} vs the trained pair, {n} prompts, {N_GREEDY} greedy tokens, {N_DRAFT} drafts):",
        f"  max |logit difference| on the trained vocabulary: {r['max_logit_diff']:.3g}",
        f"  greedy tokens identical: {r['greedy_equal']}/{n}",
        f"  first-round drafts identical: dense {r['drafts_equal']['dense']}/{n}, "
        f"centroid {r['drafts_equal']['centroid']}/{n}",
        f"  MTP generations ({N_GEN_TOKENS} tokens, {N_GEN_DRAFT} drafts) with identical tokens and acceptance "
        f"per position: dense {r['mtp_generation_equal']['dense']}/{N_GEN_PROMPTS}, "
        f"centroid {r['mtp_generation_equal']['centroid']}/{N_GEN_PROMPTS}",
        f"  largest padding-token probability: {r['max_pad_prob']:.3g}",
        f"  feature h'[p] range: {r['feature_h_p'][0]:.3g} .. {r['feature_h_p'][1]:.3g}",
        f"  took {r['seconds']} s: {'OK' if r['ok'] else 'FAILED'}",
    ]
    return "\n".join(lines)
