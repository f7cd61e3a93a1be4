"""TurboQuant KV caches (patches 0019, 0118, 0119; issue 29) and K-shifts of quantized K caches (patch 0018).

* ggml alone (``tests/c/turbo_quant.c``): on random unit vectors the turbo2 / turbo3 / turbo4 codebooks reach
  the Lloyd-Max distortion for a coordinate of a random 128-dimensional unit vector (within 5 %, above the
  paper's lower bound 4^-b), their inner-product error is that distortion and nearly unbiased, outlier channels
  need the rotation the KV cache applies, the CPU's dot product on the codes equals the dot product of the
  dequantized rows, and flash attention over turbo K/V equals it over the same values dequantized.
* Through the Python API, on the bundled pair widened to heads of 128 / 256 (``scale-pair``): contexts with turbo caches decode,
  MTP greedy equals plain greedy on them (the assistant cross-attends into the target's turbo cache), a K-shift
  of a turbo cache works; a model whose heads the 128-value blocks do not divide is refused with a clear error.
* A K-shift of a quantized K cache whose head the Hadamard rotation does not fit (the bundled pair's 32)
  no longer dereferences a null rotation.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import BUNDLED
from ggml_programs import compile_ggml_program
from native_log import native_log
from numerics import assert_same_tokens

from mtp_bindings import Model
from mtp_bindings.exceptions import ContextError, InvalidParameterError
from mtp_bindings.scale_pair.build import ScaleConfig, scale_pair

REPO = Path(__file__).resolve().parent.parent

# E|x - x'|^2 of a unit vector whose 128-blocks are quantized with a b-bit Lloyd-Max codebook for Beta(d = 128),
# the dequantized block keeping its norm (numpy, 40,000 vectors; turboquant-brief section 4.2)
LLOYD_MAX_D = {"turbo2": 0.1188, "turbo3": 0.0338, "turbo4": 0.0092}
BITS = {"turbo2": 2, "turbo3": 3, "turbo4": 4}
# the regression slope of <q, x'> on <q, x> is <x, x'> = 1 - D/2 when x' keeps the norm of x
MIN_SLOPE = {"turbo2": 0.93, "turbo3": 0.98, "turbo4": 0.995}


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict:
    exe = compile_ggml_program(REPO / "tests" / "c" / "turbo_quant.c", tmp_path_factory.mktemp("turbo"))
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"turbo_quant exited {res.returncode}: {res.stderr[-2000:]}"
    return json.loads(res.stdout)


def _rows(measured: dict, **where) -> list[dict]:
    rows = [r for r in measured["distortion"] if all(r[k] == v for k, v in where.items())]
    assert rows, where
    return rows


@pytest.mark.ggml_program
@pytest.mark.parametrize("kind", list(LLOYD_MAX_D))
def test_turbo_distortion_on_random_unit_vectors_is_lloyd_max_within_5_percent(measured, kind) -> None:
    for r in _rows(measured, type=kind, input="isotropic"):
        assert 4.0 ** -BITS[kind] < r["D"], r
        assert abs(r["D"] / LLOYD_MAX_D[kind] - 1) < 0.05, r


@pytest.mark.ggml_program
@pytest.mark.parametrize("kind", list(LLOYD_MAX_D))
def test_turbo_inner_product_error_is_the_distortion_and_nearly_unbiased(measured, kind) -> None:
    for r in _rows(measured, type=kind, input="isotropic"):
        assert abs(r["ip_D"] / r["D"] - 1) < 0.10, r
        assert r["slope"] >= MIN_SLOPE[kind], r


@pytest.mark.ggml_program
@pytest.mark.parametrize("kind", list(LLOYD_MAX_D))
def test_turbo_needs_the_rotation_on_outlier_channels(measured, kind) -> None:
    stored, = _rows(measured, type=kind, input="outliers")
    rotated, = _rows(measured, type=kind, input="outliers-rotated")
    assert stored["D"] > 3 * rotated["D"], (stored, rotated)
    assert abs(rotated["D"] / LLOYD_MAX_D[kind] - 1) < 0.10, rotated


@pytest.mark.ggml_program
def test_turbo_bits_order_the_distortions_against_the_stock_types(measured) -> None:
    d = {r["type"]: r["D"] for r in _rows(measured, input="isotropic", d=256)}
    assert d["q8_0"] < d["iq4_nl"] < d["turbo4"] < d["turbo3"] < d["turbo2"], d
    # 4.125 bits against q4_0's 4.5: within 1.5x of its error
    assert d["turbo4"] < 1.5 * d["q4_0"], d


@pytest.mark.ggml_program
def test_turbo_dot_product_on_the_codes_equals_the_dequantized_dot_product(measured) -> None:
    bad = [r for r in measured["dot"] if r["max_rel_err"] > 1e-5]
    assert not bad, bad


@pytest.mark.ggml_program
def test_flash_attention_over_turbo_kv_equals_it_over_the_dequantized_values(measured) -> None:
    # what is left is the query's q8_0 rounding in the K dot products, which a q8_0 cache shares (1e-4 here)
    q8 = max(r["nmse"] for r in measured["fa"] if r["type"] == "q8_0")
    bad = [r for r in measured["fa"] if not r["nmse"] < min(1e-3, 3 * q8)]
    assert not bad, (q8, bad)


# ----------------------------------------------------------------------------------------------
# through the Python API
# ----------------------------------------------------------------------------------------------

PROMPTS = ["def main(argv):\n", "import os\nimport sys\n", "class Queue:\n    def __init__(self):"]


# the bundled trained pair with its heads widened 4x (32 / 64 -> 128 / 256; scale-pair's zero padding): a
# trained pair whose heads 128-blocks divide, in a second
WIDE = dataclasses.replace(ScaleConfig.small(), name="wide", head_dim=128, global_head_dim=256)


@pytest.fixture(scope="module")
def wide_paths(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pair = scale_pair(WIDE, types=("f16",), cache_dir=tmp_path_factory.mktemp("wide"), threads=2, progress=False)
    return pair.target["f16"], pair.centroid["f16"]


@pytest.fixture(scope="module")
def wide(wide_paths) -> Model:
    with Model(wide_paths[0], assistant=wide_paths[1]) as m:
        yield m


# (type_k, type_v, type_k_swa, type_v_swa): None gives the sliding-window layers the same types (the default)
@pytest.mark.parametrize("types", [("turbo3", "turbo3", None, None), ("q8_0", "turbo4", None, None),
                                   ("turbo4", "turbo2", "f16", "f16"), ("f16", "f16", "turbo3", "turbo3")],
                         ids=lambda t: "-".join(x or "default" for x in t))
def test_mtp_greedy_equals_plain_greedy_on_a_turbo_cache(wide, types) -> None:
    type_k, type_v, type_k_swa, type_v_swa = types
    with wide.create_context(n_ctx=512, type_k=type_k, type_v=type_v, type_k_swa=type_k_swa,
                             type_v_swa=type_v_swa) as ctx:
        for prompt in PROMPTS:
            plain = wide.generate(prompt, max_tokens=40, draft_n_max=0, context=ctx, temperature=0, cache_prompt=False)
            for n in (1, 3):
                spec = wide.generate(prompt, max_tokens=40, draft_n_max=n, context=ctx, temperature=0,
                                     cache_prompt=False)
                assert spec.stats.n_drafted > 0
                assert_same_tokens(plain.tokens, spec.tokens, f"{types} {prompt!r} n={n}: MTP vs plain greedy")


@pytest.mark.parametrize("types", [("turbo3", "turbo3"), ("q8_0", "q8_0"), ("q8_0", "turbo4")], ids="-".join)
def test_mtp_greedy_equals_plain_greedy_on_a_quantized_cache_past_512_cells(wide, types) -> None:
    # past 512 cells a decode's query rows take flash attention's split-KV path over the quantized cache
    # (patch 0120): a verify batch of 2..4 rows must round each row as a one-token decode does
    text = (Path(__file__).parent.parent / "mtp_bindings" / "generation" / "loop.py").read_text()
    prompt = wide.tokenize(text)[:600]
    with wide.create_context(n_ctx=1024, type_k=types[0], type_v=types[1]) as ctx:
        plain = wide.generate(prompt, max_tokens=32, draft_n_max=0, context=ctx, temperature=0, cache_prompt=False)
        spec = wide.generate(prompt, max_tokens=32, draft_n_max=3, context=ctx, temperature=0, cache_prompt=False)
        assert spec.stats.n_drafted > 0
        assert_same_tokens(plain.tokens, spec.tokens, f"{types}: MTP vs plain greedy past 512 cells")


def test_a_turbo_cache_stays_close_to_an_f16_cache(wide) -> None:
    prompt = list(range(5, 125))
    logits = {}
    for kind in ("f16", "turbo4", "turbo3"):
        with wide.create_context(n_ctx=256, type_k=kind, type_v=kind) as ctx:
            ctx.decode(prompt, pos=0)
            logits[kind] = ctx.get_logits().astype(np.float64)

    def kl(p_logits, q_logits):
        p = np.exp(p_logits - p_logits.max()); p /= p.sum()
        q = np.exp(q_logits - q_logits.max()); q /= q.sum()
        return float(np.sum(p * (np.log(p) - np.log(q))))

    kl4, kl3 = kl(logits["f16"], logits["turbo4"]), kl(logits["f16"], logits["turbo3"])
    assert 0 < kl4 < kl3 < 0.05, (kl4, kl3)


def _kv_bench():
    """bench/kv_types.py as a module (its reading of llama.cpp's KV cache lines is the tests' too)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kv_types", REPO / "bench" / "kv_types.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _cache_types(model: Model, **types) -> dict[str, tuple[str, str]]:
    """The (K, V) types llama.cpp gives the full-attention and the sliding-window caches of a new context."""
    with native_log() as lines, model.create_context(n_ctx=256, **types):
        pass
    return {half: (k, v) for half, (k, v, _) in _kv_bench().kv_caches(lines).items()}


