"""``scale-pair --check``: run the trained pair and a scaled pair side by side and report how far
apart they are (target logits on the trained vocabulary, greedy tokens, first-round drafts of the
dense and centroid heads, MTP generations with their acceptance per draft position, the largest
padding-token probability). Quantized files are compared too, but only their padding-token
probability must pass: quantization changes the function (the trained pair's own q8_0 / q4_K
differ from its f16 by 0.22 / 2.0 in logits on the same prompts).

The two pairs round differently, so they are compared as two computations are
(:mod:`.generation.agreement`): logits teacher-forced (the scaled target fed the trained one's greedy
tokens, every row compared), greedy tokens and drafts identical or parted first at a near-tie for
``LOGIT_TOL`` on the trained pair's row, acceptance per draft position only where the tokens are identical."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import tensors as st
from ..api import Model
from ..generation.agreement import compare_greedy
from ..models import ASSISTANT, TARGET

PROMPTS = (
    "def main(argv):\n",
    "import os\nimport sys\n",
    "class Queue:\n    def __init__(self):",
    "    return self._data[key]\n",
    "for i in range(10):\n    print(i)\n",
    "from collections import",
)
N_GREEDY = 32
N_DRAFT = 4
#: MTP generations compared (tokens and acceptance per draft position): prompts, tokens, drafts.
N_GEN_PROMPTS, N_GEN_TOKENS, N_GEN_DRAFT = 3, N_GREEDY, 3
#: f16 tolerance on target logits (same weights; only accumulation order, rounding of the rescaled
#: norm outputs to f16 and RoPE angles computed for wider heads differ). What it was measured against, per
#: CPU variant: tests/numerics.py "scaled_vs_trained" (test_scale_pair.py checks the two are one value);
#: a construction error moves logits by 0.1-10.
LOGIT_TOL = 2.5e-2
PAD_PROB_MAX = 1e-6


@dataclass
class Run:
    """Greedy continuation of one prompt: its tokens and the logits of every position."""

    tokens: list[int]
    logits: np.ndarray  # [n_prompt + n_greedy, n_vocab]
    h: np.ndarray       # hidden state after the prompt (the first draft round's h_prev)
    drafts: dict[str, list[int]] = field(default_factory=dict)
    h_last: dict[str, np.ndarray] = field(default_factory=dict)
    draft_logits: dict[str, np.ndarray] = field(default_factory=dict)  # [N_DRAFT, n_vocab] per head
    forced: np.ndarray | None = None  # the logits with the other pair's greedy tokens fed (teacher forcing)
    generated: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)  # tokens, accepted per position


def greedy_run(ctx: Any, prompt: list[int], n: int, forced: list[int] | None = None) -> Run:
    """Decode ``prompt`` (all logits), then ``n`` greedy tokens one at a time; with ``forced``, those
    tokens instead of the greedy ones (teacher forcing: another run's history, every row comparable)."""
    ctx.clear()
    ctx.decode(prompt, pos=0, logits="all")
    rows = list(ctx.get_logits_all())
    h = ctx.get_embeddings(-1)
    out: list[int] = []
    for i in range(n if forced is None else len(forced)):
        tok = int(np.argmax(rows[-1])) if forced is None else forced[i]
        out.append(tok)
        ctx.decode([tok])
        rows.append(ctx.get_logits(-1))
    return Run(out, np.stack(rows), h)


def first_drafts(ctx: Any, prompt: list[int], n_steps: int,
                 x: int | None = None) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The first MTP round after ``prompt``: drafts, the last step's projected h and each step's
    logits. ``x``: the token to draft after (default: the target's greedy one; pass another run's to
    compare two assistants on one history)."""
    ctx.clear()
    ctx.decode(prompt, pos=0)
    if x is None:
        x = int(np.argmax(ctx.get_logits(-1)))
    drafts, h_last, logits = ctx.decode_mtp(attn_pos=len(prompt) - 1, last_token=x, h_prev=ctx.get_embeddings(-1),
                                            n_steps=n_steps, return_logits=True)
    return [int(d) for d in drafts], h_last, np.asarray(logits)


def pad_probability(logits: np.ndarray, n_real: int) -> float:
    """Largest probability of any token id >= ``n_real`` over the rows of ``logits``."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return float(p[:, n_real:].max()) if logits.shape[1] > n_real else 0.0


def check(pair: Any, config: Any, wtype: str = "f16", *, target: Path | None = None,
          assistant: Path | None = None, n_threads: int | None = None) -> dict[str, Any]:
    """Compare the trained pair with ``pair``'s ``wtype`` files; returns the figures and ``ok``.
    ``pair`` is a :class:`~mtp_bindings.scale_pair.build.ScaledPair` and ``config`` its ``ScaleConfig``
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
            if name == "scaled":  # teacher forcing: the trained target's tokens fed to the scaled one
                for run, ref, pr in zip(runs[name], runs["small"], prompts):
                    run.forced = greedy_run(ctx, pr, 0, forced=ref.tokens).logits
        for head, a_path in heads.items():
            with Model(t_path, assistant=a_path) as m, m.create_context(n_ctx=256, embeddings=True,
                                                                        n_threads=n_threads) as ctx:
                for run, ref, pr in zip(runs[name], runs["small"], prompts):
                    # both assistants draft after the trained target's first token
                    run.drafts[head], run.h_last[head], run.draft_logits[head] = first_drafts(
                        ctx, pr, N_DRAFT, x=ref.tokens[0])
                for run, pr in zip(runs[name][:N_GEN_PROMPTS], prompts):
                    res = m.generate(pr, max_tokens=N_GEN_TOKENS, temperature=0.0, draft_n_max=N_GEN_DRAFT,
                                     context=ctx)
                    run.generated[head] = (list(res.tokens), list(res.stats.accepted_per_position))
    report = compare(runs["small"], runs["scaled"], small_vocab, p)
    report.update(type=wtype, files={str(x): x.stat().st_size for x in (pair.target[wtype], pair.centroid[wtype],
                                                                          pair.dense[wtype])},
                  seconds=round(time.perf_counter() - start, 1))
    strict = wtype == "f16"  # quantized weights change the function: their figures are reported only
    n = report["prompts"]
    report["ok"] = report["max_pad_prob"] <= PAD_PROB_MAX and (not strict or (
        report["max_logit_diff"] <= LOGIT_TOL and report["greedy_agree"] == n
        and all(v == n for v in report["drafts_agree"].values())
        and all(v == N_GEN_PROMPTS for v in report["mtp_generation_agree"].values())))
    return report


def _padded(row: np.ndarray, n: int) -> np.ndarray:
    """``row`` (the trained vocabulary) widened to ``n`` entries: a padding token is never a near-tie."""
    return np.concatenate([row, np.full(n - row.size, -np.inf, row.dtype)]) if n > row.size else row


def compare(small: list[Run], big: list[Run], n_real: int, p: int) -> dict[str, Any]:
    """Figures of one comparison: logit differences teacher-forced (every row), tokens by the near-tie
    rule on the trained pair's rows; MTP acceptance per position only where the tokens are identical."""
    diffs, pads, feats = [], [], []
    count = {k: 0 for k in ("greedy_identical", "greedy_agree")}
    drafts = {k: {"dense": 0, "centroid": 0} for k in ("identical", "agree")}
    gens = {k: {"dense": 0, "centroid": 0} for k in ("identical", "agree")}
    partings: list[str] = []
    for i, (s, b) in enumerate(zip(small, big)):
        n_vocab = b.logits.shape[1]
        first = s.logits.shape[0] - len(s.tokens) - 1  # the row the first greedy token was chosen from
        assert b.forced is not None
        diffs.append(float(np.abs(s.logits - b.forced[:, :n_real]).max()))
        pads.append(pad_probability(b.logits, n_real))
        feats.append(float(b.h[p]))
        row = lambda j, s=s, first=first, n=n_vocab: _padded(s.logits[first + j], n)  # noqa: E731
        g = compare_greedy(s.tokens, b.tokens, row, LOGIT_TOL)
        count["greedy_identical"] += g.identical
        count["greedy_agree"] += g.agrees
        if not g.identical:
            partings.append(f"prompt {i} greedy: {g.describe()}")
        for head in drafts["identical"]:
            dense_logits = s.draft_logits["dense"]
            d = compare_greedy(s.drafts["dense"], b.drafts[head],
                               lambda j: _padded(dense_logits[j], n_vocab), LOGIT_TOL)
            drafts["identical"][head] += d.identical
            drafts["agree"][head] += d.agrees
            if not d.identical:
                partings.append(f"prompt {i} {head} drafts: {d.describe()}")
            if head in b.generated:
                (ts, acc_s), (tb, acc_b) = s.generated["dense"], b.generated[head]
                t = compare_greedy(ts, tb, row, LOGIT_TOL)
                gens["identical"][head] += t.identical and acc_s == acc_b
                gens["agree"][head] += t.agrees and (not t.identical or acc_s == acc_b)
                if not t.identical:
                    partings.append(f"prompt {i} {head} MTP generation: {t.describe()}")
    return {"prompts": len(small), "max_logit_diff": max(diffs), **count,
            "max_pad_prob": max(pads), "drafts_identical": drafts["identical"], "drafts_agree": drafts["agree"],
            "mtp_generation_identical": gens["identical"], "mtp_generation_agree": gens["agree"],
            "partings": partings, "feature_h_p": [min(feats), max(feats)],
            "feature_assistant": {h: [float(b.h_last[h][p]) for b in big] for h in drafts["identical"]}}


def format_report(r: dict[str, Any]) -> str:
    n = r["prompts"]
    lines = [
        f"check ({r['type']} vs the trained pair, {n} prompts, {N_GREEDY} greedy tokens, {N_DRAFT} drafts; "
        f"tokens agree when identical or parted first at a near-tie, within 2 x {LOGIT_TOL:g}):",
        f"  max |logit difference| on the trained vocabulary, teacher-forced: {r['max_logit_diff']:.3g}",
        f"  greedy tokens identical: {r['greedy_identical']}/{n}, agree: {r['greedy_agree']}/{n}",
        f"  first-round drafts identical / agree: dense {r['drafts_identical']['dense']}/"
        f"{r['drafts_agree']['dense']}/{n}, centroid {r['drafts_identical']['centroid']}/"
        f"{r['drafts_agree']['centroid']}/{n}",
        f"  MTP generations ({N_GEN_TOKENS} tokens, {N_GEN_DRAFT} drafts) with identical tokens and acceptance "
        f"per position / agreeing tokens: dense {r['mtp_generation_identical']['dense']}/"
        f"{r['mtp_generation_agree']['dense']}/{N_GEN_PROMPTS}, centroid {r['mtp_generation_identical']['centroid']}/"
        f"{r['mtp_generation_agree']['centroid']}/{N_GEN_PROMPTS}",
        *(f"  {line}" for line in r["partings"]),
        f"  largest padding-token probability: {r['max_pad_prob']:.3g}",
        f"  feature h'[p] range: {r['feature_h_p'][0]:.3g} .. {r['feature_h_p'][1]:.3g}",
        f"  took {r['seconds']} s: {'OK' if r['ok'] else 'FAILED'}",
    ]
    return "\n".join(lines)
