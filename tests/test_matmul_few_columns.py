"""Matrix products and attention with few input columns (patches 0100-0104, 0108, 0111-0114, 0117, 0120, 0122, 0123; issues 8, 23, 29).

* ggml alone: every product of f16, q8_0, q4_K and q6_K weights with n = 1..8 columns (and a few more)
  agrees with a naive reference on the dequantized weights within test-backend-ops' MUL_MAT
  tolerance (NMSE 5e-4), in every weight layout the CPU backend has here (AMX / repacked / plain),
  checked by ``bench/mulmat_bench.c --check``.
* ggml alone: each column of an n-column product (n = 1..8) has the bits of the same column multiplied
  alone, for every weight type a Gemma 4 GGUF holds and every layout (``mulmat_bench --invariance``):
  the verify batch of a speculative round rounds like the single-token decodes it stands for.
* Through the Python API: a decode of n = 2..8 tokens gives exactly the logits of n single-token
  decodes, for small f16, q8_0, q4_K and q4_K_M (Q6_K LM head and half of ffn_down) Gemma 4 targets whose
  widths reach every few-column kernel, with llama.cpp's repacked layouts (AMX where the CPU has it) and
  without them (``repack=False``, the plain kernels), with flash attention off and on.
* ggml alone: flash attention over n = 1..8 query rows gives each row the bits of that row alone
  (``tests/c/fa_rows.c``), under and past 512 KV cells, with f16 and quantized caches (q8_0, TurboQuant,
  mixed K / V types), and agrees with the CPU backend's reference path, as a prompt (the tiled path) does.

Both run in subprocesses, so that a kernel fault fails a test instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_paths import fixture_path
from ggml_programs import CROSS_ENV, compile_ggml_program
from numerics import TOL

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
NS = "1,2,3,4,5,6,7,8,9,16"

SHAPES = {  # rows x cols: AMX wants rows % 32 (else repacked or plain), q4_K cols % 256
    "f16": ["64x256", "544x512", "2048x1536", "40x96"],
    "q8_0": ["64x256", "544x512", "2048x1536", "40x96"],
    "q4_K": ["64x256", "544x512", "2048x1536", "40x256"],
    "q6_K": ["64x256", "544x512", "2048x1536", "40x256"],
}
LAYOUTS = {"chosen": [], "plain": ["--plain"], "repacked": ["--buft", "CPU_REPACK"]}
# every weight type of a Gemma 4 GGUF (Q4_K_M: q4_K, q6_K, some q5_K; q8_0, f16 and bf16 files; q4_0, the type of
# quantization-aware checkpoints)
INVARIANCE_TYPES = ["f16", "bf16", "q8_0", "q4_0", "q4_K", "q5_K", "q6_K"]
INVARIANCE_SHAPES = ["64x256", "544x512", "2048x1536"]


def _exit_reason(rc: int) -> str:
    return f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"


@pytest.fixture(scope="module")
def mulmat_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_ggml_program(BENCH / "mulmat_bench.c", tmp_path_factory.mktemp("mulmat"))


@pytest.mark.ggml_program
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("wtype", list(SHAPES))
def test_products_match_reference(mulmat_bench: Path, wtype: str, layout: str) -> None:
    cmd = [str(mulmat_bench), "--type", wtype, "--n", NS, "--rounds", "1", "--warmup", "0", "--check",
           *LAYOUTS[layout]]
    for shape in SHAPES[wtype]:
        cmd += ["--shape", shape]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode in (0, 1), f"mulmat_bench {_exit_reason(res.returncode)}: {res.stderr[-1000:]}"
    results = json.loads(res.stdout)["results"]
    assert len(results) == len(SHAPES[wtype]) * len(NS.split(","))
    bad = [f"{r['rows']}x{r['cols']} n={r['n']} ({r['buft']}): NMSE {r['nmse']:.2e}"
           for r in results if not r["nmse"] <= 5e-4]
    assert not bad, "products off the reference: " + "; ".join(bad)
    assert res.returncode == 0


@pytest.mark.ggml_program
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("wtype", INVARIANCE_TYPES)
def test_each_column_of_a_few_column_product_has_the_bits_of_its_single_column_product(
        mulmat_bench: Path, wtype: str, layout: str) -> None:
    cmd = [str(mulmat_bench), "--type", wtype, "--n", "1,2,3,4,5,6,7,8", "--rounds", "1", "--warmup", "0",
           "--invariance", *LAYOUTS[layout]]
    for shape in INVARIANCE_SHAPES:
        cmd += ["--shape", shape]
    bad = _batch_dependent(_invariance_results(cmd))
    assert not bad, "batch-dependent rounding: " + "; ".join(bad)


def _invariance_results(cmd: list[str]) -> list[dict]:
    """mulmat_bench --invariance's rows (each column of each product against the product of it alone)."""
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode in (0, 1), f"mulmat_bench {_exit_reason(res.returncode)}: {res.stderr[-1000:]}"
    return json.loads(res.stdout)["results"]


