"""Our build computes what Hugging Face transformers computes: teacher-forced logits agree within a
tolerance justified below (TOL["ours_vs_hf"] in tests/numerics.py), and greedy tokens equal HF's up to the
near-tie rule for it, for every fixture target.

Tolerance: the fixtures are F32 GGUFs and the comparison runs with flash attention off, so the
remaining differences are accumulation order and ggml's CPU GELU, which goes through an fp16
lookup table (~5e-4 relative error per activation). Random weights amplify that: randomised norm
weights and layer scalars, and attention scale 1.0 on random q/k make softmaxes sharp. Measured on
the fixtures: position 0 (no attention mixing) differs by <= 8e-3, later positions by up to 0.13
(PLE target), i.e. <= 6% of the logits' standard deviation (~2.4), and the per-position KL
divergence between HF's and our next-token distributions is <= 7e-4 nats. We allow 0.25 absolute
and 2e-3 nats: a real port error (a dropped norm, scalar or RoPE variant) moves logits by O(1) and
the KL by orders of magnitude more. The fixture generator re-seeds until HF's top-1/top-2 gaps are at
least 7.9e-3, which is less than twice these differences: greedy tokens may part wherever the two
best lie within 2 x 0.25 on our row (measured: no parting on the native build, haswell or zen4).
"""

from __future__ import annotations

import numpy as np
import pytest

from fixture_paths import TARGETS, fixture_path, reference_path
from mtp_bindings import Model
from numerics import TOL, assert_agree, forced_rows

LOGIT_ATOL = TOL["ours_vs_hf"].value
KL_MAX = 2e-3


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.fixture(scope="module", params=TARGETS)
def target(request):
    name = request.param
    with Model(fixture_path(f"{name}-target.gguf")) as m:
        yield name, m, np.load(reference_path(name))


def test_greedy_tokens_agree_with_hf(target):
    name, model, ref = target
    i = 0
    with model.create_context(n_ctx=256, flash_attn="off") as ctx:
        while f"greedy{i}_prompt" in ref:
            prompt = ref[f"greedy{i}_prompt"].tolist()
            want = ref[f"greedy{i}_tokens"].tolist()
            got = ctx.generate_greedy(prompt, len(want), stop_at_eog=False)
            if got != want:  # HF's rows are not stored: the rule is symmetric, ours (teacher-forced) serve
                rows = forced_rows(ctx, prompt, got)
                assert_agree(want, got, rows.__getitem__, TOL["ours_vs_hf"], f"{name} prompt {i}")
            i += 1
    assert i > 0


def test_teacher_forced_logits_match_hf(target):
    name, model, ref = target
    i = 0
    with model.create_context(n_ctx=256, flash_attn="off") as ctx:
        while f"tf{i}_ids" in ref:
            ids = ref[f"tf{i}_ids"].tolist()
            want = ref[f"tf{i}_logits"]
            ctx.clear()
            ctx.decode(ids, pos=0, logits="all")
            got = ctx.get_logits_all()
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=LOGIT_ATOL, rtol=0, err_msg=f"{name} seq {i}")
            lp, lq = log_softmax(want), log_softmax(got)
            kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
            assert kl.max() <= KL_MAX, f"{name} seq {i}: KL {kl.max():.2e}"
            i += 1
    assert i > 0