def test_the_sliding_window_layers_take_the_cache_types_unless_given_their_own(wide_paths) -> None:
    with Model(wide_paths[0], verbose=True) as m:
        assert _cache_types(m, type_k="turbo3", type_v="q8_0") == {"full": ("turbo3", "q8_0"), "swa": ("turbo3", "q8_0")}
        assert _cache_types(m, type_k="turbo3", type_v="q8_0", type_k_swa="f16", type_v_swa="turbo4") == \
            {"full": ("turbo3", "q8_0"), "swa": ("f16", "turbo4")}
        assert _cache_types(m, type_k_swa="q8_0") == {"full": ("f16", "f16"), "swa": ("q8_0", "f16")}


def test_a_quantized_sliding_window_v_cache_turns_flash_attention_on_or_is_refused_without_it(wide_paths) -> None:
    with Model(wide_paths[0]) as m:
        with m.create_context(n_ctx=256, type_v_swa="q8_0") as ctx:
            assert ctx.params.resolved_flash_attn == "on"
        with pytest.raises(InvalidParameterError, match="quantized V cache needs flash_attn"):
            m.create_context(n_ctx=256, type_v_swa="q8_0", flash_attn="off")


def test_a_model_whose_heads_turbo_blocks_do_not_divide_is_refused(trained_paths) -> None:
    target, _ = trained_paths
    with Model(target) as m:
        # the sliding-window layers' heads are 32 wide, the full-attention layers' 64: each is checked with its type
        with pytest.raises(ContextError, match="turbo3 with block size 128 does not divide n_embd_head_k=32"):
            m.create_context(n_ctx=256, type_k="turbo3")
        with pytest.raises(ContextError, match="turbo3 with block size 128 does not divide n_embd_head_k=64"):
            m.create_context(n_ctx=256, type_k="turbo3", type_k_swa="f16")