def _batch_dependent(results: list[dict]) -> list[str]:
    return [f"{r['rows']}x{r['cols']} n={r['n']} ({r['buft']}): {r['mismatches']} floats differ"
            for r in results if r["mismatches"]]


@pytest.fixture(scope="module")
def fa_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_ggml_program(REPO / "tests" / "c" / "fa_rows.c", tmp_path_factory.mktemp("fa"))


def _fa_rows(fa_rows: Path, shape: list[str]) -> dict:
    res = subprocess.run([str(fa_rows), *shape], capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 1), f"fa_rows {_exit_reason(res.returncode)}: {res.stderr[-1000:]}"
    return json.loads(res.stdout)


GEMMA4_FULL = ["--heads", "8", "--kv-heads", "1", "--dk", "256"]  # E2B's query / KV heads (the full layers: 512)
FA_SHAPES = {
    "256-cells": ["--n-kv", "256", "--used", "40"],
    "768-cells": ["--n-kv", "768", "--used", "600"],  # past 512 cells: the split-KV path, 4 heads on a KV head
    # 8 rows a KV head: scores as K * Q^T (AVX2; AVX-512 from 16 rows)
    "768-cells-gemma4": ["--n-kv", "768", "--used", "600", *GEMMA4_FULL],
    "768-cells-no-gqa": ["--n-kv", "768", "--used", "600", "--kv-heads", "4"],  # F16 row by row (one_chunk)
    # chunks 3..7 seen by no row (as a sliding window's layer sees a full-size cache): skipped whole
    "2048-cells-600-seen-gemma4": ["--n-kv", "2048", "--used", "600", *GEMMA4_FULL],
    "2048-cells-gqa-1-thread": ["--n-kv", "2048", "--used", "1500", "--heads", "8", "--kv-heads", "2", "--dk", "256",
                                "--threads", "1"],
    # a quantized cache: past 512 cells the query rows of a KV head take each chunk together
    "256-cells-q8_0": ["--n-kv", "256", "--used", "40", "--k-type", "q8_0", "--v-type", "q8_0"],
    "768-cells-q8_0": ["--n-kv", "768", "--used", "600", "--k-type", "q8_0", "--v-type", "q8_0"],
    "256-cells-turbo3-gemma4": ["--n-kv", "256", "--used", "200", *GEMMA4_FULL, "--k-type", "turbo3",
                                "--v-type", "turbo3"],
    "768-cells-turbo3-gemma4": ["--n-kv", "768", "--used", "600", *GEMMA4_FULL, "--k-type", "turbo3", "--v-type", "turbo3"],
    "768-cells-turbo4-gemma4-1-thread": ["--n-kv", "768", "--used", "700", *GEMMA4_FULL, "--k-type", "turbo4",
                                         "--v-type", "turbo4", "--threads", "1"],
    "2048-cells-q8_0-K-turbo2-V-gqa": ["--n-kv", "2048", "--used", "1500", "--heads", "8", "--kv-heads", "2",
                                       "--dk", "256", "--k-type", "q8_0", "--v-type", "turbo2"],
    "768-cells-f16-K-q8_0-V": ["--n-kv", "768", "--used", "600", "--k-type", "f16", "--v-type", "q8_0"],
}


