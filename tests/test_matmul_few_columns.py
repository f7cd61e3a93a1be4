"""Matrix products with few input columns (patches 0100-0101, issue 8).

* ggml alone: every product of f16, q8_0, q4_K and q6_K weights with n = 1..8 columns (and a few more)
  agrees with a naive reference on the dequantized weights within test-backend-ops' MUL_MAT
  tolerance (NMSE 5e-4), in every weight layout the CPU backend has here (AMX / repacked / plain),
  checked by ``bench/mulmat_bench.c --check``.
* Through the Python API: a decode of n = 2..8 tokens gives the logits of n single-token decodes
  (the verify batch of a speculative round must score like the draft steps) for small f16, q8_0,
  q4_K and q4_K_M (Q6_K LM head and half of ffn_down, patch 0104) Gemma 4 targets whose widths reach
  every few-column kernel.

Both run in subprocesses, so that a kernel fault fails a test instead of killing pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_paths import fixture_path
from ggml_programs import compile_ggml_program

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


def _exit_reason(rc: int) -> str:
    return f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"


@pytest.fixture(scope="module")
def mulmat_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_ggml_program(BENCH / "mulmat_bench.c", tmp_path_factory.mktemp("mulmat"))


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


# ----------------------------------------------------------------------------------------------
# through the Python API
# ----------------------------------------------------------------------------------------------

CHILD = r"""
import json, sys
import numpy as np
from mtp_bindings import Model

path, prefix, n_max = sys.argv[1], 4, 8
model = Model(path)
ctx = model.create_context(n_ctx=128, n_batch=32, n_ubatch=32, n_threads=2)
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
              "argmax_same": bool((batch.argmax(1) == ref.argmax(1)).all())}
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


@pytest.mark.parametrize("wtype", ["f16", "q8_0", "q4_K", "q4_K_M"])
def test_batched_decode_matches_single_steps(small_targets: dict[str, Path], wtype: str) -> None:
    res = subprocess.run([sys.executable, "-c", CHILD, str(small_targets[wtype])], capture_output=True,
                         text=True, timeout=300, cwd=REPO / "tests")
    assert res.returncode == 0, f"decode {_exit_reason(res.returncode)}: {res.stderr[-1500:]}"
    out = json.loads(res.stdout)
    for n, r in out.items():
        assert r["argmax_same"], f"{wtype}: decode of {n} tokens changes the greedy token"
        assert r["rel"] < 1e-3, f"{wtype}: decode of {n} tokens is {r['rel']:.2e} off the single steps"
