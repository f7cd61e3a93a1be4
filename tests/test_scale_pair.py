"""scale_pair: the scaled (wider, deeper, larger-vocabulary) pair computes what the trained pair
computes. Small configuration only (6 layers, hidden 256, vocab 4096, head_dim x2, 64 centroids):
target logits and greedy tokens, drafts of both heads, padding tokens held down, the cache, bad
shapes. The full E2B-size build is checked by ``python -m mtp_bindings.scale_pair --check``."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from mtp_bindings import InvalidParameterError, Model
from mtp_bindings.scale_pair import check as _scale_check
from mtp_bindings.scale_pair.check import first_drafts, greedy_run, pad_probability
from numerics import TOL, assert_agree
from mtp_bindings.gguffile.tools import read_summary, verify_assistant
from mtp_bindings.scale_pair.build import BUNDLED, ScaleConfig, main, scale_pair

SMALL = ScaleConfig.small()
PROMPTS = ["def main(argv):\n", "import os\nimport sys\n", "class Queue:\n    def __init__(self):",
           "    return self._data[key]\n", "for i in range(10):\n    print(i)\n"]
N_GREEDY = 32
N_TRAINED_VOCAB = 1024

# Tolerance on target logits: TOL["scaled_vs_trained"] (tests/numerics.py; the value is scale-pair --check's own
# LOGIT_TOL). Both files hold the same f16 weight values and compute the same function; what differs is float
# rounding: V's weightless RMSNorm over a k-times wider head gives sqrt(k) V, which the f16 KV cache rounds at
# other values than the trained V (2^-11 relative), dot products over zero-padded rows accumulate in another
# order (the more so with wider SIMD: AVX-512 is the worst measured), and the rescaled norm weights and wider
# heads' RoPE angles differ by ~1e-7 relative. A construction error (a norm off by sqrt(2), RoPE pairs at the
# wrong frequency, a head in the wrong K/V group) moves logits by 0.1-10. Greedy runs of the two part where
# the trained target's two best tokens are that close (measured: a gap of 3.4e-5 at token 2 under haswell),
# so logits are compared teacher-forced and tokens by the near-tie rule.
LOGIT_TOL = TOL["scaled_vs_trained"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("scale-cache")
    return scale_pair(SMALL, types=("f16", "q4_K"), cache_dir=cache, threads=2, progress=False), cache


@pytest.fixture(scope="module")
def runs(built):
    """Greedy runs of every prompt on the trained target and on the scaled f16 target, and the scaled
    target's logits with the trained run's tokens fed (teacher forcing)."""
    pair, _ = built
    out = {}
    for name, path in (("trained", BUNDLED / "trained-target.gguf"), ("scaled", pair.target["f16"])):
        with Model(path) as m, m.create_context(n_ctx=256, embeddings=True, n_threads=2) as ctx:
            out[name] = [greedy_run(ctx, m.tokenize(p), N_GREEDY) for p in PROMPTS]
            if name == "scaled":
                out["forced"] = [greedy_run(ctx, m.tokenize(p), 0, forced=t.tokens)
                                 for p, t in zip(PROMPTS, out["trained"])]
    return out


def _chosen_from(run):
    """The row of a greedy run each of its tokens was chosen from, padded to the scaled vocabulary."""
    first = run.logits.shape[0] - len(run.tokens) - 1
    return lambda j: np.concatenate([run.logits[first + j], np.full(SMALL.vocab - N_TRAINED_VOCAB, -np.inf)])


def test_scaled_files_have_the_new_shapes(built):
    pair, _ = built
    t = read_summary(pair.target["f16"])
    assert (t.key("embedding_length"), t.key("block_count"), t.key("feed_forward_length")) == (256, 6, 1024)
    assert (t.key("attention.head_count"), t.key("attention.key_length_swa"), t.key("attention.key_length")) == (8, 64, 128)
    assert t.tensors["token_embd.weight"][1] == (256, 4096)
    assert verify_assistant(pair.centroid["f16"], pair.target["f16"]) == []
    assert verify_assistant(pair.dense["f16"], pair.target["f16"]) == []
    dense = read_summary(pair.dense["f16"])
    assert not any("masked_embd" in name for name in dense.tensors)
    assert "masked_embd_centroids.weight" in read_summary(pair.centroid["f16"]).tensors
    assert read_summary(pair.target["q4_K"]).type_counts.get("Q4_K", 0) > 0


def test_the_tests_tolerance_is_scale_pair_checks():
    assert LOGIT_TOL.value == _scale_check.LOGIT_TOL


def test_scaled_target_logits_equal_the_trained_ones_teacher_forced(runs):
    worst = 0.0
    for trained, forced in zip(runs["trained"], runs["forced"]):
        assert forced.logits.shape == (trained.logits.shape[0], SMALL.vocab)
        worst = max(worst, float(np.abs(trained.logits - forced.logits[:, :N_TRAINED_VOCAB]).max()))
    assert worst <= LOGIT_TOL.value, f"max logit difference {worst:.3g} ({LOGIT_TOL.basis})"


def test_scaled_target_greedy_tokens_agree_with_the_trained_ones(runs):
    for prompt, trained, scaled in zip(PROMPTS, runs["trained"], runs["scaled"]):
        assert_agree(trained.tokens, scaled.tokens, _chosen_from(trained), LOGIT_TOL, prompt)


def test_scaled_target_hidden_state_is_the_trained_one_padded(runs):
    # the assistant's h input: the trained h in the first 128 dimensions, zeros elsewhere but the feature
    for trained, scaled in zip(runs["trained"], runs["scaled"]):
        np.testing.assert_allclose(scaled.h[:128], trained.h, atol=1e-2 * np.abs(trained.h).max())
        rest = np.delete(scaled.h[128:], 0)  # the feature dimension p = 128 in this configuration
        assert np.all(rest == 0)


def test_no_padding_token_gets_probability_above_1e_6(runs, built):
    worst = max(pad_probability(run.logits, N_TRAINED_VOCAB) for run in runs["scaled"])
    assert worst <= 1e-6, f"a padding token reached probability {worst:.3g}"
    # and they are held down by a margin, not by luck: every padding logit sits at the softcap floor
    floor = min(float(run.logits[:, N_TRAINED_VOCAB:].max()) for run in runs["scaled"])
    assert floor < -29.9


@pytest.mark.parametrize("head", ["dense", "centroid"])
def test_scaled_assistant_drafts_agree_with_the_trained_ones(built, head):
    pair, _ = built
    files = {"trained": (BUNDLED / "trained-target.gguf", BUNDLED / "trained-assistant.gguf"),
             "scaled": (pair.target["f16"], getattr(pair, head)["f16"])}
    drafts = {}
    x = None
    for name, (t, a) in files.items():
        with Model(t, assistant=a) as m, m.create_context(n_ctx=256, embeddings=True, n_threads=2) as ctx:
            if x is None:  # both assistants draft after the trained target's greedy token
                x = [greedy_run(ctx, m.tokenize(p), 1).tokens[0] for p in PROMPTS]
            drafts[name] = [first_drafts(ctx, m.tokenize(p), 4, x=xi) for p, xi in zip(PROMPTS, x)]
    for prompt, (want, _, rows), (got, _, _) in zip(PROMPTS, drafts["trained"], drafts["scaled"]):
        padded = lambda j, rows=rows: np.concatenate([rows[j], np.full(SMALL.vocab - N_TRAINED_VOCAB, -np.inf)])  # noqa: E731
        assert_agree(want, got, padded, LOGIT_TOL, (head, prompt))
        assert all(d < N_TRAINED_VOCAB for d in got)


@pytest.mark.parametrize("head", ["dense", "centroid"])
def test_mtp_generation_on_the_scaled_pair_accepts_like_the_trained_pair(built, runs, head):
    pair, _ = built
    results = {}
    for name, (t, a) in {"trained": (BUNDLED / "trained-target.gguf", BUNDLED / "trained-assistant.gguf"),
                         "scaled": (pair.target["f16"], getattr(pair, head)["f16"])}.items():
        with Model(t, assistant=a) as m:
            results[name] = [m.generate(p, max_tokens=N_GREEDY, temperature=0.0, draft_n_max=3) for p in PROMPTS[:3]]
    for prompt, run, trained, scaled in zip(PROMPTS, runs["trained"], results["trained"], results["scaled"]):
        # each pair's MTP output is its own plain greedy output exactly; between the pairs the near-tie rule
        a = assert_agree(trained.tokens, scaled.tokens, _chosen_from(run), LOGIT_TOL, (head, prompt))
        if a.identical:  # a parted history drafts from other contexts: acceptance is comparable only without one
            assert scaled.stats.accepted_per_position == trained.stats.accepted_per_position, prompt


def test_quantized_files_still_hold_padding_tokens_down(built):
    pair, _ = built
    with Model(pair.target["q4_K"], assistant=pair.centroid["q4_K"]) as m, \
            m.create_context(n_ctx=256, embeddings=True, n_threads=2) as ctx:
        run = greedy_run(ctx, m.tokenize(PROMPTS[0]), 8)
        assert pad_probability(run.logits, N_TRAINED_VOCAB) <= 1e-6
        drafts, _, _ = first_drafts(ctx, m.tokenize(PROMPTS[0]), 4)
        assert all(d < N_TRAINED_VOCAB for d in drafts)


def test_the_cache_is_reused_when_the_inputs_are_unchanged(built):
    pair, cache = built
    mtimes = {p: os.stat(p).st_mtime_ns for p in pair.paths()}
    again = scale_pair(SMALL, types=("f16", "q4_K"), cache_dir=cache, progress=False)
    assert again.cached and again.directory == pair.directory
    assert {p: os.stat(p).st_mtime_ns for p in again.paths()} == mtimes
    other = scale_pair(dataclasses.replace(SMALL, seed=1), types=("f16",), cache_dir=cache, progress=False)
    assert not other.cached and other.directory != pair.directory


def test_the_command_prints_every_path(built, capsys):
    pair, cache = built
    assert main(["--small", "--types", "f16", "q4_K", "--cache-dir", str(cache), "--no-progress"]) == 0
    out = capsys.readouterr().out
    for p in pair.paths():
        assert str(p) in out
    assert "found cached" in out


@pytest.mark.parametrize("change", [{"head_dim": 48}, {"hidden": 64}, {"layers": (True, False, True)},
                                    {"layers": (True, False, True, False, False, True)}, {"centroid_top_k": 8}])
def test_shapes_the_construction_cannot_keep_exact_are_refused(tmp_path, change):
    with pytest.raises(InvalidParameterError):
        scale_pair(dataclasses.replace(SMALL, **change), types=("f16",), cache_dir=tmp_path, progress=False)


def test_unknown_weight_type_is_refused(tmp_path):
    with pytest.raises(InvalidParameterError):
        scale_pair(SMALL, types=("q3_K",), cache_dir=tmp_path, progress=False)


def test_f16_files_written_only_to_be_quantized_are_removed(tmp_path):
    pair = scale_pair(SMALL, types=("q8_0",), cache_dir=tmp_path, threads=2, progress=False)
    assert all(p.is_file() for p in pair.paths())
    assert not list(pair.directory.glob("*-f16.gguf"))


def test_scale_pair_check_passes_on_the_small_configuration(built):
    # the product's comparison (scale-pair --check) on the same files: teacher-forced logits, tokens by the
    # near-tie rule; its report names any parting
    from mtp_bindings.scale_pair.check import check, format_report

    pair, _ = built
    report = check(pair, SMALL, "f16", n_threads=2)
    text = format_report(report)
    assert report["ok"], text
    assert report["max_logit_diff"] <= _scale_check.LOGIT_TOL and report["greedy_agree"] == report["prompts"]
    assert all(line in text for line in report["partings"])