KSHIFT_CHILD = r"""
import sys
import numpy as np
from mtp_bindings import Model
from mtp_bindings.native._native import lib

path, type_k, start, delta = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tokens = list(range(5, 65))

def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())

with Model(path) as m:
    with m.create_context(n_ctx=256, type_k=type_k, type_v="f16", flash_attn="on") as ctx:
        ctx.decode(tokens, pos=start)
        lib.llama_memory_seq_add(ctx._mem_ptr(), 0, start, -1, delta)  # the next decode shifts K by delta
        ctx.decode([7], pos=start + delta + len(tokens))
        shifted = ctx.get_logits().copy()
        ctx.clear()
        ctx.decode(tokens + [7], pos=start + delta)
        fresh = ctx.get_logits().copy()
    with m.create_context(n_ctx=256, type_k="f16", type_v="f16", flash_attn="on") as ctx:
        ctx.decode(tokens + [7], pos=start + delta)
        reference = ctx.get_logits().copy()
print(rel(shifted, fresh), rel(fresh, reference))
"""


@pytest.mark.parametrize("shift", [(0, 20), (20, -20)], ids=["forward", "back"])
@pytest.mark.parametrize("case", [("bundled", "f16"), ("bundled", "q8_0"), ("bundled", "q4_0"), ("wide", "turbo3"),
                                  ("wide", "q8_0")], ids=lambda c: "-".join(c))
