"""How the tests compare numbers: one table of tolerances, each with its measured basis, and the one
near-tie rule (the package's :mod:`mtp_bindings.generation.agreement`, which the demo, ``scale-pair
--check`` and the benchmark use too).

Three kinds of comparison, and which one a test needs:

* **exact** -- two runs of one computation: within one model and build, MTP against plain decoding
  (every CPU kernel of a decode of 1..8 tokens rounds each row as a one-token decode does, patches
  0101-0104, 0108, 0111-0114, 0117, 0120, 0122 and 0123: ``test_matmul_few_columns.py`` bit for bit,
  ``test_cpu_variants.py`` on the haswell and zen4 variants), logprobs with and without drafting, a
  server against the same model in process. Token lists and floats are compared with ``==``.
* **teacher-forced** -- two different computations (another weight / KV type, a scaled copy, HF): the
  reference's tokens are fed to both (:func:`forced_rows`) and every row is compared within the
  table's tolerance, so one near-tie cannot part the histories and spoil the rows after it.
* **greedy tokens of different computations** -- :func:`assert_agree`: identical, or parted first at
  a near-tie (the two tokens within ``2 * tol`` on the reference's row, the one plain decoding chose
  from); after a parting nothing is comparable.

Headroom: each tolerance is the largest difference measured (on this machine's native build, a 2-core
Sapphire Rapids with AMX, and under the haswell (AVX2) and zen4 (AVX-512) variants built by
``tools/cpu_variant.sh``), times the factor given; a construction error moves logits by far more (0.1-10).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mtp_bindings.generation.agreement import Agreement, compare_greedy, first_parting, forced_rows

__all__ = ["TOL", "Tolerance", "assert_agree", "assert_same_tokens", "forced_rows"]


@dataclass(frozen=True)
class Tolerance:
    """A bound on ``|a - b|`` of two computations' logits (or logprobs) and why it holds."""

    value: float
    measured: float
    basis: str

    @property
    def headroom(self) -> float:
        return self.value / self.measured if self.measured else float("inf")