@pytest.mark.ggml_program
@pytest.mark.parametrize("shape", FA_SHAPES.values(), ids=FA_SHAPES.keys())
def test_flash_attention_gives_each_of_a_few_query_rows_the_bits_of_that_row_alone(fa_rows: Path, shape) -> None:
    bad = [f"n={r['n']}: {r['mismatches']} floats differ" for r in _fa_rows(fa_rows, shape)["results"] if r["mismatches"]]
    assert not bad, "flash attention rounds with the batch: " + "; ".join(bad)


@pytest.mark.ggml_program
@pytest.mark.parametrize("shape", FA_SHAPES.values(), ids=FA_SHAPES.keys())
def test_flash_attention_over_a_few_query_rows_agrees_with_the_reference_path(fa_rows: Path, shape) -> None:
    err = _fa_rows(fa_rows, shape)["ref_rel_err"]
    assert err <= TOL["fa_vs_reference"].value, f"1..8 rows vs the one-row reference: {err:.3g}"


@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0"), ("turbo3", "turbo3"), ("q8_0", "turbo4")],
                         ids=lambda t: "-".join(t))
@pytest.mark.ggml_program
def test_flash_attention_over_a_prompt_agrees_with_the_reference_path(fa_rows: Path, types) -> None:
    # 96 rows: the tiled prompt path (64 rows a tile), for a quantized cache too
    out = _fa_rows(fa_rows, ["--n-kv", "768", "--used", "600", *GEMMA4_FULL, "--k-type", types[0], "--v-type", types[1],
                             "--prompt", "96"])
    assert out["prompt_ref_rel_err"] <= TOL["fa_prompt_vs_reference"].value, out


# ----------------------------------------------------------------------------------------------
# through the Python API
# ----------------------------------------------------------------------------------------------

CHILD = r"""
import json, sys
import numpy as np
from mtp_bindings import Model

path, repack, prefix, flash_attn, kv, n_max = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4], sys.argv[5], 8
model = Model(path, repack=repack)
ctx = model.create_context(n_ctx=1024, n_batch=32, n_ubatch=32, n_threads=2, flash_attn=flash_attn, type_k=kv, type_v=kv)
tokens = np.random.default_rng(3).integers(10, 1000, size=prefix + n_max).astype(np.int32)
for i in range(prefix + n_max):  # one token at a time: the draft steps
    ctx.decode(tokens[i:i + 1], pos=i, logits="last")
    if i == prefix - 1:
        single = []
    elif i >= prefix:
        single.append(ctx.get_logits(0))
single = np.stack(single)
out = {}
for n in range(2, n_max + 1):  # the verify batch
    ctx.seq_rm(0, prefix, -1)
    ctx.decode(tokens[prefix:prefix + n], pos=prefix, logits="all")
    batch = ctx.get_logits_all()
    ref = single[:n]
    out[n] = {"rel": float(np.abs(batch - ref).max() / np.abs(ref).max()),
              "identical": bool(np.array_equal(batch, ref))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def small_targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small random Gemma 4 targets (hidden 256) in f16, q8_0, q4_K and q4_K_M."""
    from mtp_bindings.benchmark.models import FTYPES, Dims, quantize, write_f16_target

    d = tmp_path_factory.mktemp("few-columns")
    dims = Dims(hidden=256, ffn=512, heads=2, kv_heads=1, head_dim=128, global_head_dim=256, window=64,
                vocab=1024, layers=(True, False))
    paths = {t: d / f"{t}.gguf" for t in ("f16", "q8_0", "q4_K", "q4_K_M")}
    write_f16_target(paths["f16"], dims, seed=5, tokenizer=fixture_path("dense-target.gguf"))
    for t in ("q8_0", "q4_K", "q4_K_M"):
        quantize(paths["f16"], paths[t], FTYPES[t], 2)
    return paths