def test_a_k_shift_of_a_k_cache_matches_decoding_at_the_new_positions(case, shift, wide_paths) -> None:
    which, type_k = case
    path = BUNDLED / "trained-target.gguf" if which == "bundled" else wide_paths[0]
    res = subprocess.run([sys.executable, "-c", KSHIFT_CHILD, str(path), type_k, *map(str, shift)],
                         capture_output=True, text=True,
                         timeout=120, cwd=REPO / "tests")  # the installed package, not the checkout's sources
    assert res.returncode == 0, f"K-shift child exited {res.returncode}: {res.stderr[-1500:]}"
    shift_err, quant_err = map(float, res.stdout.split()[-2:])
    # the shifted K was dequantized, rotated by RoPE and quantized again: a second rounding of the size of
    # the first (what the type costs against f16 K at the same positions), not equal; a shift that rotated
    # wrongly (RoPE by another delta, the Hadamard not undone) is off by the logits' own size
    assert shift_err < 0.01 + 3 * quant_err, (shift_err, quant_err)


def test_the_kv_types_bench_reports_every_setting_with_f16_as_its_reference(tmp_path) -> None:
    bench = _kv_bench()
    out = tmp_path / "kv.json"
    assert bench.main(["--quick", "--lengths", "256", "--text-tokens", "64", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [name for name, *_ in bench.QUALITY] == list(res["quality"])
    assert res["quality"]["f16"]["kl_mean"] == 0 and res["quality"]["f16"]["argmax_agree"] == 1
    assert all(r["kl_mean"] > 0 for name, r in res["quality"].items() if name != "f16")
    speed = res["speed"]
    assert [f"{t}@256" for t in bench.SPEED] == list(speed)
    # both caches shrink with the type's bits (the window takes the type too)
    for half in ("full", "swa"):
        mib = [speed[f"{t}@256"]["cache_mib"][half] for t in bench.SPEED]
        assert mib == sorted(mib, reverse=True) and mib[-1] < 0.25 * mib[0], (half, mib)
    assert (tmp_path / "kv.md").read_text().count("\n| ") >= len(bench.QUALITY) + len(bench.SPEED)
