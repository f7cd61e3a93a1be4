"""Random-weight Gemma 4 models at real widths for the benchmarks: the E2B-width target (also
``bench/decode_scaling.py``'s, and ``tests/test_matmul_few_columns.py``'s at small widths), its
quantized copies, and the dense / centroid-head assistants of the cost part."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .config import BUNDLED, BenchConfig, log


@dataclass(frozen=True)
class Dims:
    """Widths of a Gemma 4 target (defaults: E2B's text decoder, 4 of its layers)."""

    hidden: int = 1536
    ffn: int = 6144
    heads: int = 8
    kv_heads: int = 1
    head_dim: int = 256          # sliding-window layers
    global_head_dim: int = 512   # full-attention layers
    window: int = 512
    vocab: int = 262144
    layers: tuple[bool, ...] = (True, True, True, False)  # sliding-window pattern: [S, S, S, F]


E2B = Dims()
TARGET_SEED = 8
# llama_ftype: MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_K_S (pure), MOSTLY_Q4_K_M (LM head and part of ffn_down/attn_v
# in Q6_K, what most published GGUFs are)
FTYPES = {"f16": 1, "q8_0": 7, "q4_K": 14, "q4_K_M": 15}


@dataclass(frozen=True)
class Shape:
    """Widths of the random target + assistant pair (``e2b``: the real E2B text widths)."""

    name: str
    vocab: int
    hidden: int          # target backbone width
    ffn: int
    n_head: int
    n_head_kv: int
    hd_swa: int
    hd_full: int
    window: int
    layers: tuple[bool, ...]
    a_hidden: int        # assistant width
    a_ffn: int
    a_n_head: int
    a_layers: tuple[bool, ...]
    n_centroids: int
    top_k: int

    @property
    def target(self) -> Dims:
        return Dims(self.hidden, self.ffn, self.n_head, self.n_head_kv, self.hd_swa, self.hd_full, self.window,
                    self.vocab, self.layers)


SHAPES = {
    # Gemma 4 E2B: the target above; assistant 256 wide with 4 layers [S, S, S, F]; head_dim 256
    # (sliding) / 512 (global), one KV head, vocab 262144, centroid head of 2048 centroids, top-32.
    # The assistant's FFN width (2048) and query heads (4) are our assumption; the per-step cost is
    # dominated by the LM head (262144 x 256) either way.
    "e2b": Shape("e2b", E2B.vocab, E2B.hidden, E2B.ffn, E2B.heads, E2B.kv_heads, E2B.head_dim, E2B.global_head_dim,
                 E2B.window, E2B.layers, 256, 2048, 4, (True, True, True, False), 2048, 32),
    # seconds-long smoke version
    "tiny": Shape("tiny", 4096, 128, 256, 2, 1, 32, 64, 64, (True, True, True, False),
                  64, 128, 2, (True, True, True, False), 64, 4),
}


def tokenizer_fields(gguf: Any, src: Path, vocab: int | None) -> list[tuple[str, Any, Any, Any]]:
    """``tokenizer.*`` key/values of ``src``, the vocabulary padded with unused tokens to ``vocab``."""
    reader = gguf.GGUFReader(src)
    out = []
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = fld.contents()
        vtype = fld.types[0]
        sub = fld.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if vocab is not None and key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            n_pad = vocab - len(value)
            if key == "tokenizer.ggml.tokens":
                value = list(value) + [f"<unused{i}>" for i in range(n_pad)]
            elif key == "tokenizer.ggml.scores":
                value = list(value) + [0.0] * n_pad
            else:
                value = list(value) + [int(gguf.TokenType.UNUSED)] * n_pad
        out.append((key, value, vtype, sub))
    return out


def random_matrix(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Weights ~ N(0, 1/cols) as f16, generated in blocks of ~16M values (memory stays small)."""
    out = np.empty(shape, dtype=np.float16)
    std = 1.0 / math.sqrt(shape[1])
    step = max(1, (1 << 24) // shape[1])
    for r in range(0, shape[0], step):
        out[r:r + step] = rng.standard_normal((min(step, shape[0] - r), shape[1]), dtype=np.float32) * std
    return out


def _write_gguf(path: Path, arch: str, kv: list[tuple[str, str, Any]], tok: list[tuple[str, Any, Any, Any]],
                tensors: list[tuple[str, tuple[int, ...], Any, Callable[[], np.ndarray]]]) -> None:
    """Write a GGUF tensor by tensor (memory stays at one tensor). ``tensors``: (name, numpy shape,
    numpy dtype, make)."""
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(tmp, arch)
    for kind, key, value in kv:
        getattr(w, f"add_{kind}")(key, value)
    for key, value, vtype, sub in tok:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, shape, dtype, _ in tensors:
        raw_dtype = gguf.GGMLQuantizationType.I32 if np.dtype(dtype) == np.int32 else None
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize,
                          raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, _, _, make in tensors:
        w.write_tensor_data(make())
    w.close()
    tmp.rename(path)


def _common_kv(arch: str, hidden: int, ffn: int, n_head: int, n_head_kv: int, hd_swa: int, hd_full: int,
               window: int, layers: Sequence[bool]) -> list[tuple[str, str, Any]]:
    return [
        ("uint32", f"{arch}.block_count", len(layers)), ("uint32", f"{arch}.context_length", 4096),
        ("uint32", f"{arch}.embedding_length", hidden), ("uint32", f"{arch}.feed_forward_length", ffn),
        ("uint32", f"{arch}.attention.head_count", n_head), ("uint32", f"{arch}.attention.head_count_kv", n_head_kv),
        ("float32", f"{arch}.rope.freq_base", 1_000_000.0), ("float32", f"{arch}.rope.freq_base_swa", 10_000.0),
        ("float32", f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        ("uint32", f"{arch}.attention.key_length", hd_full), ("uint32", f"{arch}.attention.value_length", hd_full),
        ("uint32", f"{arch}.attention.key_length_swa", hd_swa), ("uint32", f"{arch}.attention.value_length_swa", hd_swa),
        ("uint32", "general.file_type", 1), ("uint32", f"{arch}.attention.sliding_window", window),
        ("uint32", f"{arch}.embedding_length_per_layer_input", 0),
        ("array", f"{arch}.attention.sliding_window_pattern", list(layers)),
        ("uint32", f"{arch}.rope.dimension_count", hd_full), ("uint32", f"{arch}.rope.dimension_count_swa", hd_swa),
        ("uint32", "general.quantization_version", 2),
    ]


def _layer_tensors(rng: np.random.Generator, i: int, hidden: int, ffn: int, n_head: int, n_head_kv: int, hd: int,
                   with_kv: bool) -> list[tuple[str, tuple[int, ...], Any, Callable[[], np.ndarray]]]:
    def ones(n: int) -> Callable[[], np.ndarray]:
        return lambda: np.ones(n, dtype=np.float32)

    def mat(rows: int, cols: int) -> Callable[[], np.ndarray]:
        return lambda: random_matrix(rng, (rows, cols))

    f16, f32 = np.float16, np.float32
    t = [
        (f"blk.{i}.attn_norm.weight", (hidden,), f32, ones(hidden)),
        (f"blk.{i}.layer_output_scale.weight", (1,), f32, ones(1)),
        (f"blk.{i}.ffn_down.weight", (hidden, ffn), f16, mat(hidden, ffn)),
        (f"blk.{i}.ffn_gate.weight", (ffn, hidden), f16, mat(ffn, hidden)),
        (f"blk.{i}.ffn_up.weight", (ffn, hidden), f16, mat(ffn, hidden)),
        (f"blk.{i}.post_attention_norm.weight", (hidden,), f32, ones(hidden)),
        (f"blk.{i}.post_ffw_norm.weight", (hidden,), f32, ones(hidden)),
        (f"blk.{i}.ffn_norm.weight", (hidden,), f32, ones(hidden)),
    ]
    # this order fixes which random draws each matrix gets: keep it (cached files stay comparable)
    if with_kv:
        t += [(f"blk.{i}.attn_k_norm.weight", (hd,), f32, ones(hd)),
              (f"blk.{i}.attn_k.weight", (n_head_kv * hd, hidden), f16, mat(n_head_kv * hd, hidden))]
    t += [
        (f"blk.{i}.attn_output.weight", (hidden, n_head * hd), f16, mat(hidden, n_head * hd)),
        (f"blk.{i}.attn_q_norm.weight", (hd,), f32, ones(hd)),
        (f"blk.{i}.attn_q.weight", (n_head * hd, hidden), f16, mat(n_head * hd, hidden)),
    ]
    if with_kv:
        t.append((f"blk.{i}.attn_v.weight", (n_head_kv * hd, hidden), f16, mat(n_head_kv * hd, hidden)))
    return t


def _rope_freqs(hd_full: int) -> Callable[[], np.ndarray]:
    n_rot = hd_full // 8  # proportional rope, partial_rotary_factor 0.25
    return lambda: np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32)


def write_f16_target(path: Path, dims: Dims = E2B, seed: int = TARGET_SEED, tokenizer: Path | None = None,
                     name: str | None = None) -> None:
    """A random Gemma 4 target of ``dims`` (f16 matrices, tied embeddings), tensor by tensor (memory
    stays at one tensor). ``tokenizer``: a GGUF whose vocabulary is used, padded with unused tokens
    to ``dims.vocab`` (default: the bundled trained target's)."""
    arch = "gemma4"
    rng = np.random.default_rng(seed)
    kv: list[tuple[str, str, Any]] = [("string", "general.name", name)] if name else []
    kv += _common_kv(arch, dims.hidden, dims.ffn, dims.heads, dims.kv_heads, dims.head_dim, dims.global_head_dim,
                     dims.window, dims.layers)
    kv += [("float32", f"{arch}.final_logit_softcapping", 30.0), ("uint32", f"{arch}.attention.shared_kv_layers", 0)]
    tensors: list[Any] = [("rope_freqs.weight", (dims.global_head_dim // 2,), np.float32, _rope_freqs(dims.global_head_dim)),
                          ("token_embd.weight", (dims.vocab, dims.hidden), np.float16,
                           lambda: random_matrix(rng, (dims.vocab, dims.hidden)))]
    for i, swa in enumerate(dims.layers):
        tensors += _layer_tensors(rng, i, dims.hidden, dims.ffn, dims.heads, dims.kv_heads,
                                  dims.head_dim if swa else dims.global_head_dim, with_kv=True)
    tensors.append(("output_norm.weight", (dims.hidden,), np.float32, lambda: np.ones(dims.hidden, dtype=np.float32)))
    _write_gguf(path, arch, kv, tokenizer_fields(gguf, tokenizer or BUNDLED / "trained-target.gguf", dims.vocab),
                tensors)


def quantize(src: Path, dst: Path, ftype: int, threads: int) -> None:
    """``llama_model_quantize`` ``src`` to ``dst`` as ``ftype`` (:data:`FTYPES`): pure, every matrix
    (token_embd included) in the one type, except Q4_K_M, a mix by definition."""
    from ..low_level import ensure_initialised, ffi, lib

    ensure_initialised()
    params = lib.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = ftype
    params.pure = ftype != FTYPES["q4_K_M"]
    rc = lib.llama_model_quantize(str(src).encode(), str(dst).encode(), ffi.new("llama_model_quantize_params *", params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}) failed with {rc}")


def write_assistant(path: Path, shape: Shape, target: Path, centroid: bool, seed: int = 9) -> None:
    """A random Gemma 4 assistant of ``shape`` for ``target`` (its tokenizer copied), dense LM
    head or centroid head (``masked_embd_centroids`` + an I32 ``masked_embd_ordering``)."""
    arch = "gemma4-assistant"
    rng = np.random.default_rng(seed)
    h, bb = shape.a_hidden, shape.hidden
    kv = _common_kv(arch, h, shape.a_ffn, shape.a_n_head, shape.n_head_kv, shape.hd_swa, shape.hd_full,
                    shape.window, shape.a_layers)
    kv += [("uint32", f"{arch}.attention.shared_kv_layers", len(shape.a_layers)),
           ("uint32", f"{arch}.embedding_length_out", bb), ("uint32", f"{arch}.nextn_predict_layers", len(shape.a_layers))]
    if centroid:
        kv += [("uint32", f"{arch}.num_centroids", shape.n_centroids),
               ("uint32", f"{arch}.centroid_intermediate_top_k", shape.top_k)]
    tensors: list[Any] = [("rope_freqs.weight", (shape.hd_full // 2,), np.float32, _rope_freqs(shape.hd_full)),
                          ("token_embd.weight", (shape.vocab, h), np.float16, lambda: random_matrix(rng, (shape.vocab, h)))]
    for i, swa in enumerate(shape.a_layers):
        tensors += _layer_tensors(rng, i, h, shape.a_ffn, shape.a_n_head, shape.n_head_kv,
                                  shape.hd_swa if swa else shape.hd_full, with_kv=False)
    tensors += [("output_norm.weight", (h,), np.float32, lambda: np.ones(h, dtype=np.float32)),
                ("nextn.post_projection.weight", (bb, h), np.float16, lambda: random_matrix(rng, (bb, h))),
                ("nextn.pre_projection.weight", (h, 2 * bb), np.float16, lambda: random_matrix(rng, (h, 2 * bb)))]
    if centroid:
        tensors += [("masked_embd_centroids.weight", (shape.n_centroids, h), np.float16,
                     lambda: random_matrix(rng, (shape.n_centroids, h))),
                    ("masked_embd_ordering", (shape.vocab,), np.int32,
                     lambda: rng.permutation(shape.vocab).astype(np.int32))]
    _write_gguf(path, arch, kv, tokenizer_fields(gguf, target, None), tensors)


def build_cost_models(cfg: BenchConfig) -> dict[str, Path]:
    """Target + dense assistant + centroid assistant of ``cfg.cost_shape``, cached in ``cfg.cost_cache``."""
    shape = SHAPES[cfg.cost_shape]
    cache = cfg.cost_cache
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{shape.name}-target-f16.gguf"
    if not target.is_file():
        log(f"cost: writing {target}")
        write_f16_target(target, shape.target)
    paths = {"target": target}
    for kind in ("dense", "centroid"):
        p = cache / f"{shape.name}-assistant-{kind}-f16.gguf"
        if not p.is_file():
            log(f"cost: writing {p}")
            write_assistant(p, shape, target, centroid=(kind == "centroid"))
        paths[kind] = p
    return paths