# 600 cells: past 512, where flash attention over one query row splits the KV in chunks (0108)
# with flash attention too (off by default, forced on by a quantized V cache): past 512 cells one row splits
# the KV in chunks (0108), and 2..8 rows split it the same way (0108 too)
@pytest.mark.parametrize("flash_attn", ["off", "on"])
@pytest.mark.parametrize("prefix", [4, 600])
@pytest.mark.parametrize("repack", [True, False], ids=["repacked", "plain"])
@pytest.mark.parametrize("wtype", ["f16", "q8_0", "q4_K", "q4_K_M"])
def test_a_batched_decode_gives_exactly_the_logits_of_single_steps(
        small_targets: dict[str, Path], wtype: str, repack: bool, prefix: int, flash_attn: str) -> None:
    bad = _batched_vs_single(small_targets[wtype], repack, prefix, flash_attn, "f16")
    assert not bad, f"{wtype}: a batched decode rounds differently from single steps: " + "; ".join(bad)


def _batched_vs_single(target: Path, repack: bool, prefix: int, flash_attn: str, kv: str) -> list[str]:
    res = subprocess.run([sys.executable, "-c", CHILD, str(target), "1" if repack else "0", str(prefix), flash_attn,
                          kv], capture_output=True, text=True, timeout=300, cwd=REPO / "tests")
    assert res.returncode == 0, f"decode {_exit_reason(res.returncode)}: {res.stderr[-1500:]}"
    out = json.loads(res.stdout)
    return [f"n={n}: max relative difference {r['rel']:.2e}" for n, r in out.items() if not r["identical"]]


# llama.cpp pads the KV view to 256 cells past the last used one: after 765 tokens a verify batch of 4+ sees 1024
# cells where the one-token decodes of its first rows saw 768 (patch 0122 keeps flash attention's chunks fixed)
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_a_batched_decode_across_the_kv_views_256_cell_padding_gives_exactly_the_logits_of_single_steps(
        small_targets: dict[str, Path], kv: str) -> None:
    bad = _batched_vs_single(small_targets["f16"], True, 765, "on", kv)
    assert not bad, f"{kv} cache: a batched decode past a 256-cell boundary rounds differently: " + "; ".join(bad)


@pytest.mark.ggml_program
def test_repacked_q6_K_gives_a_prompt_batch_the_bits_of_single_columns(mulmat_bench: Path) -> None:
    """Where Q6_K is repacked (x86 with AVX2 or AVX-512 VNNI), one kernel takes every number of columns: a prompt's
    rows round like the decode of each row alone, not only a verify batch's."""
    if os.environ.get(CROSS_ENV):  # ARM repacks Q6_K in its own layout, whose prompt batches take the gemm
        pytest.skip("x86's Q6_K kernel: another architecture's build promises 1..8 columns only")
    cmd = [str(mulmat_bench), "--type", "q6_K", "--n", "9,16,17,33", "--rounds", "1", "--warmup", "0",
           "--invariance", "--buft", "CPU_REPACK", "--shape", "544x512", "--shape", "64x1536"]
    results = _invariance_results(cmd)
    if any(r["buft"] != "CPU_REPACK" for r in results):
        pytest.skip("Q6_K is not repacked on this CPU (no AVX2, or another layout is chosen)")
    bad = _batch_dependent(results)
    assert not bad, "batch-dependent rounding: " + "; ".join(bad)


# with an f32 cache and flash attention off, Q reaches the KQ product permuted, unconverted: one token's took
# tinyBLAS and a batch's vec_dot until patch 0123 (found by test_speculative's hypothesis search on the centroid
# fixture: MTP parted from plain greedy at token 19 of 'e_cxfybx_afzyz', one draft; 3e-5 relative on the logits)
def test_with_an_f32_cache_and_flash_attention_off_a_batched_decode_gives_exactly_the_logits_of_single_steps(
        small_targets: dict[str, Path]) -> None:
    bad = _batched_vs_single(small_targets["f16"], True, 4, "off", "f32")
    assert not bad, "f32 cache: a batched decode rounds differently from single steps: " + "; ".join(bad)