TOL: dict[str, Tolerance] = {
    # one computation twice: batch-invariant rows (the kernels above)
    "mtp_vs_plain": Tolerance(0.0, 0.0, "MTP verify rows vs one-token decodes, one model and build: bit for bit "
                                        "(native AMX, haswell, zen4)"),
    # the library's log-softmax (float32 exp, float64 sum) against a float64 one of the same row
    "logprob_vs_float64": Tolerance(1e-6, 4.0e-8, "generate(logprobs=) vs float64 log-softmax of plain decoding's "
                                                  "rows, trained pair (native, haswell, zen4); 25x"),
    # a prompt decoded at once (more than 8 rows: outside the batch-invariant kernels) vs token by token, six
    # prompts each repeated three times (15-45 tokens), n_threads=1
    "prompt_batch": Tolerance(1.5e-2, 5.6e-3, "0 with the f16 KV cache (every target; native, haswell, zen4) and with "
                                              "f32 KV under haswell and zen4 on an AMX machine; with f32 KV on the "
                                              "native (AMX) build up to 5.6e-3 (keqv; ple 3.4e-3, dense 1.5e-3, "
                                              "trained 6.6e-4), on a Zen 4's native build up to 7.5e-5 (dense; ple "
                                              "2.4e-5, keqv 8.1e-6); 2.7x"),
    # CPU flash attention (tests/c/fa_rows.c, ggml alone: random K / V, relative to the output's largest value)
    # against the backend's reference path (one query row at a time over the whole cache, no chunks, no tiles)
    "fa_vs_reference": Tolerance(2e-2, 1.31e-2, "1..8 query rows past 512 cells: f16 1.31e-2 (both paths "
                                                "accumulate V in f16, 256 cells a chunk), quantized caches "
                                                "(q8_0, turbo2-4, mixed) <= 3.1e-3 (f32 Q against the "
                                                "reference's q8_0 Q); Zen 5 native, haswell, skylakex; 1.5x"),
    "fa_prompt_vs_reference": Tolerance(2e-2, 8.1e-3, "96-row prompts (the tiled path): f16 8.1e-3, turbo3 2.5e-3 "
                                                      "(f32 Q against the reference's q8_0 Q), f16 K + q8_0 V "
                                                      "1.4e-4; Zen 5 native; 2.5x"),
    # the scaled pair (scale_pair, ScaleConfig.small()) vs the trained one, teacher-forced, same f16 weights;
    # the value is scale-pair --check's own LOGIT_TOL (test_scale_pair.py checks they are one)
    "scaled_vs_trained": Tolerance(2.5e-2, 1.27e-2, "f16 KV: 4.1e-3 native, 8.8e-3 haswell, 1.27e-2 zen4; f32 KV: "
                                                       "8.2e-4 / 1.26e-2 / 1.23e-2 (prompt rows and 32 forced "
                                                       "tokens, five prompts); ~2x"),
    # a GPU backend's rows of a batch of 2..5 tokens vs its one-token decodes (its kernels are not batch-invariant:
    # the patches above make the CPU's so); MTP against plain decoding on such a device is compared by the near-tie rule
    "device_batch_vs_single": Tolerance(0.4, 0.188, "Vulkan on Mesa's lavapipe, every layer offloaded, plain greedy "
                                                     "continuations of three prompts re-decoded in batches of 2-5: "
                                                     "ple 0.188, keqv 0.077, dense 0.057, trained 0.003; ~2x"),
    # ours vs Hugging Face transformers (F32 fixtures, flash attention off): ggml's fp16 GELU table
    "ours_vs_hf": Tolerance(0.25, 0.13, "teacher-forced logits vs HF, random fixtures (PLE worst; position 0 "
                                        "<= 8e-3); 1.9x"),
    # the assistant vs HF, each draft step fed HF's own inputs (test_mtp_api.py): the same fp16-GELU effect
    "draft_logits_vs_hf": Tolerance(0.25, 0.161, "draft logits, every fixture pair and step: 0.156 native, 0.149 "
                                                 "haswell, 0.161 zen4; 1.55x"),
    "draft_h_vs_hf": Tolerance(0.15, 0.0889, "the draft step's projected h: 0.0853 / 0.0825 / 0.0889; 1.7x"),
    "h_prev_vs_hf": Tolerance(0.2, 0.0542, "the target's post-norm hidden state after the prompt: 0.0542 / 0.0541 "
                                           "/ 0.0542; 3.7x"),
}


def _describe(label: object, a: Agreement, ref: Sequence[int], other: Sequence[int]) -> str:
    j = a.at if a.at is not None else 0
    return (f"{label}: {a.describe()} ({list(other[j:j + 1])} vs the reference's {list(ref[j:j + 1])}, "
            f"lengths {len(other)} and {len(ref)})")


def assert_same_tokens(reference: Sequence[int], other: Sequence[int], label: object = "") -> None:
    """Exactly equal: two runs of one computation (tolerance ``mtp_vs_plain``)."""
    at = first_parting(reference, other)
    if at is not None:
        raise AssertionError(f"{label}: parted at token {at} ({list(other[at:at + 1])} vs the reference's "
                             f"{list(reference[at:at + 1])}, lengths {len(other)} and {len(reference)}); "
                             "one computation must not part at all")


def assert_agree(reference: Sequence[int], other: Sequence[int], row_at: Callable[[int], np.ndarray],
                 tol: Tolerance, label: object = "") -> Agreement:
    """``other``'s greedy tokens equal ``reference``'s, or part first at a near-tie for ``tol``
    (``row_at(i)``: the row the reference chose token ``i`` from). Returns the verdict."""
    a = compare_greedy(reference, other, row_at, tol.value)
    assert a.agrees, _describe(label, a, reference, other)
    return a
